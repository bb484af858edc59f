//! Products that carry the op around them: gate and up with their GLU store, the norm
//! before a product folded into its kernels, and a layer's Q/K/V product that goes on to
//! rotate its heads and append K and V to the cache.

use super::*;

/// The gated activation that a fused gate/up product ([`gpu_gate_up`]) applies itself:
/// act(gate) * up into `out`, [n_ff, n_tokens].
#[derive(Clone, Copy)]
pub struct Glu<'a> {
    pub out: &'a wgpu::Buffer,
    pub act: Activation,
}

/// The rows of a fused gate/up product `w` (n_ff of gate, then n_ff of up) of `x`, or
/// with `norm`, of the norm it folds in ([`gpu_normed`]), into `gate` and `up`; except
/// that single tokens store act(gate) * up into `glu.out` themselves where the kernel
/// running them has the GLU store (`mul_mat_ks1`, `mul_mat_mr`). Returns the dispatches and whether
/// single tokens do: a `glu` dispatch follows for the steps they do not.
pub fn gpu_gate_up(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    (x, norm): (&wgpu::Buffer, Option<Norm<'_>>),
    [gate, up]: [&wgpu::Buffer; 2],
    glu: Glu<'_>,
) -> Result<(Vec<Dispatch>, bool)> {
    let n_ff = (w.n_rows() / 2) as u32;
    let out = fused_outputs(ctx, w, &[gate, up], &[n_ff, n_ff])?;
    let glu_out = Outputs::glu(ctx, glu.out, n_ff, glu.act);
    let io = (&out, Some(&glu_out));
    match norm {
        Some(n) => {
            check_norm(ctx, w, n)?;
            gpu_out(ctx, Variant::Ks, step, w, n.x, io, Columns::All, norm)
        }
        None => gpu_out(ctx, variant(ctx, w.ty)?, step, w, x, io, Columns::All, None),
    }
}

/// The norm a product folds into its kernels (`mul_mat_ks1n`): instead of reading
/// `rms_norm(x) * w` from a buffer a norm dispatch wrote, the kernel reads the residual
/// stream `x` and normalises it itself, so the step needs no norm dispatch before the
/// product (on CPU-hosted drivers each dispatch costs tens of microseconds whatever its
/// size).
#[derive(Clone, Copy)]
pub struct Norm<'a> {
    /// The residual stream, [n_cols, n_tokens].
    pub x: &'a wgpu::Buffer,
    /// The norm's weight, [n_cols] f32.
    pub w: &'a wgpu::Buffer,
    pub eps: f32,
}

/// Whether products of rows of `n_cols` elements of `ty` held in `memory` can fold the
/// norm before them into their kernels ([`gpu_normed`]): where they run `mul_mat_ks1`
/// in the `Ks` variant, the device binds the norm's weight as a uniform
/// ([`VECTOR_UNIFORM_BYTES`]), and there are few enough rows. Every workgroup of 64
/// rows computes the norm again, which a separate norm's dispatch does once: Gemma 3's
/// output head (262144 rows) took 38-39 ms folded against 27 ms after a norm of its own
/// on lavapipe (docs/perf.md).
pub fn folds_norm(
    ctx: &GpuContext,
    ty: GgmlType,
    (n_rows, n_cols): (u64, u64),
    memory: WeightMemory,
) -> bool {
    let v = variant(ctx, ty).and_then(|v| resolve(ctx, v, ty, n_cols, memory));
    ctx.fused_outputs()
        && ctx.limits.max_uniform_buffer_binding_size >= VECTOR_UNIFORM_BYTES
        && n_cols * 4 <= VECTOR_UNIFORM_BYTES
        && n_rows <= FOLD_MAX_ROWS
        && matches!(v, Ok(Variant::Ks))
        && ks1_batches_fit(ctx, Variant::Ks, ty, n_cols)
}

/// The most rows of a product that folds the norm before it ([`folds_norm`]).
pub const FOLD_MAX_ROWS: u64 = 16384;

/// ys[i] = rows `rows[i]` of W xn (one output: `ys = [y]`, `rows = [n_rows]`), where
/// xn = rms_norm(norm.x) * norm.w is computed by the kernels themselves ([`Norm`]; only
/// where [`folds_norm`]).
pub fn gpu_normed(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    norm: Norm<'_>,
    ys: &[&wgpu::Buffer],
    rows: &[u32],
    cols: Columns,
) -> Result<Vec<Dispatch>> {
    check_norm(ctx, w, norm)?;
    let out = match ys {
        [y] => Outputs::plain(ctx, y, w.n_rows(), Store::Write),
        _ => Outputs::fused(ctx, ys, rows)?,
    };
    Ok(gpu_out(
        ctx,
        Variant::Ks,
        step,
        w,
        norm.x,
        (&out, None),
        cols,
        Some(norm),
    )?
    .0)
}

