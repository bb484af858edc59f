//! Which builds a product runs and in which steps (single tokens, tiles, the tokens
//! left after them, batches large enough for the tiled product), and compiling them
//! ahead of recording (`warm`).

use super::*;

/// Which steps one of a product's kernels runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Steps {
    Every,
    /// Those with one output token (a single token, or the last one alone).
    One,
    /// Those with several.
    Several,
    /// Those whose tile loop in `mul_mat_ks` would not run: one output token, or fewer
    /// than [`KS_TILE_MIN`].
    Few,
    /// The others.
    Many,
    /// Those with whole tiles of [`KS1_TILE`] tokens (`mul_mat_ks1`'s tile build).
    Tiles,
    /// Batches that are not whole tiles of [`KS1_TILE`] (`OneOrTail` less single tokens).
    Tail,
    /// Batches of fewer than [`KS_TILE_MIN`] tokens (`Few` less single tokens).
    FewSeveral,
    /// Those with one output token, and those with several that are not whole tiles of
    /// four (`mul_mat_ks1`'s single-token build runs the tokens its tiles leave).
    OneOrTail,
    /// Those with several output tokens, fewer than [`MM_MIN`].
    SeveralBelowMm,
    /// Those with one output token or fewer than [`MM_MIN`].
    BelowMm,
    /// Those with at least [`MM_MIN`] (`mul_mat_mm`).
    Mm,
    /// Batches `mul_mat_ks1i` runs in tiles of four ([`ks1i_eight`] false).
    Fours,
    /// Batches it runs in tiles of eight.
    Eights,
}

impl Steps {
    /// These steps less those of one token (which another kernel takes), if any remain.
    pub(super) fn beyond_one(self) -> Option<Steps> {
        match self {
            Steps::One => None,
            Steps::Every => Some(Steps::Several),
            Steps::OneOrTail => Some(Steps::Tail),
            Steps::Few => Some(Steps::FewSeveral),
            Steps::BelowMm => Some(Steps::SeveralBelowMm),
            s => Some(s),
        }
    }

    /// Whether steps of one token are among these.
    pub(super) fn admits_one(self) -> bool {
        self.beyond_one() != Some(self)
    }

    pub(super) fn admits(self, s: &StepInfo, cols: Columns) -> bool {
        let one = cols == Columns::Last || s.n_tokens == 1;
        match self {
            Steps::Every => true,
            Steps::One => one,
            Steps::Several => !one,
            Steps::OneOrTail => one || s.n_tokens % KS1_TILE != 0,
            Steps::Few => one || s.n_tokens < KS_TILE_MIN,
            Steps::Many => !one && s.n_tokens >= KS_TILE_MIN,
            Steps::Tiles => !one && s.n_tokens >= KS1_TILE,
            Steps::Tail => !one && s.n_tokens % KS1_TILE != 0,
            Steps::FewSeveral => !one && s.n_tokens < KS_TILE_MIN,
            Steps::SeveralBelowMm => !one && s.n_tokens < MM_MIN,
            Steps::BelowMm => one || s.n_tokens < MM_MIN,
            Steps::Mm => !one && s.n_tokens >= MM_MIN,
            Steps::Fours => !one && !ks1i_eight(s.n_tokens),
            Steps::Eights => !one && ks1i_eight(s.n_tokens),
        }
    }
}

/// One of a product's kernels ([`kernels`]) and the steps it runs in.
#[derive(Clone)]
pub(super) struct Kernel {
    pub(super) pipe: Pipe,
    pub(super) steps: Steps,
    /// Whether it is `mul_mat_mm`, whose grid has a dimension of token tiles.
    pub(super) tiled: bool,
    /// Whether it is a single-token build with the GLU store ([`Outputs::glu`]):
    /// `mul_mat_ks1`'s or `mul_mat_mr`'s.
    pub(super) stores_glu: bool,
    /// For the builds of `mul_mat_ks1` and `mul_mat_ks1i`, whose rows per workgroup the
    /// host chooses ([`ks1_rows`]), what they walk.
    pub(super) ks1: Option<Ks1Walk>,
    /// For a tile build over slices of the columns ([`ks1_slices`]), the chunks per
    /// slice: one dispatch per slice.
    pub(super) slice: Option<u32>,
}

impl Kernel {
    fn new(pipe: Pipe, steps: Steps) -> Kernel {
        Kernel {
            pipe,
            steps,
            tiled: false,
            stores_glu: false,
            ks1: None,
            slice: None,
        }
    }

    /// A build of `mul_mat_ks1` or `mul_mat_ks1i` walking `walk`.
    pub(super) fn ks1(pipe: Pipe, steps: Steps, walk: Ks1Walk) -> Kernel {
        Kernel {
            ks1: Some(walk),
            ..Kernel::new(pipe, steps)
        }
    }
}

