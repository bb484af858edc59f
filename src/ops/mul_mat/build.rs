//! One build of a kernel as a pipeline: which shader (`mul_mat_ks1n`, `mul_mat_ks1i`,
//! the tiled `mul_mat_mm`, ...), its pipeline constants and the source regions kept, and
//! the bindings the kernels share.

use super::*;

pub(super) fn pipeline(
    ctx: &GpuContext,
    ty: GgmlType,
    v: Variant,
    memory: WeightMemory,
    when: Compile,
) -> Result<Pipe> {
    kernel_pipeline(ctx, ty, v, memory, (Build::Whole, when))
}

/// When a kernel's pipeline is compiled: with the plan, or when a step first runs it
/// (the builds that only batches run: a model's start need not wait for them, and a
/// prompt's first step compiles only those of its own size, `warm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Compile {
    Now,
    OnFirstUse,
}

pub(super) const NOW: Compile = Compile::Now;

/// The builds of [`kernels`] that no single token runs.
pub(super) const LATER: Compile = Compile::OnFirstUse;

/// Which build of a variant's kernel.
#[derive(Clone, Copy, Debug)]
pub(super) enum Build {
    /// The variant's kernel, for any batch.
    Whole,
    /// `Ks` or `KsU` without its tile loop (`TILES` off in mul_mat_ks.wgsl): every
    /// token alone, for steps of fewer than [`KS_TILE_MIN`] tokens. llvmpipe compiles a
    /// kernel on its first dispatch, and the tile loop is most of that work (about 3 s
    /// against 1-2 s, docs/perf.md): decoding and short prompts never pay it.
    Untiled,
    /// `mul_mat_ks1` (`Ks` and `KsU` only).
    Ks1(Ks1),
    /// `mul_mat_mm`, the tiled product `Mr`, `Wg` and `Sg` run batches of [`MM_MIN`]
    /// tokens or more on ([`mm_fits`]).
    Mm,
    /// `Mr` with `tile` tokens per pass and `lanes` invocations per workgroup
    /// ([`mr_lanes`]). Single tokens run a tile of one: without the tile's other sums
    /// and activations, fewer registers (on an H200, a gate/up product of 2x14336 rows
    /// went from 79 to 54 us, docs/perf.md).
    Mr { tile: u32, lanes: (u32, bool) },
}

/// How a `mul_mat_ks1` kernel is built.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ks1 {
    /// Chunks per lane ([`ks1_slots`]; [`ks1_shape`] for single tokens).
    pub(super) slots: u32,
    /// Subgroups a single token's workgroup splits each row over (`SPLIT`,
    /// [`ks1_split`]); 1 in the batch builds, which run only rows one subgroup holds,
    /// and on such rows.
    pub(super) split: u32,
    /// Whether a single token's subgroup walks each row in slices of `slots` chunks a
    /// lane (`SLICED`, [`ks1_token_slices`]); false in the batch builds.
    pub(super) sliced: bool,
    /// Rows a single token's subgroup dots at once (`GROUPS`, [`ks1_shape`]); 1 in the
    /// batch builds.
    pub(super) groups: u32,
    /// Whether it folds in the norm before the product (`mul_mat_ks1n`, `Ks` only).
    pub(super) normed: bool,
    /// Tokens per tile: 1, one token at a time; 4, batches in tiles of four (`TILE`,
    /// or `mul_mat_ks1i` for the types of [`ks1_int`]); 8, `mul_mat_ks1i` in tiles of
    /// eight ([`ks1i_eight`]).
    pub(super) tile: u32,
    /// The single-token build that ends with RoPE and the cache append
    /// (`mul_mat_ks1nr`, [`gpu_qkv_rope`]).
    pub(super) rope: Option<RopeBuild>,
    /// A single-token build that runs every token of its steps one at a time
    /// (`TAILS` off), for rows too long for the tile builds ([`ks1_tiles_run`]):
    /// otherwise it runs only the tokens a batch's whole tiles leave, the tile build
    /// the rest.
    pub(super) every_token: bool,
    /// A single-token build for plain products (one output, no GLU store,
    /// [`Outputs::is_plain`]): built with `FUSED` and `GLU` off, so that its store
    /// has one case. Ignored by the tile builds.
    pub(super) plain: bool,
}