/// Whether a layer's Q/K/V product `w` runs as [`gpu_qkv_rope`] on `ctx`, with its
/// keys and values joining the cache as `append` says: it folds the norm before it
/// ([`folds_norm`]), lies in one part, its heads are whole texels of eight, and the
/// device binds the RoPE's buffers and textures beside the product's.
pub fn fuses_rope(ctx: &GpuContext, w: &GpuTensor, append: &CacheAppend<'_>) -> bool {
    let (hd, n_rot) = (append.rope.head_dim, append.rope.n_rot);
    // The product's weights (two views), x, its three outputs, the two caches.
    let (buffers, textures) = match w.memory {
        WeightMemory::Buffer => (8, 0),
        WeightMemory::Texture => (6, 2),
    };
    let textures = textures + 2 * append.tex.is_some() as u32;
    let l = &ctx.limits;
    folds_norm(ctx, w.ty, (w.n_rows(), w.n_cols()), w.memory)
        && w.parts.len() == 1
        && hd > 0
        && hd % 8 == 0
        && n_rot % 2 == 0
        && n_rot <= hd
        && l.max_storage_buffers_per_shader_stage >= buffers
        && l.max_storage_textures_per_shader_stage >= textures
        // step, params, the norm's weight, the RoPE's parameters, the heads' norms
        && l.max_uniform_buffers_per_shader_stage >= 6
        && append.check(ctx).is_ok()
}

/// A layer's Q/K/V product `w` of the norm it folds in ([`gpu_normed`]) into `ys` (Q, K,
/// V), whose single tokens go on, inside the product, to rotate Q in place and append
/// K and V to the cache as `append` says (`mul_mat_ks1nr`, common/ks1_rope.wgsl): the
/// step then runs no `rope_store`. `rows` are Q's, K's and V's rows; or Q's and K's
/// where V is a product of its own, which must have run into `ys[2]` before this one.
/// Returns the dispatches and whether single tokens append: a `rope_store` (batches
/// only, if they do) follows.
pub fn gpu_qkv_rope(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    norm: Norm<'_>,
    (ys, rows): ([&wgpu::Buffer; 3], &[u32]),
    append: &CacheAppend<'_>,
) -> Result<(Vec<Dispatch>, bool)> {
    check_norm(ctx, w, norm)?;
    if !fuses_rope(ctx, w, append) {
        return Err(Error::Unsupported(format!(
            "{}: RoPE and the cache append inside the product on {}",
            w.name, ctx.info.name
        )));
    }
    let (hd, kv_dim) = (append.rope.head_dim, append.dims.0);
    let q_rows = hd * append.rope.n_heads;
    let shaped = match *rows {
        [q, k, v] => q == q_rows && k == kv_dim && v == kv_dim,
        [q, k] => q == q_rows && k == kv_dim,
        _ => false,
    };
    if !shaped {
        return Err(Error::invalid(format!(
            "{}: rows {rows:?} are not {} heads of Q and {kv_dim} of K (and of V)",
            w.name, append.rope.n_heads
        )));
    }
    let out = fused_outputs(ctx, w, &ys[..rows.len()], rows)?;
    let one = Outputs {
        // With V apart, the third output is where its product left it.
        ys,
        rope: Some(RopeOut::new(ctx, append, norm, rows.len() == 2)),
        ..fused_outputs(ctx, w, &ys[..rows.len()], rows)?
    };
    let io = (&out, Some(&one));
    gpu_out(
        ctx,
        Variant::Ks,
        step,
        w,
        norm.x,
        io,
        Columns::All,
        Some(norm),
    )
}