/// The kernels of a product of `cols` and the steps each runs in: the variant's (for
/// `Ks` and `KsU`, its build without tiles in steps too short for one); or where
/// [`ks1_fits`], `mul_mat_ks1` for single tokens and, in batches, its build with tiles
/// of four tokens over the whole tiles beside the single-token build over the one to
/// three tokens left (`Ks`; `KsU` batches run its own tiles; for the types of
/// [`ks1_int`], `mul_mat_ks1i` over every token of a batch, in tiles of four or, from
/// [`KS1I_EIGHT_MIN`] tokens, of eight; over rows too long for one subgroup, the tiles
/// of the types [`ks1_sliced`] run a dispatch per slice of the columns, [`ks1_slices`]).
/// Builds that only batches run compile when a
/// step first runs them ([`warm`] compiles those of a given batch size). A product of
/// the last token alone never compiles a tile build. With `normed`, both fold in the
/// norm before the product ([`folds_norm`]). With `ones_elsewhere`, another kernel
/// runs the single tokens (`KsU`'s, [`single_tokens_uniform`]): these run only the
/// other steps, and the builds that single tokens would have run compile when a step
/// first needs them. With `plain` (the product has one output and no GLU store,
/// [`Outputs::is_plain`]), the single-token build of `mul_mat_ks1` stores that way only
/// ([`Ks1::plain`]).
pub(super) fn kernels(
    ctx: &GpuContext,
    shape: (GgmlType, u64, u64, WeightMemory),
    v: Variant,
    (cols, normed, plain): (Columns, bool, bool),
    ones_elsewhere: bool,
) -> Result<Vec<Kernel>> {
    if !ones_elsewhere {
        return kernels_compiled(ctx, shape, v, (cols, normed, plain), NOW);
    }
    let mut ks = kernels_compiled(ctx, shape, v, (cols, normed, plain), LATER)?;
    ks.retain_mut(|k| match k.steps.beyond_one() {
        Some(steps) => {
            k.steps = steps;
            true
        }
        None => false,
    });
    Ok(ks)
}

/// [`kernels`], the builds that single tokens run compiled `ones`.
fn kernels_compiled(
    ctx: &GpuContext,
    (ty, n_rows, n_cols, memory): (GgmlType, u64, u64, WeightMemory),
    v: Variant,
    (cols, normed, plain): (Columns, bool, bool),
    ones: Compile,
) -> Result<Vec<Kernel>> {
    if !ks1_fits(ctx, v, ty, n_cols) {
        if normed {
            return Err(Error::Unsupported(format!(
                "a norm folded into a {} {ty} product of {n_cols} columns",
                v.name()
            )));
        }
        if v == Variant::Mr {
            // Single tokens run a build without the tile's other three tokens.
            let lanes = mr_lanes(ctx, n_rows, n_cols);
            let one = Kernel {
                stores_glu: true,
                ..Kernel::new(
                    kernel_pipeline(ctx, ty, v, memory, (Build::Mr { tile: 1, lanes }, NOW))?,
                    Steps::One,
                )
            };
            if cols == Columns::Last {
                return Ok(vec![one]);
            }
            let tile = MR_TILE;
            let build = (Build::Mr { tile, lanes }, LATER);
            let whole = kernel_pipeline(ctx, ty, v, memory, build)?;
            if !mm_fits(ctx) {
                return Ok(vec![one, Kernel::new(whole, Steps::Several)]);
            }
            let mm = mm_kernel(ctx, ty, v, memory)?;
            return Ok(vec![one, Kernel::new(whole, Steps::SeveralBelowMm), mm]);
        }
        let whole = || pipeline(ctx, ty, v, memory, NOW);
        if matches!(v, Variant::Wg | Variant::Sg) && cols == Columns::All && mm_fits(ctx) {
            // A row per workgroup reads the row once per token: batches run tiled.
            return Ok(vec![
                Kernel::new(whole()?, Steps::BelowMm),
                mm_kernel(ctx, ty, v, memory)?,
            ]);
        }
        if !matches!(v, Variant::Ks | Variant::KsU) {
            return Ok(vec![Kernel::new(whole()?, Steps::Every)]);
        }
        let untiled = kernel_pipeline(ctx, ty, v, memory, (Build::Untiled, ones))?;
        if cols == Columns::Last {
            return Ok(vec![Kernel::new(untiled, Steps::One)]);
        }
        let whole = pipeline(ctx, ty, v, memory, LATER)?;
        return Ok(vec![
            Kernel::new(untiled, Steps::Few),
            Kernel::new(whole, Steps::Many),
        ]);
    }
    let token_slices = ks1_token_slices(ctx, ty, n_cols / 32).map(|(_, slices)| slices);
    // Rows too long for one subgroup's slots: batches in slices of the columns, if any.
    let sliced = ks1_slices(ctx, v, ty, n_cols);
    // Rows too long for the tile builds: `Ks`'s batches of fewer than `KS_TILE_MIN`
    // tokens run the single-token build too, so that a short prompt compiles no other
    // build before its first token.
    let every_token = v == Variant::Ks && !ks1_tiles_run(ctx, v, ty, n_cols);
    let one = Ks1::token(ctx, ty, n_cols, (normed, plain, every_token));
    let single = kernel_pipeline(ctx, ty, v, memory, (Build::Ks1(one), ones))?;
    let walk = if one.split > 1 {
        Ks1Walk::Split
    } else if let Some(slices) = token_slices {
        Ks1Walk::Sliced(slices)
    } else {
        Ks1Walk::Tokens
    };
    let single = |steps| Kernel {
        stores_glu: true,
        ..Kernel::ks1(single.clone(), steps, walk)
    };
    if cols == Columns::Last {
        return Ok(vec![single(Steps::One)]);
    }
    Ok(match v {
        // Rows too long for the tile builds: the single-token build runs batches below
        // `ks`'s tiles, `ks` the others.
        Variant::Ks if every_token => vec![
            single(Steps::Few),
            Kernel::new(pipeline(ctx, ty, v, memory, LATER)?, Steps::Many),
        ],
        // The tile build runs a batch's whole tiles (over whole rows or each slice of
        // their columns), the single-token build the rest.
        Variant::Ks => {
            let (slice, tile_slots) = match sliced {
                Some((chunks, slots)) => (Some(chunks), slots),
                None => (None, ks1_slots(ctx, n_cols / 32)),
            };
            let build = |tile, steps| {
                let build = Build::Ks1(Ks1 {
                    tile,
                    slots: tile_slots,
                    groups: 1,
                    split: 1,
                    sliced: false,
                    ..one
                });
                let pipe = kernel_pipeline(ctx, ty, v, memory, (build, LATER))?;
                Result::Ok(Kernel {
                    slice,
                    ..Kernel::ks1(pipe, steps, Ks1Walk::Tiles)
                })
            };
            if ks1_int(ty) {
                // `mul_mat_ks1i` runs every token of a batch, its last tile padded.
                vec![
                    single(Steps::One),
                    build(KS1_TILE, Steps::Fours)?,
                    build(8, Steps::Eights)?,
                ]
            } else {
                vec![single(Steps::OneOrTail), build(KS1_TILE, Steps::Tiles)?]
            }
        }
        // `KsU` folds a norm only into products of the last token (`for_product`).
        _ if normed => {
            return Err(Error::Unsupported(format!(
                "a norm folded into a {} {ty} product of every token",
                v.name()
            )))
        }
        _ => vec![
            single(Steps::One),
            Kernel::new(pipeline(ctx, ty, v, memory, LATER)?, Steps::Several),
        ],
    })
}

