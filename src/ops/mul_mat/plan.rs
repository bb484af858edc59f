//! A product's dispatches: where its results go (`Outputs`), one dispatch per part of
//! W for each of its kernels, and for the uniform-activation variants a copy before
//! each load.

use super::*;

/// Where a dispatch's products go: up to three buffers and the rows of each.
pub(super) struct Outputs<'a> {
    /// Whether the kernels bind the second and third ([`GpuContext::fused_outputs`]).
    pub(super) bound: bool,
    pub(super) ys: [&'a wgpu::Buffer; 3],
    pub(super) seg: Segments,
    /// Floats between the first output's columns.
    pub(super) y_stride: u32,
    /// Whether the products replace the outputs or are added to them (`Params::acc`).
    pub(super) store: Store,
    /// 0, or 1 + the activation of a GLU store ([`Outputs::glu`]).
    pub(super) glu: u32,
    /// The RoPE and cache append a single token's Q/K/V product ends with
    /// ([`gpu_qkv_rope`]).
    pub(super) rope: Option<RopeOut<'a>>,
}

impl<'a> Outputs<'a> {
    pub(super) fn plain(
        ctx: &'a GpuContext,
        y: &'a wgpu::Buffer,
        n_rows: u64,
        store: Store,
    ) -> Outputs<'a> {
        let spare = &ctx.unused_output;
        Outputs {
            bound: ctx.fused_outputs(),
            ys: [y, spare, spare],
            seg: Segments::NONE,
            y_stride: n_rows as u32,
            store,
            glu: 0,
            rope: None,
        }
    }

    /// act(gate) * up into `y` ([n_ff, n_tokens]), from a product holding n_ff rows of
    /// gate then n_ff of up (`mul_mat_ks1`'s GLU store, single tokens only).
    pub(super) fn glu(
        ctx: &'a GpuContext,
        y: &'a wgpu::Buffer,
        n_ff: u32,
        act: Activation,
    ) -> Outputs<'a> {
        Outputs {
            glu: act as u32 + 1,
            ..Outputs::plain(ctx, y, n_ff as u64, Store::Write)
        }
    }

    pub(super) fn fused(
        ctx: &'a GpuContext,
        ys: &[&'a wgpu::Buffer],
        rows: &[u32],
    ) -> Result<Outputs<'a>> {
        let seg = Segments::of(rows)?;
        let spare = &ctx.unused_output;
        let y = |i: usize| ys.get(i).copied().unwrap_or(spare);
        Ok(Outputs {
            bound: ctx.fused_outputs(),
            ys: [y(0), y(1), y(2)],
            seg,
            y_stride: rows[0],
            store: Store::Write,
            glu: 0,
            rope: None,
        })
    }

    /// One output and no GLU store or RoPE: single tokens store with one case
    /// ([`Ks1::plain`]).
    pub(super) fn is_plain(&self) -> bool {
        self.seg == Segments::NONE && self.glu == 0 && self.rope.is_none()
    }

    /// Bindings 2..: weights, activations, outputs ([`mul_mat_layout`]).
    fn bindings(&self, w: &'a Part, x: &'a wgpu::Buffer) -> Vec<wgpu::BindingResource<'a>> {
        let mut b = weight_bindings(w, x, self.ys[0]);
        if self.bound {
            b.extend([
                self.ys[1].as_entire_binding(),
                self.ys[2].as_entire_binding(),
            ]);
        }
        b
    }
}

