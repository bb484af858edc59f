//! The kernel families of a product (`Variant`), which one a device runs for each weight
//! type (its options, `WGLLM_MUL_MAT`, the tuning file, or the default per kind of
//! device), and what it resolves to for a given product's shape and weight memory.

use super::*;

/// Kernel variants of `mul_mat`; all compute the same product and are tested against
/// [`reference`]. Which one runs is chosen per device by [`variant`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `mul_mat.wgsl`: one invocation per row, the decoders' u32 loads from storage.
    Row,
    /// `mul_mat_win.wgsl` + `mul_mat_xs.wgsl`: one invocation per row, the row
    /// fetched in windows of vec4 loads into a private array.
    Win,
    /// `mul_mat_win.wgsl` + `mul_mat_xu.wgsl`: as `Win`, activations copied into a
    /// uniform buffer first (`mul_mat_xcopy`), a few tokens at a time (fastest on
    /// lavapipe). Rows longer than the uniform buffer holds run as `Win`. Types stored
    /// planar ([`crate::gpu::layout`]) have no runs of whole blocks and run as `Row`.
    WinU,
    /// `mul_mat_wg.wgsl`: one workgroup per row, coalesced block reads, reduction in
    /// workgroup memory (portable). Batches of [`MM_MIN`] tokens or more run the tiled
    /// product `mul_mat_mm.wgsl` where the device allows it ([`mm_fits`]).
    Wg,
    /// `mul_mat_sg.wgsl`: as `Wg`, reduced with `subgroupAdd` (needs subgroups).
    Sg,
    /// `mul_mat_ks.wgsl`: one subgroup per workgroup owning several rows, the row's
    /// chunks split across its lanes, each activation chunk loaded once for all rows
    /// (needs subgroups of a fixed size).
    Ks,
    /// `Ks` with the activations copied into a uniform buffer first, as `WinU`. Large
    /// products of the last token alone (output heads) run it in place of `Ks`
    /// ([`for_product`]).
    KsU,
    /// `mul_mat_mr.wgsl`: four rows per workgroup, coalesced block reads, each
    /// activation chunk loaded once for the four, reduced with `subgroupAdd` (needs
    /// subgroups; for GPUs). Batches of [`MM_MIN`] tokens or more run the tiled
    /// product `mul_mat_mm.wgsl` where the device allows it ([`mm_fits`]).
    Mr,
}

impl Variant {
    pub const ALL: [Variant; 8] = [
        Variant::Row,
        Variant::Win,
        Variant::WinU,
        Variant::Wg,
        Variant::Sg,
        Variant::Ks,
        Variant::KsU,
        Variant::Mr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Row => "row",
            Variant::Win => "win",
            Variant::WinU => "winu",
            Variant::Wg => "wg",
            Variant::Sg => "sg",
            Variant::Ks => "ks",
            Variant::KsU => "ksu",
            Variant::Mr => "mr",
        }
    }

    pub fn parse(s: &str) -> Option<Variant> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Name of the kernel in the shader table.
    pub fn shader(self) -> &'static str {
        match self {
            Variant::Row => "mul_mat",
            Variant::Win => "mul_mat_win",
            Variant::WinU => "mul_mat_winu",
            Variant::Wg => "mul_mat_wg",
            Variant::Sg => "mul_mat_sg",
            Variant::Ks => "mul_mat_ks",
            Variant::KsU => "mul_mat_ksu",
            Variant::Mr => "mul_mat_mr",
        }
    }

    /// Whether `ctx` can run this variant.
    pub fn available(self, ctx: &GpuContext) -> bool {
        match self {
            Variant::Sg | Variant::Mr => ctx.has_subgroups,
            // One workgroup must be one whole subgroup, so the size must be fixed.
            Variant::Ks | Variant::KsU => ctx.fixed_subgroup().is_some(),
            _ => true,
        }
    }
}

/// Environment variable that overrides the per-device choice (a [`Variant::name`]).
pub const VARIANT_ENV: &str = "WGLLM_MUL_MAT";

/// The variant `mul_mat::gpu` uses for weights of `ty` on `ctx`: the context's
/// (`DeviceOptions::mul_mat`) if set, else `WGLLM_MUL_MAT` if set, else the one measured
/// fastest on this adapter ([`tuned_variant`]), else [`default_variant`].
pub fn variant(ctx: &GpuContext, ty: GgmlType) -> Result<Variant> {
    let (source, want) = match (&ctx.forced_mul_mat, std::env::var(VARIANT_ENV)) {
        (Some(v), _) => ("the device options' mul_mat", v.clone()),
        (None, Ok(v)) => (VARIANT_ENV, v),
        (None, Err(_)) => return Ok(tuned_variant(ctx, ty).unwrap_or_else(|| default_variant(ctx))),
    };
    let v = Variant::parse(&want).ok_or_else(|| {
        let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
        Error::invalid(format!(
            "{source}={want:?}: expected one of {}",
            names.join(", ")
        ))
    })?;
    if !v.available(ctx) {
        return Err(Error::Unsupported(format!(
            "{source}={want}: {} has no subgroup support",
            ctx.info.name
        )));
    }
    Ok(v)
}