/// `mul_mat_mm` for the batches of [`MM_MIN`] tokens or more of a `v` product.
fn mm_kernel(ctx: &GpuContext, ty: GgmlType, v: Variant, memory: WeightMemory) -> Result<Kernel> {
    Ok(Kernel {
        tiled: true,
        ..Kernel::new(
            kernel_pipeline(ctx, ty, v, memory, (Build::Mm, LATER))?,
            Steps::Mm,
        )
    })
}

/// Compile (or find) the pipelines [`gpu`] (or with `normed`, [`gpu_normed`]) will use
/// for products of `cols` on rows of `n_cols` elements of type `ty` in single tokens and
/// in steps of `batch` tokens, so that they can be built ahead of recording, on another
/// thread; the builds that other batch sizes run are compiled when a step first runs
/// them. Matrices are held where the context keeps the type's
/// ([`GpuContext::matrix_memory`]). `plain`: the product has one output and no GLU
/// store (as [`gpu`]'s and [`gpu_normed`]'s of one output; not [`gpu_rows`]').
pub fn warm(
    ctx: &GpuContext,
    (ty, n_rows, n_cols): (GgmlType, u64, u64),
    (cols, normed, plain): (Columns, bool, bool),
    batch: u32,
) -> Result<()> {
    let memory = ctx.matrix_memory(ty);
    let v = resolve(ctx, variant(ctx, ty)?, ty, n_cols, memory)?;
    let v = for_product(ctx, v, (n_rows, n_cols), cols);
    if matches!(v, Variant::WinU | Variant::KsU) {
        crate::ops::op_pipeline(ctx, "mul_mat_xcopy")?;
    }
    let shape = (ty, n_rows, n_cols, memory);
    // The models' activations can be bound as uniforms (`upload::activations`).
    let ones_elsewhere = single_tokens_uniform(ctx, v, cols, n_cols);
    if ones_elsewhere {
        kernels(
            ctx,
            shape,
            Variant::KsU,
            (Columns::Last, normed, plain),
            false,
        )?;
    }
    let step = StepInfo::new(0, batch.max(1));
    for k in kernels(ctx, shape, v, (cols, normed, plain), ones_elsewhere)? {
        if let Pipe::Deferred(d) = &k.pipe {
            if k.steps.admits(&step, cols) {
                d.get()?;
            }
        }
    }
    Ok(())
}