impl Ks1 {
    /// Subgroups per workgroup ([`Ks1::split`]).
    pub(super) fn subgroups(self) -> u32 {
        self.split.max(1)
    }

    /// The single-token build of a product of `ty` on rows of `n_cols`
    /// ([`ks1_token_shape`], sliced where [`ks1_token_slices`] walks the rows so), the
    /// norm folded in or not, `plain` and `every_token` as their fields say.
    pub(super) fn token(
        ctx: &GpuContext,
        ty: GgmlType,
        n_cols: u64,
        (normed, plain, every_token): (bool, bool, bool),
    ) -> Ks1 {
        let (groups, slots, split) = ks1_token_shape(ctx, ty, n_cols / 32);
        Ks1 {
            slots,
            split,
            sliced: ks1_token_slices(ctx, ty, n_cols / 32).is_some(),
            groups,
            normed,
            tile: 1,
            rope: None,
            plain,
            every_token,
        }
    }
}

/// Whether a single-token `mul_mat_ks1` build of `ty` dots its slots in chunk pairs
/// (region `pairs`): the types `mul_mat_ks` walks in pairs too ([`ks_paired`], the K-quants,
/// whose neighbouring chunks share bytes), on an even count of slots per lane (each
/// lane's run then starts at an even chunk).
fn ks1_pairs(ty: GgmlType, k: Ks1) -> bool {
    ks_paired(ty) && k.tile == 1 && k.slots % 2 == 0 && ks_runs(ty)
}

/// Whether a single-token `mul_mat_ks1` build of `ty` in pairs reads what a lane's
/// pairs share in their block once per row (region `kblock`): where each
/// lane's run of chunks lies in one block of eight (2, 4 or 8 slots; runs start at a
/// multiple of the slots), on devices that read fields so ([`GpuContext::field_runs`]).
/// Measured on lavapipe with `--versus field-runs=off` on a synthetic 8B Q4_K_M model,
/// whose K-quant products run eight slots a lane: decode 1.04-1.09x (docs/perf.md).
fn ks1_kblock(ctx: &GpuContext, ty: GgmlType, k: Ks1) -> bool {
    ctx.field_runs && ks1_pairs(ty, k) && 8 % k.slots == 0
}

/// Which walk of a row a single-token `mul_mat_ks1` build dots its slots with
/// (`row_dot`): each is a region of the source, and a build keeps its own alone, so
/// that lavapipe does not translate and optimise the others before dropping them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RowDot {
    /// Chunk pairs, their block's shared part read once per row ([`ks1_kblock`]).
    KBlock,
    /// Chunk pairs ([`ks1_pairs`]).
    Pairs,
    /// One chunk at a time, the lane's small fields read once per row ([`ks1_fields`]).
    Fields,
    /// One chunk at a time.
    Plain,
}

impl RowDot {
    /// The walk of a build of `ty` in shape `k` (tile builds keep `Plain`, unused).
    pub(super) fn of(ctx: &GpuContext, ty: GgmlType, k: Ks1) -> RowDot {
        if ks1_kblock(ctx, ty, k) {
            Self::KBlock
        } else if ks1_pairs(ty, k) {
            Self::Pairs
        } else if ks1_fields(ctx, ty, k) {
            Self::Fields
        } else {
            Self::Plain
        }
    }

    /// Its region's name in ops/mul_mat_ks1.wgsl (and in the decoders, for `kblock` and
    /// `fields`).
    pub(super) fn region(self) -> &'static str {
        match self {
            Self::KBlock => "kblock",
            Self::Pairs => "pairs",
            Self::Fields => "fields",
            Self::Plain => "plain",
        }
    }
}