/// The variant the tuning file ([`crate::gpu::tuning`]) recorded for `ty` on this
/// adapter, if this build knows it and the device runs it.
pub fn tuned_variant(ctx: &GpuContext, ty: GgmlType) -> Option<Variant> {
    let name = ctx.tuned.mul_mat.get(ty.name())?;
    Variant::parse(name).filter(|v| v.available(ctx))
}

/// The measured best per kind of device (docs/perf.md): CPU-hosted drivers run one
/// SIMD lane per invocation and pay per load, so one subgroup sharing each activation
/// load across many rows wins there (the windowed per-row walk where subgroups are
/// missing); real GPUs want coalesced reads, several rows per workgroup and a subgroup
/// reduction (`Mr`: on an H200, the fastest of every variant for all eight types by
/// `wgllm-bench kernels --save`, 1.7-2.6x `Wg` at 8B layer shapes), or a workgroup
/// reduction without subgroups.
pub fn default_variant(ctx: &GpuContext) -> Variant {
    if ctx.info.device_type == wgpu::DeviceType::Cpu {
        if Variant::Ks.available(ctx) {
            Variant::Ks
        } else {
            Variant::WinU
        }
    } else if Variant::Mr.available(ctx) {
        Variant::Mr
    } else {
        Variant::Wg
    }
}

/// Weights from which a product of the last token alone runs `KsU` instead of `Ks`.
const KSU_MIN_WEIGHTS: u64 = 1 << 22;

/// The variant a product runs: `v`, except that a `Ks` product of the last token alone
/// over at least [`KSU_MIN_WEIGHTS`] weights (a model's output head) runs as `KsU`,
/// its activations copied into a uniform buffer first. Measured on lavapipe
/// (`wgllm-bench kernels --variant ks,ksu --compare`, batch 1, docs/perf.md): 1.2-1.55x
/// from 576x8192 up (Gemma's 640x262144 head 1.32-1.45x, 4096-column rows 1.28-1.55x),
/// 1.03-1.05x at 640x4096, and 0.76-0.84x on rows of 1536 or fewer, where the copy's
/// dispatch costs more than the kernel gains.
pub(super) fn for_product(
    ctx: &GpuContext,
    v: Variant,
    (n_rows, n_cols): (u64, u64),
    cols: Columns,
) -> Variant {
    let big = n_rows.saturating_mul(n_cols) >= KSU_MIN_WEIGHTS;
    let uniform_fits = tokens_per_xu(ctx, n_cols) > 0;
    if v == Variant::Ks && cols == Columns::Last && big && uniform_fits {
        Variant::KsU
    } else {
        v
    }
}

/// Whether a `Ks` product of every token (`v`, as resolved) runs its single-token steps
/// on `KsU`'s kernels with the activations bound where they lie, as a uniform
/// ([`reads_uniform`]): no copy's dispatch, and `ksu`'s kernel alone measured
/// 1.03-1.32x faster than `ks` at every layer shape of the two test models (docs/perf.md).
pub(super) fn single_tokens_uniform(
    ctx: &GpuContext,
    v: Variant,
    cols: Columns,
    n_cols: u64,
) -> bool {
    v == Variant::Ks
        && cols == Columns::All
        && binds_x_view(ctx)
        && tokens_per_xu(ctx, n_cols) > 0
        && !ctx.chains()
}

/// Whether the device binds uniforms of [`X_UNIFORM_BYTES`], the size `KsU` declares.
pub fn binds_x_view(ctx: &GpuContext) -> bool {
    ctx.limits.max_uniform_buffer_binding_size >= X_UNIFORM_BYTES
}

/// Whether `x` can be bound as the uniform activations of `KsU` (its first
/// [`X_UNIFORM_BYTES`]): the models' activation buffers ([`crate::gpu::upload::activations`]).
pub(crate) fn reads_uniform(x: &wgpu::Buffer) -> bool {
    x.usage().contains(wgpu::BufferUsages::UNIFORM) && x.size() >= X_UNIFORM_BYTES
}

/// Whether `v` is of the `Ks` family, whose single tokens run `mul_mat_ks1`.
pub(super) fn ks_family(v: Variant) -> bool {
    matches!(v, Variant::Ks | Variant::KsU)
}

/// The variant that actually runs `v` for rows of `n_cols` elements of type `ty` held
/// in `memory`.
pub(super) fn resolve(
    ctx: &GpuContext,
    v: Variant,
    ty: GgmlType,
    n_cols: u64,
    memory: WeightMemory,
) -> Result<Variant> {
    if !v.available(ctx) {
        return Err(Error::Unsupported(format!(
            "mul_mat variant {} on {}",
            v.name(),
            ctx.info.name
        )));
    }
    Ok(match v {
        // Windows are runs of whole blocks, which planar rows (gpu::layout) do not have.
        Variant::Win | Variant::WinU if crate::gpu::layout::planes(ty).is_some() => Variant::Row,
        // The windowed walks read a storage buffer of their own.
        Variant::Win | Variant::WinU if memory == WeightMemory::Texture => Variant::Row,
        // Rows too long for the uniform buffer: the same walk with storage activations.
        Variant::WinU if tokens_per_xu(ctx, n_cols) == 0 => Variant::Win,
        Variant::KsU if tokens_per_xu(ctx, n_cols) == 0 => Variant::Ks,
        v => v,
    })
}