/// The dispatches of a product into `out`; with `glu`, its single tokens go there
/// instead where the kernel that runs them has the GLU store. Returns whether they do.
#[allow(clippy::too_many_arguments)]
pub(super) fn gpu_out(
    ctx: &GpuContext,
    v: Variant,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    (out, glu): (&Outputs<'_>, Option<&Outputs<'_>>),
    cols: Columns,
    norm: Option<Norm<'_>>,
) -> Result<(Vec<Dispatch>, bool)> {
    if w.n_cols() % 32 != 0 {
        return Err(Error::Unsupported(format!(
            "{}: rows of {} elements (the GPU matmul needs a multiple of 32)",
            w.name,
            w.n_cols()
        )));
    }
    let v = resolve(ctx, v, w.ty, w.n_cols(), w.memory)?;
    let v = for_product(ctx, v, (w.n_rows(), w.n_cols()), cols);
    let per_xu = tokens_per_xu(ctx, w.n_cols());
    if matches!(v, Variant::WinU | Variant::KsU) {
        let plan = gpu_uniform_x(ctx, v, step, w, (x, norm), out, cols, per_xu)?;
        return Ok((plan, false));
    }
    let plain = out.is_plain() && glu.is_none();
    // The GLU store reads gate and up from one part; so does the RoPE at the end of a
    // Q/K/V product read back its heads ([`fuses_rope`]).
    let glu = glu
        .filter(|g| w.parts.len() == 1 && (g.rope.is_some() || glu_rows_fit(ctx, v, g.y_stride)));
    let mut plan = Vec::new();
    let mut glu_stored = false;
    let shape = (w.ty, w.n_rows(), w.n_cols(), w.memory);
    let x_read = norm.map_or(x, |n| n.x);
    let direct = single_tokens_uniform(ctx, v, cols, w.n_cols()) && reads_uniform(x_read);
    // (variant, every token or the first load's, kernels)
    let mut runs = Vec::new();
    if direct {
        // Single tokens: `KsU`'s single-token build, reading x where it lies.
        let ks = kernels(
            ctx,
            shape,
            Variant::KsU,
            (Columns::Last, norm.is_some(), plain),
            false,
        )?;
        runs.push((Variant::KsU, (0, per_xu as u32), ks));
    }
    let ks = kernels(ctx, shape, v, (cols, norm.is_some(), plain), direct)?;
    runs.push((v, (0, u32::MAX), ks));
    for (v, toks, ks) in runs {
        for k in ks {
            let mut parts = |k: &Kernel, steps: Steps, out: &Outputs<'_>| {
                let on = move |s: &StepInfo| steps.admits(s, cols);
                let io = (x, out, norm);
                let d = part_dispatches(ctx, (v, k), step, w, io, cols, toks, on)?;
                plan.extend(d);
                Result::Ok(())
            };
            match glu {
                // Single tokens store act(gate) * up, or rotate and append their heads
                // (in the build that does); the other steps store their products.
                Some(g)
                    if k.stores_glu
                        && k.steps.admits_one()
                        && (g.rope.is_none() || ks_family(v)) =>
                {
                    let one = match &g.rope {
                        Some(r) => r.kernel(ctx, v, shape)?,
                        None => k.clone(),
                    };
                    parts(&one, Steps::One, g)?;
                    glu_stored = true;
                    if let Some(rest) = k.steps.beyond_one() {
                        parts(&k, rest, out)?;
                    }
                }
                _ => parts(&k, k.steps, out)?,
            }
        }
    }
    Ok((plan, glu_stored))
}

/// Whether `v`'s single-token build stores the GLU of `n_ff` gate rows: `mul_mat_ks1`
/// walks the rows in blocks of a subgroup's lanes, `mr` in pairs of any number.
fn glu_rows_fit(ctx: &GpuContext, v: Variant, n_ff: u32) -> bool {
    v == Variant::Mr || n_ff % ctx.subgroup_min_size.max(1) == 0
}

/// One dispatch per part of W with `kernel` (of variant `v`), reading activations from
/// `x` (storage, or the uniform copy; with a [`Norm`], its residual stream) for output
/// tokens `tok0 .. tok0 + tok_n`; a step for which `on` is false gets an empty grid.
#[allow(clippy::too_many_arguments)]
fn part_dispatches(
    ctx: &GpuContext,
    (v, kernel): (Variant, &Kernel),
    step: &wgpu::Buffer,
    w: &GpuTensor,
    (x, out, norm): (&wgpu::Buffer, &Outputs<'_>, Option<Norm<'_>>),
    cols: Columns,
    toks: (u32, u32),
    on: impl Fn(&StepInfo) -> bool + Copy + Send + Sync + 'static,
) -> Result<Vec<Dispatch>> {
    // Only the windowed walks read the window fields.
    let window = match v {
        Variant::Win | Variant::WinU => Window::of(w.ty)?,
        _ => Window::NONE,
    };
    let max_groups = ctx.limits.max_compute_workgroups_per_dimension.max(1);
    let label = format!("mul_mat {}", w.name);
    // A tile build over slices of the columns: one dispatch per part and slice.
    let (chunks, n_slices) = match kernel.slice {
        Some(c) => (c, (w.n_cols() / 32).div_ceil(c.max(1) as u64) as u32),
        None => (0, 1),
    };
    let pieces = w
        .parts
        .iter()
        .flat_map(|part| (0..n_slices).map(move |i| (part, i)));
    pieces
        .map(|(part, i)| {
            let mut wp = WinParams::new(w, part, cols, out, window, toks);
            if kernel.slice.is_some() {
                wp = wp.slice(i, chunks);
            }
            if let Some(walk) = kernel.ks1 {
                wp.wg_rows = ks1_rows(ctx, part.n_rows, walk);
            }
            let g = grid(v, part.n_rows, wp.wg_rows, max_groups);
            let walks_rows = matches!(v, Variant::Ks | Variant::KsU) && !kernel.tiled;
            if walks_rows {
                let lane_chunks = match kernel.ks1 {
                    // A window's tokens walk every row once a slice.
                    Some(Ks1Walk::Sliced(slices)) => slices,
                    Some(_) => 1,
                    None => (w.n_cols() as u32 / 32).div_ceil(ctx.subgroup_min_size.max(1)),
                };
                wp.tok_win = ks_tok_win(wp.wg_rows, lane_chunks);
            }
            let tok_win = wp.tok_win;
            let x = norm.map_or(x, |n| n.x);
            let mut bindings = out.bindings(part, x);
            if let Some(n) = norm {
                wp.norm_eps = n.eps;
                bindings.push(n.w.as_entire_binding());
            }
            if let Some(r) = &out.rope {
                bindings.extend(r.bindings());
            }
            if matches!(v, Variant::WinU | Variant::KsU) {
                // Binding 3 is a uniform of X_UNIFORM_BYTES: the copy's buffer, or the
                // first bytes of a larger one holding the activations.
                bindings[1] = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: x,
                    offset: 0,
                    size: wgpu::BufferSize::new(X_UNIFORM_BYTES),
                });
            }
            let pipe = kernel.pipe.clone();
            if kernel.tiled {
                let grid = mm_grid(part.n_rows, toks, max_groups, &w.name)?;
                let grid = move |s: &StepInfo| if on(s) { grid(s) } else { [0, 1, 1] };
                return dispatch_bound(ctx, &label, pipe, step, &wp, bindings, grid);
            }
            let grid = move |s: &StepInfo| match on(s) {
                // One workgroup along z per window of the step's output tokens.
                true if walks_rows => {
                    let n = match cols {
                        Columns::Last => 1,
                        Columns::All => tokens_in(s, toks),
                    };
                    [g[0], g[1], n.div_ceil(tok_win).max(1)]
                }
                true => g,
                false => [0, 1, 1],
            };
            let d = dispatch_bound(ctx, &label, pipe, step, &wp, bindings, grid)?;
            Ok(match kernel.ks1 {
                Some(Ks1Walk::Tokens | Ks1Walk::Heads(_)) => d.chainable(ks1_chainable(wp.wg_rows)),
                // Its workgroups are several subgroups, the chains' one.
                Some(Ks1Walk::Split) => d,
                Some(Ks1Walk::Sliced(_)) => d,
                None if v == Variant::Ks && walks_rows => {
                    d.chainable(ks_chainable(ctx, w.n_cols()))
                }
                _ => d,
            })
        })
        .collect()
}