/// Whether a single-token `mul_mat_ks1` build of `ty` reads each lane's small fields
/// once per row (region `fields`): types whose decoder can
/// ([`crate::gpu::shaders::has_run_fields`]), where the device reads fields so
/// ([`GpuContext::field_runs`]). On lanes that hold runs of chunks ([`ks_runs`]) a
/// lane's fields lie together; Q8_0's strided lanes read the texels their row's slots
/// span (at most three), fewer than one per slot where a row has at most four lanes.
fn ks1_fields(ctx: &GpuContext, ty: GgmlType, k: Ks1) -> bool {
    let row_lanes = ctx.subgroup_min_size * k.subgroups() / k.groups.max(1);
    ctx.field_runs
        && k.tile == 1
        && crate::gpu::shaders::has_run_fields(ty)
        && (ks_runs(ty) || (row_lanes <= 4 && k.slots * row_lanes <= 24))
}

/// Whether a `mul_mat_ks1i` build of `ty` unpacks a lane's neighbouring chunks together
/// (region `chunk_pairs`): types whose two chunks share their bytes
/// ([`crate::gpu::shaders::has_chunk_pairs`], the K-quants), on an even count of slots a lane
/// whose runs start at even chunks. Measured on lavapipe: see docs/perf.md.
fn ks1i_chunk_pairs(ty: GgmlType, k: Ks1) -> bool {
    crate::gpu::shaders::has_chunk_pairs(ty) && k.slots % 2 == 0 && ks_runs(ty)
}

/// How `mul_mat_ks1nr` is built.
#[derive(Clone, Copy, Debug)]
pub(super) struct RopeBuild {
    /// Whether each head is normalised first (`HEAD_NORMS`).
    pub(super) head_norms: bool,
    /// Whether it writes the layer's kept cache textures too (region `tex`).
    pub(super) tex: bool,
}