/// Compile (or find) the single-token build of a Q/K/V product of `shape` (its type,
/// rows and row length) that ends with RoPE and the cache append ([`gpu_qkv_rope`]),
/// with or without the heads' norms and the kept textures' writes, as recording a model
/// whose activations are its own buffers (`gpu::upload::activations`) will ask for it:
/// so that it can be built on another thread while the weights upload.
pub fn warm_rope(
    ctx: &GpuContext,
    (ty, n_rows, n_cols): (GgmlType, u64, u64),
    (head_norms, tex): (bool, bool),
) -> Result<()> {
    let memory = ctx.matrix_memory(ty);
    let v = resolve(ctx, variant(ctx, ty)?, ty, n_cols, memory)?;
    let v = for_product(ctx, v, (n_rows, n_cols), Columns::All);
    let direct = single_tokens_uniform(ctx, v, Columns::All, n_cols) && binds_x_view(ctx);
    let v = if direct { Variant::KsU } else { v };
    let rope = RopeOut::kernel_build(ctx, n_cols, RopeBuild { head_norms, tex });
    kernel_pipeline(ctx, ty, v, memory, (Build::Ks1(rope), NOW)).map(drop)
}

/// What `mul_mat_ks1nr` binds past the product's own bindings (common/ks1_rope.wgsl).
pub(super) struct RopeOut<'a> {
    params: wgpu::Buffer,
    caches: [&'a wgpu::Buffer; 2],
    /// The heads' norms' weights, or where there are none the folded norm's (bound,
    /// unread).
    norms: [&'a wgpu::Buffer; 2],
    tex: Option<CacheViews<'a>>,
    head_dim: u32,
    build: RopeBuild,
}

impl<'a> RopeOut<'a> {
    fn new(ctx: &GpuContext, a: &CacheAppend<'a>, norm: Norm<'a>, v_apart: bool) -> RopeOut<'a> {
        RopeOut {
            params: crate::ops::uniform(ctx, "mul_mat_ks1nr rope", &a.params(v_apart)),
            caches: a.caches,
            norms: a.norms.map_or([norm.w, norm.w], |n| [n.q, n.k]),
            tex: a.tex,
            head_dim: a.rope.head_dim,
            build: RopeBuild {
                head_norms: a.norms.is_some(),
                tex: a.tex.is_some(),
            },
        }
    }

    /// The single-token kernel of a `v` product of `shape` that ends with this.
    pub(super) fn kernel(
        &self,
        ctx: &GpuContext,
        v: Variant,
        shape: (GgmlType, u64, u64, WeightMemory),
    ) -> Result<Kernel> {
        let (ty, _, n_cols, memory) = shape;
        let build = RopeOut::kernel_build(ctx, n_cols, self.build);
        let pipe = kernel_pipeline(ctx, ty, v, memory, (Build::Ks1(build), NOW))?;
        Ok(Kernel {
            stores_glu: true,
            ..Kernel::ks1(pipe, Steps::One, Ks1Walk::Heads(self.head_dim))
        })
    }

    /// The single-token build of rows of `n_cols` that ends with `rope`.
    fn kernel_build(ctx: &GpuContext, n_cols: u64, rope: RopeBuild) -> Ks1 {
        let (groups, slots) = ks1_shape(ctx, n_cols / 32);
        Ks1 {
            slots,
            split: 1,
            sliced: false,
            groups,
            normed: true,
            tile: 1,
            rope: Some(rope),
            plain: false,
            every_token: false,
        }
    }

    /// Bindings 9.. ([`rope_layout`]).
    pub(super) fn bindings(&self) -> Vec<wgpu::BindingResource<'_>> {
        let mut b = vec![
            self.params.as_entire_binding(),
            self.caches[0].as_entire_binding(),
            self.caches[1].as_entire_binding(),
            self.norms[0].as_entire_binding(),
            self.norms[1].as_entire_binding(),
        ];
        if let Some(t) = self.tex {
            b.push(wgpu::BindingResource::TextureView(t.k));
            b.push(wgpu::BindingResource::TextureView(t.v));
        }
        b
    }
}

/// Whether a product of `w` can fold in `norm` ([`folds_norm`], and its weight bound as
/// a uniform).
fn check_norm(ctx: &GpuContext, w: &GpuTensor, norm: Norm<'_>) -> Result<()> {
    if !folds_norm(ctx, w.ty, (w.n_rows(), w.n_cols()), w.memory) {
        return Err(Error::Unsupported(format!(
            "{}: a norm folded into its product on {}",
            w.name, ctx.info.name
        )));
    }
    let nw = norm.w;
    if !is_vector_uniform(nw) {
        return Err(Error::gpu(format!(
            "{}: a folded norm's weight must be a uniform buffer of at least {VECTOR_UNIFORM_BYTES} bytes (gpu::upload::vector_init), got {} bytes",
            w.name,
            nw.size()
        )));
    }
    Ok(())
}