/// `WinU`, `KsU`: per load of the uniform buffer, a copy of the next `per_xu` output
/// tokens' activations, then one dispatch per part of W. Enough loads are recorded for
/// the largest batch `x` holds; those past a step's tokens have empty grids.
#[allow(clippy::too_many_arguments)]
fn gpu_uniform_x(
    ctx: &GpuContext,
    v: Variant,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    (x, norm): (&wgpu::Buffer, Option<Norm<'_>>),
    out: &Outputs<'_>,
    cols: Columns,
    per_xu: u64,
) -> Result<Vec<Dispatch>> {
    let shape = (w.ty, w.n_rows(), w.n_cols(), w.memory);
    let kernels = kernels(ctx, shape, v, (cols, norm.is_some(), out.is_plain()), false)?;
    let copy = crate::ops::op_pipeline(ctx, "mul_mat_xcopy")?;
    let col_bytes = w.n_cols() * 4;
    let max_tokens = match cols {
        Columns::Last => 1,
        Columns::All => (x.size() / col_bytes).max(1),
    };
    // The copy writes xu as storage and the matmul then reads it as a uniform.
    let xu = ctx.scoped("allocating the mul_mat activation uniform", || {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("mul_mat x uniform"),
            size: X_UNIFORM_BYTES,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: false,
        })
    })?;
    let x_stride = (w.n_cols() / 4) as u32;
    let last_only = (cols == Columns::Last) as u32;
    let tok_n = per_xu as u32;
    let mut plan = Vec::new();
    for k in 0..max_tokens.div_ceil(per_xu) as u32 {
        let tok0 = k * tok_n;
        let first = move |s: &StepInfo| {
            if last_only != 0 {
                s.n_tokens.saturating_sub(1)
            } else {
                0
            }
        };
        let live = move |s: &StepInfo| tok0 < s.n_tokens - first(s).min(s.n_tokens);
        let cp = CopyParams {
            x_stride,
            tok0,
            tok_n,
            last_only,
        };
        let n_copy = tok_n * x_stride;
        plan.push(dispatch(
            ctx,
            &format!("mul_mat x copy {}", w.name),
            copy.clone(),
            step,
            &cp,
            &[x, &xu],
            move |s| [if live(s) { groups(n_copy, WG) } else { 0 }, 1, 1],
        )?);
        let toks = (tok0, tok_n);
        for k in &kernels {
            // Single tokens are all in the first load.
            if tok0 > 0 && k.steps == Steps::One {
                continue;
            }
            let steps = k.steps;
            let on = move |s: &StepInfo| live(s) && steps.admits(s, cols);
            let (v, xu) = (v, &xu);
            // A folded norm reads the residual stream from the copy too.
            let norm = norm.map(|n| Norm { x: xu, ..n });
            plan.extend(part_dispatches(
                ctx,
                (v, k),
                step,
                w,
                (xu, out, norm),
                cols,
                toks,
                on,
            )?);
        }
    }
    Ok(plan)
}