/// The pipeline of variant `v` in `build`, compiled `when`.
pub(super) fn kernel_pipeline(
    ctx: &GpuContext,
    ty: GgmlType,
    v: Variant,
    memory: WeightMemory,
    (build, when): (Build, Compile),
) -> Result<Pipe> {
    let ks1 = match build {
        Build::Ks1(k) => Some(k),
        _ => None,
    };
    // Devices with few storage bindings get kernels with the one output.
    let fused = ctx.fused_outputs();
    let form = Form::new(!fused, memory);
    let normed = ks1.is_some_and(|k| k.normed);
    let walk = ks1.map_or(RowDot::Plain, |k| RowDot::of(ctx, ty, k));
    let int = ks1.is_some_and(|k| k.tile > 1 && v == Variant::Ks && ks1_int(ty));
    let chunk_pairs = int && ks1.is_some_and(|k| ks1i_chunk_pairs(ty, k));
    let rope = ks1.and_then(|k| k.rope);
    let shader = match (ks1, v) {
        (None, _) if matches!(build, Build::Mm) => "mul_mat_mm",
        (Some(k), Variant::Ks) if rope.is_some() && k.normed && k.tile == 1 => "mul_mat_ks1nr",
        (Some(k), Variant::KsU) if rope.is_some() && k.normed && k.tile == 1 => "mul_mat_ks1unr",
        (None, v) => v.shader(),
        (Some(k), Variant::Ks) if int && k.normed => "mul_mat_ks1in",
        (Some(_), Variant::Ks) if int => "mul_mat_ks1i",
        (Some(k), Variant::Ks) if k.normed => "mul_mat_ks1n",
        (Some(_), Variant::Ks) => "mul_mat_ks1",
        (Some(k), Variant::KsU) if !k.normed => "mul_mat_ks1u",
        (Some(_), Variant::KsU) => "mul_mat_ks1un",
        (Some(_), v) => {
            return Err(Error::gpu(format!(
                "mul_mat variant {} has no mul_mat_ks1 kernel",
                v.name()
            )))
        }
    };
    if rope.is_some() && !crate::gpu::shaders::is_rope_build(shader) {
        return Err(Error::gpu(format!(
            "{shader}: RoPE at the end of a product is a normed single-token build of ks or ksu only"
        )));
    }
    // The RoPE build that writes the layer's kept KV cache textures.
    let tex = match rope {
        Some(r) if r.tex => "_kvtex",
        _ => "",
    };
    // The walk (and `mul_mat_ks1i`'s chunk pairs) is in the source, not a constant:
    // the label tells the builds apart.
    let walk_label = match walk {
        RowDot::Plain if chunk_pairs => "_chunk_pairs".to_string(),
        RowDot::Plain => String::new(),
        w => format!("_{}", w.region()),
    };
    let label = format!("{shader}_{ty}{walk_label}{}{tex}", form.suffix());
    // Whether a product replaces its output or is added to it is a parameter
    // (`Params::acc`), not a constant: one pipeline serves both.
    let consts: Vec<(&str, f64)> = match (v, ks1) {
        (Variant::Ks | Variant::KsU, Some(k)) => {
            let split = k.subgroups();
            let mut c = vec![
                ("WG", ctx.subgroup_min_size as f64),
                ("RUNS", ks_runs(ty) as u8 as f64),
                ("SLOTS", k.slots as f64),
                ("GROUPS", k.groups as f64),
            ];
            // `mul_mat_ks1i` is a tile build only.
            if !int {
                c.push(("LANES", (ctx.subgroup_min_size * split) as f64));
                c.push(("TILE", (k.tile > 1) as u8 as f64));
            } else {
                c.push(("TILE", k.tile as f64));
            }
            if let Some(r) = rope {
                c.push(("HEAD_NORMS", r.head_norms as u8 as f64));
            }
            if split > 1 {
                c.push(("SPLIT", split as f64));
            }
            if k.sliced && k.tile == 1 {
                c.push(("SLICED", 1.0));
                c.push(("SLICE_ROWS", KS1_SLICE_ROWS as f64));
            }
            if k.every_token && k.tile == 1 {
                c.push(("TAILS", 0.0));
            }
            if k.plain && k.tile == 1 {
                c.push(("GLU", 0.0));
                if fused {
                    c.push(("FUSED", 0.0));
                }
            }
            c
        }
        _ if matches!(build, Build::Mm) => Vec::new(),
        (Variant::Row, _) => vec![("WG", WG as f64)],
        (Variant::Win | Variant::WinU, _) => {
            vec![("WG", WG as f64), ("NV", Window::of(ty)?.nv as f64)]
        }
        (Variant::Wg | Variant::Sg, _) => vec![("WG", ROW_WG as f64)],
        (Variant::Mr, _) => {
            let (tile, (wg, whole)) = match build {
                Build::Mr { tile, lanes } => (tile, lanes),
                _ => (MR_TILE, mr_shape(ctx)),
            };
            vec![
                ("WG", wg as f64),
                ("SG_WHOLE", whole as u8 as f64),
                ("TILE", tile as f64),
            ]
        }
        (Variant::Ks | Variant::KsU, None) => {
            vec![
                ("WG", ctx.subgroup_min_size as f64),
                ("PAIRED", ks_paired(ty) as u8 as f64),
                ("RUNS", ks_runs(ty) as u8 as f64),
                ("TILES", matches!(build, Build::Whole) as u8 as f64),
            ]
        }
    };
    let mut layout = mul_mat_layout(matches!(v, Variant::KsU | Variant::WinU), memory).to_vec();
    if !fused {
        layout.truncate(6);
    }
    if normed {
        // The norm's weight (common/x_norm.wgsl).
        layout.push(Binding::Uniform);
    }
    if let Some(r) = rope {
        layout.extend(rope_layout(r.tex));
    }
    let source = || {
        let src = crate::gpu::shaders::quant_source_as(shader, ty, form)?;
        Ok(match ks1 {
            Some(k) => {
                let src = crate::gpu::shaders::keep_regions(&src, "rope", rope.is_some());
                let src =
                    crate::gpu::shaders::keep_regions(&src, "tex", rope.is_some_and(|r| r.tex));
                let src = crate::gpu::shaders::row_walk(&src, walk.region());
                // A tile build's source leaves out the single-token loop, and a
                // single-token build's the tiles (the batch builds of `mul_mat_ks1i`
                // have neither region).
                let src = crate::gpu::shaders::keep_regions(&src, "tile", k.tile > 1);
                let src = crate::gpu::shaders::keep_regions(&src, "token", k.tile == 1);
                let src = crate::gpu::shaders::keep_regions(&src, "chunk_pairs", chunk_pairs);
                let src = crate::gpu::shaders::keep_regions(&src, "chunks", !chunk_pairs);
                let src = crate::gpu::shaders::keep_regions(&src, "split", k.subgroups() > 1);
                let src = crate::gpu::shaders::keep_regions(&src, "sliced", k.sliced);
                let src = crate::gpu::shaders::keep_slots(&src, k.slots);
                let src = crate::gpu::shaders::keep_regions(&src, "tile4", k.tile != 8);
                crate::gpu::shaders::keep_regions(&src, "tile8", k.tile == 8)
            }
            None => src,
        })
    };
    // Deferred either way: a chain (`ops::chain`) joins the kernel's source and layout.
    let d = ctx
        .pipelines
        .deferred(&ctx.device, &label, &consts, &layout, source)?;
    if when == Compile::Now {
        d.get()?;
    }
    Ok(Pipe::Deferred(d))
}

/// Bindings 9.. of `mul_mat_ks1nr`: the RoPE's parameters, the K and V caches, the
/// heads' norms' weights, and with `tex` the kept K and V textures.
fn rope_layout(tex: bool) -> Vec<Binding> {
    let mut b = vec![
        Binding::Uniform,
        Binding::ReadWrite,
        Binding::ReadWrite,
        Binding::Uniform,
        Binding::Uniform,
    ];
    if tex {
        b.extend([Binding::TextureWrite, Binding::TextureWrite]);
    }
    b
}

/// Bindings 2.. of a kernel that reads weights through common/w_storage.wgsl or
/// w_texture.wgsl: the weights, the activations (or ids), the output and the weights
/// again (seen as vec4s in storage; the same texture). The windowed variants read only
/// the vec4 view, at the first of the two.
pub(crate) fn weight_bindings<'a>(
    w: &'a Part,
    x: &'a wgpu::Buffer,
    y: &'a wgpu::Buffer,
) -> Vec<wgpu::BindingResource<'a>> {
    vec![
        w.binding(),
        x.as_entire_binding(),
        y.as_entire_binding(),
        w.binding(),
    ]
}

/// Group 0 of a kernel that reads weights through common/w_storage.wgsl: step,
/// parameters, weights as u32s, activations (a uniform copy for `x_uniform`), output,
/// weights as vec4s; or the weights' texture at both (w_texture.wgsl). Laid out
/// explicitly because a decoder may use either view of the weights alone.
pub(crate) fn weight_layout(x_uniform: bool, memory: WeightMemory) -> [Binding; 6] {
    let x = if x_uniform {
        Binding::Uniform
    } else {
        Binding::Read
    };
    let w = match memory {
        WeightMemory::Buffer => Binding::Read,
        WeightMemory::Texture => Binding::Texture,
    };
    [
        Binding::Uniform,
        Binding::Uniform,
        w,
        x,
        Binding::ReadWrite,
        w,
    ]
}

/// Group 0 of every mul_mat variant: [`weight_layout`] and the second and third
/// outputs of fused products. The windowed variants read only the vec4 view of the
/// weights (at binding 2, where the others have the u32 view); the same buffer is bound
/// at both.
fn mul_mat_layout(x_uniform: bool, memory: WeightMemory) -> [Binding; 8] {
    let [a, b, c, d, e, f] = weight_layout(x_uniform, memory);
    [a, b, c, d, e, f, Binding::ReadWrite, Binding::ReadWrite]
}
