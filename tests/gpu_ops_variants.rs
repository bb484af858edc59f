//! Every `mul_mat` kernel variant against the CPU reference, for every GPU weight type
//! (K-quants included), on every adapter the machine offers, with guard regions after
//! the output; plus offline naga validation of the subgroup kernels.

mod common;

use common::*;
use wgllm::gguf::TensorInfo;
use wgllm::gpu::upload::{vector_init, WeightMemory};
use wgllm::gpu::{DeviceOptions, GpuContext, GpuTensor};
use wgllm::ops::glu::{self, Activation};
use wgllm::ops::mul_mat::{self, Columns, Variant, Window};
use wgllm::ops::{StepInfo, Store};
use wgllm::quant::GgmlType;

const GPU_TYPES: [GgmlType; 13] = GgmlType::WEIGHT_TYPES;

fn upload(ctx: &GpuContext, ty: GgmlType, n_rows: usize, n_cols: usize, bytes: &[u8]) -> GpuTensor {
    let info = TensorInfo {
        name: format!("w_{ty}"),
        dims: vec![n_cols as u64, n_rows as u64],
        ty,
        offset: 0,
        n_bytes: bytes.len() as u64,
    };
    GpuTensor::upload(ctx, &info, bytes).expect("upload")
}

#[allow(clippy::too_many_arguments)]
fn check(
    ctx: &GpuContext,
    v: Variant,
    ty: GgmlType,
    n_rows: usize,
    n_cols: usize,
    n_tokens: usize,
    cols: Columns,
) {
    check_store(ctx, v, ty, n_rows, n_cols, n_tokens, cols, Store::Write);
}

/// As [`check`]; with `Store::Add` y starts random and must end as that plus W x.
#[allow(clippy::too_many_arguments)]
fn check_store(
    ctx: &GpuContext,
    v: Variant,
    ty: GgmlType,
    n_rows: usize,
    n_cols: usize,
    n_tokens: usize,
    cols: Columns,
    store: Store,
) {
    let shape = (ty, n_rows, n_cols);
    check_x(ctx, v, shape, n_tokens, cols, store, XBuffer::Storage);
}

/// Where a product's activations lie.
#[derive(Clone, Copy, Debug)]
enum XBuffer {
    /// A plain storage buffer.
    Storage,
    /// A buffer single tokens can bind as a uniform, as the models' activations.
    Uniform,
}

fn x_buffer(ctx: &GpuContext, x: &[f32], kind: XBuffer) -> wgpu::Buffer {
    match kind {
        XBuffer::Storage => buffer_with_guard(ctx, x, 0),
        XBuffer::Uniform => {
            let bytes = std::mem::size_of_val(x) as u64;
            let b = wgllm::gpu::upload::activations(ctx, "x", bytes).expect("activations");
            ctx.queue.write_buffer(&b, 0, bytemuck::cast_slice(x));
            b
        }
    }
}

/// As [`check_store`], with the activations in `xk`.
fn check_x(
    ctx: &GpuContext,
    v: Variant,
    (ty, n_rows, n_cols): (GgmlType, usize, usize),
    n_tokens: usize,
    cols: Columns,
    store: Store,
    xk: XBuffer,
) {
    let w = weight(ty, n_rows, n_cols, (n_rows * 17 + n_cols) as u64);
    let x = Rng::new(5).vec(n_cols * n_tokens, 1.0);
    let gw = upload(ctx, ty, n_rows, n_cols, &w);
    let q8 = mul_mat::quantizes_batches(ctx, v, &gw, cols);
    let mut want = mul_mat_want(ty, &w, (n_rows, n_cols), &x, n_tokens, cols, q8);
    let y0 = match store {
        Store::Write => vec![0.0; want.len()],
        Store::Add => Rng::new(9).vec(want.len(), 1.0),
    };
    if store == Store::Add {
        for (a, b) in want.iter_mut().zip(&y0) {
            *a += b;
        }
    }
    // A single row is a vector, which stays in a buffer wherever matrices are held.
    let memory = if n_rows > 1 {
        ctx.matrix_memory(ty)
    } else {
        WeightMemory::Buffer
    };
    assert_eq!(gw.memory, memory, "{}", label(ctx));
    let step = StepInfo::new(0, n_tokens as u32);
    let sb = step_buffer(ctx, &step);
    let xb = x_buffer(ctx, &x, xk);
    let yb = buffer_with_guard(ctx, &y0, 64);
    let d = mul_mat::gpu_variant(ctx, v, &sb, &gw, &xb, &yb, cols, store).expect("build");
    run(ctx, &d, &step);
    let got = read_checked(ctx, &yb, want.len(), 64);
    let e = nmse(&got, &want);
    assert!(
        e < 1e-10,
        "mul_mat[{}] {ty} {n_rows}x{n_cols} x{n_tokens} {cols:?} {store:?} {xk:?} on {}: nmse {e:e}",
        v.name(),
        label(ctx)
    );
}

/// Products of one input fused into one matrix (`Proj::Fused`): the rows of `rows[i]`
/// land in output i alone, each checked against its own matrix's product.
fn check_fused(
    ctx: &GpuContext,
    v: Variant,
    ty: GgmlType,
    rows: &[usize],
    n_cols: usize,
    n_tokens: usize,
) {
    let ws: Vec<Vec<u8>> = (0..rows.len())
        .map(|i| weight(ty, rows[i], n_cols, 31 + i as u64))
        .collect();
    let gw = upload_fused(ctx, ty, rows, n_cols, &ws);
    let x = Rng::new(5).vec(n_cols * n_tokens, 1.0);
    let step = StepInfo::new(0, n_tokens as u32);
    let sb = step_buffer(ctx, &step);
    let xb = buffer_with_guard(ctx, &x, 0);
    let ybs: Vec<_> = rows
        .iter()
        .map(|&r| buffer_with_guard(ctx, &vec![0.0; r * n_tokens], 64))
        .collect();
    let yrefs: Vec<_> = ybs.iter().collect();
    let rows32: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    let d = mul_mat::gpu_rows_variant(ctx, v, &sb, &gw, &xb, &yrefs, &rows32).expect("build");
    run(ctx, &d, &step);
    let q8 = mul_mat::quantizes_batches(ctx, v, &gw, Columns::All);
    for (i, &r) in rows.iter().enumerate() {
        let want = mul_mat_want(ty, &ws[i], (r, n_cols), &x, n_tokens, Columns::All, q8);
        let got = read_checked(ctx, &ybs[i], want.len(), 64);
        let e = nmse(&got, &want);
        assert!(
            e < 1e-10,
            "fused mul_mat[{}] {ty} {rows:?}x{n_cols} x{n_tokens}, part {i} on {}: nmse {e:e}",
            v.name(),
            label(ctx)
        );
    }
}

/// A product with the norm before it folded into its kernels (`mul_mat::gpu_normed`):
/// y = W (rms_norm(x) * nw), from the raw residual stream `x` (the step records no norm
/// dispatch).
/// Returns the labels of the dispatches that ran.
fn check_normed(
    ctx: &GpuContext,
    ty: GgmlType,
    rows: &[usize],
    n_cols: usize,
    n_tokens: usize,
    cols: Columns,
) -> Vec<String> {
    check_normed_x(ctx, ty, rows, n_cols, (n_tokens, cols), XBuffer::Storage)
}

/// As [`check_normed`], with the residual stream in `xk`.
fn check_normed_x(
    ctx: &GpuContext,
    ty: GgmlType,
    rows: &[usize],
    n_cols: usize,
    (n_tokens, cols): (usize, Columns),
    xk: XBuffer,
) -> Vec<String> {
    let ws: Vec<Vec<u8>> = (0..rows.len())
        .map(|i| weight(ty, rows[i], n_cols, 41 + i as u64))
        .collect();
    let x = Rng::new(7).vec(n_cols * n_tokens, 3.0);
    let nw = Rng::new(8).vec(n_cols, 1.0);
    let eps = 1e-5;
    let mut xn = vec![0f32; x.len()];
    wgllm::ops::rms_norm::reference(&x, &nw, &mut xn, n_cols, eps);
    let gw = if rows.len() == 1 {
        upload(ctx, ty, rows[0], n_cols, &ws[0])
    } else {
        upload_fused(ctx, ty, rows, n_cols, &ws)
    };
    let step = StepInfo::new(0, n_tokens as u32);
    let sb = step_buffer(ctx, &step);
    let xb = x_buffer(ctx, &x, xk);
    let nwb = vector_init(ctx, "norm weight", &nw).expect("norm weight");
    let out_tokens = if cols == Columns::Last { 1 } else { n_tokens };
    let ybs: Vec<_> = rows
        .iter()
        .map(|&r| buffer_with_guard(ctx, &vec![0.0; r * out_tokens], 64))
        .collect();
    let yrefs: Vec<_> = ybs.iter().collect();
    let rows32: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    let norm = mul_mat::Norm {
        x: &xb,
        w: &nwb,
        eps,
    };
    let d = mul_mat::gpu_normed(ctx, &sb, &gw, norm, &yrefs, &rows32, cols).expect("build");
    run(ctx, &d, &step);
    let q8 = mul_mat::gpu_quantizes_batches(ctx, &gw, cols).expect("variant");
    for (i, &r) in rows.iter().enumerate() {
        let want = mul_mat_want(ty, &ws[i], (r, n_cols), &xn, n_tokens, cols, q8);
        let got = read_checked(ctx, &ybs[i], want.len(), 64);
        let e = nmse(&got, &want);
        assert!(
            e < 1e-10,
            "normed mul_mat {ty} {rows:?}x{n_cols} x{n_tokens} {cols:?} {xk:?}, part {i} on {}: nmse {e:e}",
            label(ctx)
        );
    }
    d.iter().map(|d| d.label.clone()).collect()
}

/// Whether `gpu_normed` builds a product of 3 rows of `n_cols` of `ty` whose norm
/// weight is a plain storage buffer (it must not: it refuses where the norm does not
/// fold, and the folded kernels read the weight as a uniform).
fn folds_from_storage(ctx: &GpuContext, ty: GgmlType, n_cols: usize) -> bool {
    let gw = upload(ctx, ty, 3, n_cols, &weight(ty, 3, n_cols, 1));
    let b = buffer_with_guard(ctx, &vec![0.0; n_cols], 0);
    let sb = step_buffer(ctx, &StepInfo::new(0, 1));
    let norm = mul_mat::Norm {
        x: &b,
        w: &b,
        eps: 1e-5,
    };
    mul_mat::gpu_normed(ctx, &sb, &gw, norm, &[&b], &[3], Columns::All).is_ok()
}

/// The norm folded into products, where the device runs them in `mul_mat_ks1`: types
/// walked with and without contiguous runs, one output and three, single tokens, the
/// last token of a batch, and batches (tiles of four and the tokens after them).
/// Elsewhere `gpu_normed` refuses.
#[test]
fn norm_folded_into_products() {
    let mut folded = 0;
    for ctx in contexts() {
        for (ty, n_cols) in [
            (GgmlType::Q4_1, 576),
            (GgmlType::Q8_0, 640),
            (GgmlType::Q5_0, 1536),
            (GgmlType::Q4_K, 1024),
            // Seven and eight chunks a lane, the most a subgroup holds (a K-quant's
            // seven, which `mul_mat_ks1` does not take, fold nothing).
            (GgmlType::Q8_0, 1792),
            (GgmlType::Q4_K, 1792),
            (GgmlType::Q4_K, 2048),
            (GgmlType::Q5_0, 2048),
        ] {
            let memory = ctx.matrix_memory(ty);
            if !mul_mat::folds_norm(ctx, ty, (70, n_cols as u64), memory) {
                let built = folds_from_storage(ctx, ty, n_cols);
                assert!(
                    !built,
                    "{ty} on {}: folded where it does not fit",
                    label(ctx)
                );
                continue;
            }
            folded += 1;
            // Past the most rows, a norm of its own costs less than every workgroup's.
            let many = (mul_mat::FOLD_MAX_ROWS + 1, n_cols as u64);
            assert!(!mul_mat::folds_norm(ctx, ty, many, memory));
            // The norm's weight is read as a uniform: a storage buffer is refused.
            let built = folds_from_storage(ctx, ty, n_cols);
            assert!(!built, "{ty} on {}: a storage norm weight", label(ctx));
            check_normed(ctx, ty, &[67], n_cols, 1, Columns::All);
            check_normed(ctx, ty, &[67], n_cols, 5, Columns::Last);
            check_normed(ctx, ty, &[67], n_cols, 9, Columns::All);
            check_normed(ctx, ty, &[67], n_cols, 8, Columns::All);
            check_normed(ctx, ty, &[70, 33, 33], n_cols, 1, Columns::All);
            check_normed(ctx, ty, &[70, 33, 33], n_cols, 6, Columns::All);
            // A head's worth of weights (over 4M) for the last token alone runs on a
            // uniform copy of the residual stream (`KsU`), the norm still folded in.
            if n_cols <= 640 {
                let head = (1usize << 22).div_ceil(n_cols) + 3;
                let labels = check_normed(ctx, ty, &[head], n_cols, 5, Columns::Last);
                assert!(
                    labels.iter().any(|l| l.starts_with("mul_mat x copy")),
                    "{ty} head on {}: {labels:?}",
                    label(ctx)
                );
            }
        }
    }
    // lavapipe runs `ks` with 8-lane subgroups: the folded kernel must have run there.
    let lavapipe = lavapipe_here("norm_folded_into_products");
    assert!(!lavapipe || folded > 0, "no adapter folded a norm");
}

/// Activations in a buffer that single tokens bind as a uniform, as the models' are
/// (`upload::activations`): a single token runs `KsU`'s kernels on it in place, and
/// batches the storage kernels, their tiles and the tokens after them; with the norm
/// folded in, and into fused outputs.
#[test]
fn activations_read_as_uniforms() {
    let mut ran = 0;
    for ctx in contexts() {
        // `KsU` takes the single tokens of `Ks` products only.
        if !Variant::Ks.available(ctx) {
            continue;
        }
        ran += 1;
        // 576 and 1024 columns run `mul_mat_ks1`; Q6_K and 1568 columns `ks`.
        for (ty, rows, n_cols) in [
            (GgmlType::Q4_1, 67, 576),
            (GgmlType::Q4_K, 65, 1024),
            (GgmlType::Q6_K, 33, 2048),
            (GgmlType::Q4_0, 33, 1568),
        ] {
            for toks in [1, 2, 3, 5, 9] {
                let (shape, store) = ((ty, rows, n_cols), Store::Write);
                check_x(
                    ctx,
                    Variant::Ks,
                    shape,
                    toks,
                    Columns::All,
                    store,
                    XBuffer::Uniform,
                );
            }
        }
        let shape = (GgmlType::Q5_0, 67, 96);
        check_x(
            ctx,
            Variant::Ks,
            shape,
            1,
            Columns::All,
            Store::Add,
            XBuffer::Uniform,
        );
        let ty = GgmlType::Q8_0;
        if mul_mat::folds_norm(ctx, ty, (136, 640), ctx.matrix_memory(ty)) {
            for toks in [1, 6] {
                let how = (toks, Columns::All);
                check_normed_x(ctx, ty, &[70, 33, 33], 640, how, XBuffer::Uniform);
            }
        }
    }
    // lavapipe runs `ks` with 8-lane subgroups.
    let lavapipe = lavapipe_here("activations_read_as_uniforms");
    assert!(!lavapipe || ran > 0, "no adapter ran `ks`");
}

/// A fused gate/up product with the activation after it: where the single-token kernel
/// has the GLU store (`mul_mat_ks1`, rows of gate in whole subgroup blocks), single
/// tokens store act(gate) * up themselves and the `glu` dispatch runs in batches only;
/// elsewhere it runs in every step. Either way `out` must be the activation of the two
/// products, from plain and uniform-bindable activations, with the norm before the
/// product folded in or not.
#[test]
fn gate_up_stores_the_activation() {
    let mut stored_somewhere = false;
    for ctx in contexts() {
        for (ty, n_ff, n_cols, act) in [
            (GgmlType::Q4_1, 48, 576, Activation::Silu),
            (GgmlType::Q5_0, 72, 640, Activation::GeluTanh),
            (GgmlType::Q4_K, 40, 1024, Activation::GeluTanh),
            (GgmlType::Q8_0, 36, 640, Activation::Silu),
            (GgmlType::Q6_K, 24, 512, Activation::Silu),
            // 2096 rows: past 16 workgroups of 64, so that CPU-hosted drivers walk
            // 144 rows per workgroup (`mul_mat::ks1_rows`), the last one 80.
            (GgmlType::Q4_1, 1048, 64, Activation::Silu),
        ] {
            for toks in [1, 5] {
                for xk in [XBuffer::Storage, XBuffer::Uniform] {
                    for normed in [false, true] {
                        let case = GluCase {
                            shape: (ty, n_ff, n_cols),
                            act,
                            toks,
                            xk,
                            normed,
                        };
                        stored_somewhere |= check_gate_up(ctx, case);
                    }
                }
            }
        }
    }
    // lavapipe runs `mul_mat_ks1` with 8-lane subgroups: the store must have run there.
    let lavapipe = lavapipe_here("gate_up_stores_the_activation");
    assert!(!lavapipe || stored_somewhere, "no adapter stored a GLU");
}

/// The device's contexts running `mr` for every type, as a GPU does: its lanes
/// one subgroup where the size is fixed, and (`tree`) reduced in workgroup memory.
fn mr_contexts(tree: bool) -> Vec<GpuContext> {
    contexts()
        .iter()
        .filter(|c| Variant::Mr.available(c))
        .map(|c| {
            let opts = DeviceOptions {
                workgroup_reductions: tree,
                mul_mat: Some("mr".into()),
                ..Default::default()
            };
            GpuContext::from_adapter(c.adapter.clone(), &opts).expect("context")
        })
        .collect()
}

/// `mr`'s single-token build stores act(gate) * up itself (two gate rows and the same
/// two of up per workgroup), for any number of gate rows, even or odd; batches leave it
/// to the `glu` dispatch.
#[test]
fn mr_stores_the_activation() {
    let mut stored = 0;
    let mut ran = 0;
    for ctx in mr_contexts(false).iter().chain(&mr_contexts(true)) {
        ran += 1;
        for (ty, n_ff, n_cols, act) in [
            (GgmlType::Q4_K, 40, 1024, Activation::GeluTanh),
            (GgmlType::Q8_0, 72, 640, Activation::Silu),
            (GgmlType::Q6_K, 24, 512, Activation::Silu),
            (GgmlType::Q4_0, 9, 96, Activation::Silu),
        ] {
            for toks in [1, 5, 17] {
                let case = GluCase {
                    shape: (ty, n_ff, n_cols),
                    act,
                    toks,
                    xk: XBuffer::Storage,
                    normed: false,
                };
                let s = check_gate_up(ctx, case);
                assert!(s, "{case:?} on {}: not stored", label(ctx));
                stored += s as u32;
            }
        }
    }
    // lavapipe runs `mr` with 8-lane subgroups; GL has none.
    let lavapipe = lavapipe_here("mr_stores_the_activation");
    assert!(!lavapipe || (ran > 0 && stored > 0), "no adapter ran `mr`");
}

#[derive(Clone, Copy, Debug)]
struct GluCase {
    /// Type, rows of gate (and of up), columns.
    shape: (GgmlType, usize, usize),
    act: Activation,
    toks: usize,
    xk: XBuffer,
    normed: bool,
}

/// One [`gate_up_stores_the_activation`] case; returns whether single tokens stored
/// the activation in the product.
fn check_gate_up(ctx: &GpuContext, c: GluCase) -> bool {
    let (ty, n_ff, n_cols) = c.shape;
    let ws = [weight(ty, n_ff, n_cols, 51), weight(ty, n_ff, n_cols, 52)];
    let gw = upload_fused(ctx, ty, &[n_ff, n_ff], n_cols, &ws);
    let x = Rng::new(11).vec(n_cols * c.toks, 2.0);
    let nw = Rng::new(12).vec(n_cols, 1.0);
    let eps = 1e-6;
    let memory = ctx.matrix_memory(ty);
    let folds = mul_mat::folds_norm(ctx, ty, (2 * n_ff as u64, n_cols as u64), memory);
    if c.normed && !folds {
        return false;
    }
    let mut xn = vec![0f32; x.len()];
    wgllm::ops::rms_norm::reference(&x, &nw, &mut xn, n_cols, eps);
    let step = StepInfo::new(0, c.toks as u32);
    let sb = step_buffer(ctx, &step);
    let xb = x_buffer(ctx, &x, c.xk);
    let nwb = vector_init(ctx, "norm weight", &nw).expect("norm weight");
    let norm = c.normed.then_some(mul_mat::Norm {
        x: &xb,
        w: &nwb,
        eps,
    });
    let stale = |n: usize| Rng::new(13).vec(n, 5.0);
    let gb = buffer_with_guard(ctx, &stale(n_ff * c.toks), 64);
    let ub = buffer_with_guard(ctx, &stale(n_ff * c.toks), 64);
    let ob = buffer_with_guard(ctx, &stale(n_ff * c.toks), 64);
    let glu = mul_mat::Glu {
        out: &ob,
        act: c.act,
    };
    let built = mul_mat::gpu_gate_up(ctx, &sb, &gw, (&xb, norm), [&gb, &ub], glu);
    let (mut d, stored) = built.expect("build");
    let n = n_ff as u32;
    d.push(glu::gpu_in(ctx, &sb, [&gb, &ub, &ob], n, c.act, stored).expect("glu"));
    run(ctx, &d, &step);
    let q8 = mul_mat::gpu_quantizes_batches(ctx, &gw, Columns::All).expect("variant");
    let xin = if c.normed { &xn } else { &x };
    let [g, u] =
        [0, 1].map(|i| mul_mat_want(ty, &ws[i], (n_ff, n_cols), xin, c.toks, Columns::All, q8));
    let mut want = vec![0f32; g.len()];
    glu::reference(&g, &u, &mut want, c.act);
    let got = read_checked(ctx, &ob, want.len(), 64);
    let e = nmse(&got, &want);
    assert!(
        e < 1e-9,
        "{c:?} on {}: nmse {e:e}, stored {stored}",
        label(ctx)
    );
    // Whole subgroup blocks of gate rows, on `mul_mat_ks1`'s types (not Q6_K), store.
    let sg = ctx.subgroup_min_size.max(1) as usize;
    let ks1 = Variant::Ks.available(ctx) && ty != GgmlType::Q6_K && n_ff % sg == 0;
    if ctx.info.device_type == wgpu::DeviceType::Cpu && ks1 {
        assert!(
            stored,
            "{c:?} on {}: the activation went to a dispatch",
            label(ctx)
        );
    }
    stored
}

/// `ctx`'s adapter opened again with `opts`.
fn reopened(ctx: &GpuContext, opts: DeviceOptions) -> GpuContext {
    GpuContext::from_adapter(ctx.adapter.clone(), &opts).expect("context")
}

fn variants(ctx: &GpuContext) -> impl Iterator<Item = Variant> + '_ {
    Variant::ALL.into_iter().filter(|v| v.available(ctx))
}

#[test]
fn variants_small_block_types() {
    for ctx in contexts() {
        for v in variants(ctx) {
            for ty in GPU_TYPES.into_iter().filter(|t| t.block_size() <= 32) {
                // 576 columns: 18 Q4_0 blocks, several windows with a short last one;
                // odd row counts give rows that start at every alignment. 7 tokens are
                // one short tile in `ks`, 9 a whole one and a single token. Single tokens
                // of up to 48 chunks run `mul_mat_ks1` in `ks` on 8-lane subgroups, with
                // the fewest chunks per lane that cover the row, on as many rows at once
                // as keep the most lanes busy (`mul_mat::ks1_shape`): 32 and 160
                // columns four rows at once, 96 and 576 two (five chunks on four lanes
                // each), 768 one (three chunks fill every lane), four at 800, six at
                // 1536 (full), seven at 1568 and eight at 2048, whose batches run the
                // tiles too (four tokens: one whole tile; nine: two, and for the float
                // tiles a token after them);
                // 2080 run `ks` itself. Batches of two to four run `ks`'s build without
                // tiles, and `mul_mat_ks1`'s single-token build alone (three tokens: no
                // whole tile of four).
                for (rows, cols, toks) in [
                    (1, 32, 1),
                    (67, 96, 1),
                    (67, 96, 3),
                    (33, 576, 7),
                    (257, 160, 9),
                    (67, 768, 1),
                    (65, 800, 1),
                    (33, 1536, 1),
                    (33, 1568, 1),
                    (33, 1568, 4),
                    (33, 2048, 1),
                    (33, 2048, 4),
                    (19, 2048, 9),
                    (9, 2080, 1),
                ] {
                    check(ctx, v, ty, rows, cols, toks, Columns::All);
                }
                check(ctx, v, ty, 70, 64, 6, Columns::Last);
                // Two and five chunks per lane, once per walk (`RUNS` on and off).
                if matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0) {
                    check(ctx, v, ty, 33, 480, 1, Columns::All);
                    check(ctx, v, ty, 33, 1248, 1, Columns::All);
                }
                // Into a residual stream: a whole tile and a short one. The store
                // does not depend on the weight type, so one type per family checks it
                // (each is a pipeline of its own to compile).
                if ty == GgmlType::Q5_0 {
                    check_store(ctx, v, ty, 67, 96, 13, Columns::All, Store::Add);
                    check_store(ctx, v, ty, 67, 96, 1, Columns::All, Store::Add);
                    // Q, K, V as one product: segments that start inside a workgroup's
                    // rows, a single token and a tile with a short one.
                    check_fused(ctx, v, ty, &[70, 33, 33], 96, 1);
                    check_fused(ctx, v, ty, &[70, 33, 33], 96, 14);
                }
            }
        }
    }
}

/// `ctx` reopened with a lane's small fields read once per row (`field_runs`) or each
/// chunk's alone.
fn with_field_runs(ctx: &GpuContext, field_runs: bool) -> GpuContext {
    reopened(
        ctx,
        DeviceOptions {
            field_runs: Some(field_runs),
            ..Default::default()
        },
    )
}

/// Which walk of a row single tokens take in `mul_mat_ks1` (each build keeps one, and
/// every walk gives the same products, so the results above cannot tell): on 8-lane
/// subgroups with fields read once per row, the K-quants on two, four or eight slots a
/// lane read their block's shared part once (`kblock`), and in pairs without (`pairs`);
/// the planar types on runs of chunks, and Q8_0 on rows of at most four lanes, read
/// their fields once per row (`fields`); the rest one chunk at a time (`plain`).
#[test]
fn single_tokens_take_their_walks() {
    for ctx in contexts() {
        for field_runs in [false, true] {
            let ctx = with_field_runs(ctx, field_runs);
            let ks1 = ctx.fixed_subgroup() == Some(8) && Variant::Ks.available(&ctx);
            // (type, columns, walk with fields read once per row, walk without).
            let cases = [
                (GgmlType::Q4_K, 2048, "kblock", "pairs"),
                (GgmlType::Q4_K, 1024, "kblock", "pairs"),
                (GgmlType::Q6_K, 2048, "kblock", "pairs"),
                (GgmlType::Q5_K, 8192, "kblock", "pairs"),
                (GgmlType::Q4_0, 2048, "fields", "plain"),
                (GgmlType::Q5_0, 640, "fields", "plain"),
                (GgmlType::Q8_0, 640, "fields", "plain"),
                (GgmlType::Q8_0, 2048, "plain", "plain"),
                (GgmlType::F16, 2048, "plain", "plain"),
            ];
            for (ty, cols, with, without) in cases {
                let gw = upload(&ctx, ty, 8, cols, &weight(ty, 8, cols, 5));
                let walk = mul_mat::single_token_walk(&ctx, Variant::Ks, &gw);
                let want = ks1.then_some(if field_runs { with } else { without });
                assert_eq!(walk, want, "{ty} {cols} columns, field runs {field_runs}");
            }
        }
    }
}

/// Single tokens of the planar types whose `mul_mat_ks1` lanes read their small fields
/// once per row (`DeviceOptions::field_runs`, on by default on CPU-hosted drivers),
/// and each chunk's fields alone, on every adapter: every count of slots per lane (one
/// to eight), runs that start at either half of a word and at every word of a texel, a
/// run of six 4-byte fields that reaches a third texel, and one, two and four rows on a
/// subgroup at once (`mul_mat::ks1_shape`); for Q8_0's strided lanes, rows of two and
/// four lanes whose slots span one to three texels (32 to 576 columns), and rows of
/// eight, which read one field per chunk; and the K-quants' blocks (below).
#[test]
fn small_fields_in_runs_and_per_chunk() {
    for ctx in contexts() {
        for field_runs in [false, true] {
            let ctx = with_field_runs(ctx, field_runs);
            assert_eq!(ctx.field_runs, field_runs);
            for ty in [
                GgmlType::Q4_0,
                GgmlType::Q4_1,
                GgmlType::Q5_0,
                GgmlType::Q5_1,
                GgmlType::Q8_0,
            ] {
                assert!(wgllm::gpu::shaders::has_run_fields(ty), "{ty}");
                // Chunks per row: 1, 3, 5 (three slots on two lanes), 10 (five on
                // two), 11 (three on four), 15 (two on eight), 16 (two on eight), 18 (five on four), 25 (four on eight), 39
                // (five on eight), 41 and 48 (six on eight), 55 (seven) and 64
                // (eight). At 41 and 55, Q5_1's (d, m) plane starts 4 and 12 bytes into
                // a texel, and runs of six and seven from 12 bytes in reach a third.
                for (rows, cols) in [
                    (9, 32),
                    (67, 96),
                    (65, 160),
                    (33, 320),
                    (33, 352),
                    (33, 480),
                    (35, 512),
                    (67, 576),
                    (33, 800),
                    (33, 1248),
                    (33, 1312),
                    (33, 1536),
                    (33, 1760),
                    (17, 2048),
                ] {
                    for v in [Variant::Ks, Variant::KsU]
                        .into_iter()
                        .filter(|v| v.available(&ctx))
                    {
                        check(&ctx, v, ty, rows, cols, 1, Columns::All);
                    }
                }
            }
            // The K-quants' fields lie inside their blocks: where a lane's chunk
            // pairs lie in one block (one, two and four pairs a lane), what they share
            // there is read once per row; runs of six slots cross blocks and keep each
            // pair's reads. 5120 columns split over three subgroups whose last lanes
            // lie past the row.
            for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
                assert!(!wgllm::gpu::shaders::has_run_fields(ty), "{ty}");
                assert!(wgllm::gpu::shaders::has_k_block(ty), "{ty}");
                for (rows, cols) in [(33, 512), (67, 1024), (17, 1536), (33, 2048), (9, 5120)] {
                    for v in [Variant::Ks, Variant::KsU]
                        .into_iter()
                        .filter(|v| v.available(&ctx))
                    {
                        check(&ctx, v, ty, rows, cols, 1, Columns::All);
                    }
                }
            }
        }
    }
}

/// Single tokens of rows too long for one subgroup's `mul_mat_ks1` slots, walked by one
/// subgroup in slices of the columns (`DeviceOptions::sliced_tokens`) or split over a
/// workgroup's subgroups (both on CPU-hosted drivers with one subgroup size, by default
/// the slices: `DeviceOptions::split_rows`), and in `mul_mat_ks` with `split_rows` off,
/// on every adapter: two to eight slices or subgroups (65 to 512 chunks), lanes past
/// the row's end, a short last slice, rows that leave a workgroup's last block of lanes
/// short, several workgroups of rows, batches below five tokens (the same build, token
/// by token) and above (`ks`), a product of the last token, an added store, and gate and
/// up as one product storing act(gate) * up.
#[test]
fn rows_split_over_subgroups() {
    for ctx in contexts() {
        for (split_rows, sliced) in [(false, false), (true, false), (true, true)] {
            let ctx = reopened(
                ctx,
                DeviceOptions {
                    split_rows: Some(split_rows),
                    sliced_tokens: Some(sliced),
                    ..Default::default()
                },
            );
            assert_eq!(ctx.split_rows, split_rows);
            assert_eq!(ctx.sliced_tokens, sliced);
            // Each decoder family: planar runs (Q4_0, Q5_1 whose fields reach a third
            // texel), Q8_0's strided lanes, the K-quants in pairs, and floats. With
            // `split_rows` off, one shape each: `ks` has tests of its own.
            let types = [
                GgmlType::F16,
                GgmlType::Q4_0,
                GgmlType::Q5_1,
                GgmlType::Q8_0,
                GgmlType::Q4_K,
                GgmlType::Q5_K,
                GgmlType::Q6_K,
            ];
            for ty in types {
                // Chunks per row: 65 (two subgroups or slices, five slots: 40 and 25
                // chunks), 72 (two, five; six in pairs), 128 (two, eight), 129 (three,
                // six), 448 (seven, eight: 14336 columns) and 512 (eight, eight).
                let shapes: &[(usize, usize, usize)] = if ty.block_size() == 256 {
                    &[
                        (33, 2304, 1),
                        (67, 4096, 1),
                        (9, 4096, 3),
                        (17, 14336, 1),
                        (9, 16384, 1),
                    ]
                } else {
                    &[
                        (33, 2080, 1),
                        (67, 4096, 1),
                        (9, 4096, 3),
                        (35, 4128, 1),
                        (17, 14336, 1),
                        (9, 16384, 1),
                    ]
                };
                for v in [Variant::Ks, Variant::KsU]
                    .into_iter()
                    .filter(|v| v.available(&ctx))
                {
                    let gw = upload(&ctx, ty, 9, 4096, &weight(ty, 9, 4096, 3));
                    let in_slices = mul_mat::tokens_in_slices(&ctx, v, &gw);
                    let ks1 = ctx.fixed_subgroup().is_some() && Variant::Ks.available(&ctx);
                    assert_eq!(in_slices, sliced && ks1, "{ty} {} in slices", v.name());
                    let shapes = if split_rows { shapes } else { &shapes[1..2] };
                    for &(rows, cols, toks) in shapes {
                        check(&ctx, v, ty, rows, cols, toks, Columns::All);
                    }
                    if !split_rows {
                        continue;
                    }
                    check(&ctx, v, ty, 70, 4096, 6, Columns::Last);
                    check_store(&ctx, v, ty, 67, 4096, 1, Columns::All, Store::Add);
                }
            }
            if split_rows && Variant::Ks.available(&ctx) {
                // Four workgroups of rows on two threads (at most 1024 rows each in
                // four slices), each of many blocks of lanes, the last one short.
                for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
                    check(&ctx, Variant::Ks, ty, 2100, 8192, 1, Columns::All);
                }
            }
            // `mul_mat_ks` leaves the activation to a dispatch of its own, which
            // `check_gate_up` rejects on lavapipe.
            let split_types = [
                (GgmlType::Q4_K, Activation::Silu),
                (GgmlType::Q8_0, Activation::GeluTanh),
            ];
            for (ty, act) in split_types.into_iter().filter(|_| split_rows) {
                for xk in [XBuffer::Storage, XBuffer::Uniform] {
                    let case = GluCase {
                        shape: (ty, 40, 4096),
                        act,
                        toks: 1,
                        xk,
                        normed: false,
                    };
                    check_gate_up(&ctx, case);
                }
            }
        }
    }
}

/// The contexts whose `ks` products run `mul_mat_ks1` and `mul_mat_ks1i` (subgroups of
/// one fixed size).
fn ks1_contexts() -> Vec<&'static GpuContext> {
    contexts()
        .iter()
        .filter(|c| Variant::Ks.available(c) && c.fixed_subgroup().is_some())
        .collect()
}

/// Batches of rows too long for one subgroup's `mul_mat_ks1` slots, of the types
/// `mul_mat_ks1i` dots in integers (the K-quants among them) and of Q8_0 (the float
/// tiles), in tiles over slices of the columns (`DeviceOptions::sliced_batches`, on by
/// default where single tokens split such rows), each slice adding into the output: two
/// slices of equal slots (4096 columns), a short last slice (2080: 40 and 25 chunks;
/// 5632: 64, 64 and 48), seven slices (14336), several workgroups of rows; tiles of
/// four and of eight, and the float tiles' tail of single tokens; an added store, fused
/// outputs, and weights split into parts of rows. With it off, `ks` runs them, its
/// activations unquantized.
#[test]
fn batches_in_slices_of_columns() {
    let eight = mul_mat::KS1I_EIGHT_MIN as usize;
    let ctxs = ks1_contexts();
    for ctx in ctxs.iter().copied() {
        for sliced in [false, true] {
            let ctx = reopened(
                ctx,
                DeviceOptions {
                    sliced_batches: Some(sliced),
                    ..Default::default()
                },
            );
            for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q6_K] {
                let gw = upload(&ctx, ty, 9, 4096, &weight(ty, 9, 4096, 3));
                let q8 = mul_mat::quantizes_batches(&ctx, Variant::Ks, &gw, Columns::All);
                let in_slices = mul_mat::batches_in_slices(&ctx, Variant::Ks, &gw, Columns::All);
                let int = ty != GgmlType::Q8_0;
                assert_eq!(
                    q8,
                    sliced && int,
                    "{ty} batches quantized on {}",
                    label(&ctx)
                );
                assert_eq!(
                    in_slices,
                    sliced,
                    "{ty} batches in slices on {}",
                    label(&ctx)
                );
            }
            // Rows that fit one subgroup's slots never run in slices.
            let ty = GgmlType::Q8_0;
            let gw = upload(&ctx, ty, 9, 2048, &weight(ty, 9, 2048, 3));
            assert!(!mul_mat::batches_in_slices(
                &ctx,
                Variant::Ks,
                &gw,
                Columns::All
            ));
        }
        let types = [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        for ty in types {
            // The K-quants: 2304 columns take two slices of five slots (chunks one at a
            // time), the others eight (in chunk pairs).
            let first = if ty.block_size() == 256 { 2304 } else { 2080 };
            for (rows, cols, toks) in [
                (33, first, 9),
                (150, 4096, 8),
                (9, 5632, 6),
                (9, 14336, 5),
                (17, 4096, eight + 2),
            ] {
                check(ctx, Variant::Ks, ty, rows, cols, toks, Columns::All);
            }
        }
        check_store(
            ctx,
            Variant::Ks,
            GgmlType::Q4_0,
            67,
            4096,
            eight + 1,
            Columns::All,
            Store::Add,
        );
        check_store(
            ctx,
            Variant::Ks,
            GgmlType::Q5_1,
            67,
            2304,
            7,
            Columns::All,
            Store::Add,
        );
        check_store(
            ctx,
            Variant::Ks,
            GgmlType::Q8_0,
            67,
            4096,
            9,
            Columns::All,
            Store::Add,
        );
        check_fused(ctx, Variant::Ks, GgmlType::Q4_1, &[70, 33, 33], 4096, 8);
        check_fused(ctx, Variant::Ks, GgmlType::Q8_0, &[70, 33, 33], 4096, 6);
        // Weights split into parts of rows (a binding limit of 64 KiB: 25 rows of
        // 2560 bytes each), every part in slices.
        let small = reopened(
            ctx,
            DeviceOptions {
                max_binding: Some(64 * 1024),
                ..Default::default()
            },
        );
        let ty = GgmlType::Q4_1;
        let gw = upload(&small, ty, 67, 4096, &weight(ty, 67, 4096, 3));
        assert!(gw.parts.len() > 1, "{} parts", gw.parts.len());
        check(&small, Variant::Ks, ty, 67, 4096, 9, Columns::All);
    }
    assert!(
        !ctxs.is_empty() || !lavapipe_here("batches_in_slices_of_columns"),
        "no adapter ran ks"
    );
}

#[test]
fn variants_k_quants() {
    for ctx in contexts() {
        for v in variants(ctx) {
            for ty in GPU_TYPES.into_iter().filter(|t| t.block_size() == 256) {
                // Single tokens of up to 2048 columns run `mul_mat_ks1` in `ks` on
                // 8-lane subgroups: one chunk per lane at 256 columns, three at 768,
                // four at 1024, six at 1536, eight at 2048 (in pairs; batches in the
                // float tiles, one chunk at a time: four tokens one whole tile, nine
                // two and a token after them); 1792 (seven, no pairs) runs `ks`
                // itself, and 2304 splits its rows over two subgroups
                // (`rows_split_over_subgroups`).
                for (rows, cols, toks) in [
                    (1, 256, 1),
                    (67, 512, 5),
                    (33, 2048, 2),
                    (65, 768, 9),
                    (65, 768, 1),
                    (67, 1024, 1),
                    (33, 1536, 1),
                    (33, 2048, 1),
                    (17, 2048, 4),
                    (33, 2048, 9),
                    (33, 1792, 1),
                    (9, 2304, 1),
                ] {
                    check(ctx, v, ty, rows, cols, toks, Columns::All);
                }
                check(ctx, v, ty, 70, 512, 6, Columns::Last);
                if ty == GgmlType::Q4_K {
                    check_store(ctx, v, ty, 67, 512, 14, Columns::All, Store::Add);
                    // Gate and up as one product.
                    check_fused(ctx, v, ty, &[65, 65], 512, 9);
                }
            }
        }
    }
}

#[test]
fn variants_split_weights() {
    for ctx in contexts() {
        let small = reopened(
            ctx,
            DeviceOptions {
                max_binding: Some(1024),
                ..Default::default()
            },
        );
        for v in variants(&small) {
            for ty in [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q6_K] {
                let cols = if ty.block_size() == 256 { 256 } else { 64 };
                check(&small, v, ty, 301, cols, 2, Columns::All);
                check(&small, v, ty, 301, cols, 1, Columns::All);
            }
        }
    }
}

/// Weights held in textures (`gpu::upload::WeightMemory::Texture`): every variant
/// that reads them (the windowed walks run as `row`), every type, single tokens, tiles,
/// the last column only, a residual store, fused outputs and weights split into parts.
#[test]
fn variants_with_weights_in_textures() {
    variants_in_memory(texture_contexts(), WeightMemory::Texture);
}

/// Weights larger than the staging ring they are uploaded through (`gpu::staging`: two
/// buffers of 2 MiB), in textures and in buffers: each crosses buffers, reuses the
/// first once its copy has run, and ends mid-row of a texture; a planar type, then a
/// verbatim one, so the ring also carries over from one tensor to the next.
#[test]
fn weights_larger_than_the_staging_ring() {
    let stage = wgllm::gpu::staging::STAGE_BYTES as usize * wgllm::gpu::staging::STAGES;
    for ctx in texture_contexts().iter().chain(buffer_contexts()) {
        let v = mul_mat::default_variant(ctx);
        for (ty, rows) in [(GgmlType::Q8_0, 4100), (GgmlType::Q4_K, 7500)] {
            let bytes = ty.row_bytes(2048).expect("whole blocks") as usize * rows;
            assert!(bytes > stage, "{ty}: {bytes} bytes do not cross the ring");
            check(ctx, v, ty, rows, 2048, 1, Columns::All);
        }
    }
}

/// The same in storage buffers (`gpu::upload::WeightMemory::Buffer`), which CPU-hosted
/// Vulkan drivers do not use by default.
#[test]
fn variants_with_weights_in_buffers() {
    variants_in_memory(buffer_contexts(), WeightMemory::Buffer);
}

/// Every variant of `ctxs`, whose matrices are held in `memory`, as the two tests above
/// describe.
fn variants_in_memory(ctxs: &[GpuContext], memory: WeightMemory) {
    for ctx in ctxs {
        for v in variants(ctx) {
            // Every type through the variants CPU-hosted drivers run (`ks`, and `row`
            // where subgroups are missing); the others read the same accessors, so a
            // planar type, a K-quant and Q6_K check them (each is a pipeline to compile).
            let every = matches!(v, Variant::Ks | Variant::Row);
            let few = [GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q6_K];
            for ty in GPU_TYPES.into_iter().filter(|t| every || few.contains(t)) {
                let cols = if ty.block_size() == 256 { 512 } else { 96 };
                check(ctx, v, ty, 67, cols, 9, Columns::All);
                check(ctx, v, ty, 33, 4 * cols, 1, Columns::All);
                check(ctx, v, ty, 70, cols, 6, Columns::Last);
            }
            check_store(ctx, v, GgmlType::Q5_0, 67, 96, 13, Columns::All, Store::Add);
            check_fused(ctx, v, GgmlType::Q4_K, &[70, 33, 33], 512, 1);
            check_fused(ctx, v, GgmlType::Q4_K, &[65, 65], 512, 9);
        }
        let split = reopened(
            ctx,
            DeviceOptions {
                max_binding: Some(1024),
                weights: Some(memory),
                ..Default::default()
            },
        );
        for v in variants(&split) {
            for ty in [GgmlType::Q8_0, GgmlType::Q6_K] {
                let cols = if ty.block_size() == 256 { 256 } else { 64 };
                check(&split, v, ty, 301, cols, 2, Columns::All);
            }
        }
    }
}

#[test]
fn variants_with_few_storage_buffers() {
    // A device with GLES 3.1's 4 storage buffers per stage gets kernels with one output;
    // the store is shared by every variant, so three of them check it (on one adapter:
    // each is a pipeline of its own to compile).
    let ctx = &contexts()[0];
    let few = reopened(
        ctx,
        DeviceOptions {
            max_storage_buffers: Some(4),
            ..Default::default()
        },
    );
    assert!(!few.fused_outputs());
    for v in [Variant::Row, Variant::Win, Variant::Ks]
        .into_iter()
        .filter(|v| v.available(&few))
    {
        check(&few, v, GgmlType::Q4_K, 67, 512, 9, Columns::All);
    }
}

#[test]
fn mr_reduces_in_workgroup_memory_too() {
    // `mr` sums a row with `subgroupAdd` alone where a workgroup is one fixed-size
    // subgroup (lavapipe's 8 lanes, the other tests), else through workgroup memory:
    // that path here, on the same adapter.
    for ctx in contexts().iter().filter(|c| Variant::Mr.available(c)) {
        if ctx.fixed_subgroup().is_some() {
            assert!(mul_mat::mr_shape(ctx).1, "{}", label(ctx));
        }
        let tree = reopened(
            ctx,
            DeviceOptions {
                workgroup_reductions: true,
                ..Default::default()
            },
        );
        assert_eq!(mul_mat::mr_shape(&tree), (64, false));
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            // Rows that leave a partial workgroup of four, one token, a short tile and
            // a whole one with a remainder, and the last token alone.
            for (rows, cols, toks) in [(1, 256, 1), (67, 512, 5), (33, 2048, 2), (70, 768, 9)] {
                check(&tree, Variant::Mr, ty, rows, cols, toks, Columns::All);
            }
            check(&tree, Variant::Mr, ty, 70, 512, 6, Columns::Last);
        }
        check_fused(&tree, Variant::Mr, GgmlType::Q4_K, &[65, 65], 512, 9);
        // Few, long rows: two and four times the lanes, each walking two chunks or more.
        assert_eq!(mul_mat::mr_lanes(&tree, 33, 8192), (128, false));
        assert_eq!(mul_mat::mr_lanes(&tree, 9, 16384), (256, false));
        assert_eq!(mul_mat::mr_lanes(&tree, 9, 4096), (64, false));
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            for (rows, cols, toks) in [(33, 8192, 1), (9, 16384, 2), (33, 8192, 5)] {
                check(&tree, Variant::Mr, ty, rows, cols, toks, Columns::All);
            }
        }
    }
}

/// Batches of `mul_mat::MM_MIN` tokens or more, which `mr`, `wg` and `sg` run as the
/// tiled product (`mul_mat_mm`) where the device allows its workgroup: every type;
/// rows, tokens and chunks that leave partial tiles (an odd number of chunks leaves
/// half a step), the smallest such batch, a product added to its output, fused
/// outputs; weights in buffers and in textures, and on adapters without subgroups
/// (GL here) through `wg`.
#[test]
fn batches_run_tiled() {
    let mut ran = 0;
    for ctx in buffer_contexts().iter().chain(texture_contexts()) {
        if !mul_mat::mm_fits(ctx) {
            continue;
        }
        let tiled = [Variant::Mr, Variant::Wg, Variant::Sg];
        for v in tiled.into_iter().filter(|v| v.available(ctx)) {
            ran += 1;
            check_tiled(ctx, v);
        }
    }
    assert!(ran > 0, "no adapter ran the tiled product");
}

/// One [`batches_run_tiled`] adapter and variant.
fn check_tiled(ctx: &GpuContext, v: Variant) {
    let min = mul_mat::MM_MIN as usize;
    for ty in GPU_TYPES {
        let bs = ty.block_size();
        for (rows, cols, toks) in [
            (67, 96usize, min),
            (130, 256, 70),
            (1, 64, 17),
            (64, 576, 64),
        ] {
            let cols = cols.next_multiple_of(bs);
            check(ctx, v, ty, rows, cols, toks, Columns::All);
        }
        let shape = (ty, 65, 512usize.next_multiple_of(bs));
        check_x(
            ctx,
            v,
            shape,
            33,
            Columns::All,
            Store::Add,
            XBuffer::Storage,
        );
    }
    if ctx.fused_outputs() {
        check_fused(ctx, v, GgmlType::Q4_K, &[70, 33, 33], 512, 40);
        check_fused(ctx, v, GgmlType::Q8_0, &[65, 65], 640, min);
    }
}

/// Batches that `ks` runs through `mul_mat_ks1i` in tiles of eight (the integer-dotted
/// types, from `mul_mat::KS1I_EIGHT_MIN` tokens), their pipelines compiled on first use:
/// three and six chunks per lane, a last tile whose second four tokens are all padding
/// (66) or hold one token (69), whole tiles (the least such batch), and tiles of four
/// just below it; into a residual stream, into fused outputs, with the norm folded in.
#[test]
fn ks1i_tiles_of_eight() {
    let mut ran = 0;
    let min = mul_mat::KS1I_EIGHT_MIN as usize;
    for ctx in contexts() {
        if !Variant::Ks.available(ctx) {
            continue;
        }
        ran += 1;
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
        ] {
            for (rows, cols, toks) in [
                (67, 1536, 66),
                (33, 2048, 66),
                (19, 1792, min),
                (33, 576, 69),
                (33, 576, min),
                (33, 576, min - 1),
            ] {
                check(ctx, Variant::Ks, ty, rows, cols, toks, Columns::All);
            }
        }
        let add = (GgmlType::Q4_1, 67, 576);
        check_x(
            ctx,
            Variant::Ks,
            add,
            min + 3,
            Columns::All,
            Store::Add,
            XBuffer::Storage,
        );
        check_fused(
            ctx,
            Variant::Ks,
            GgmlType::Q5_0,
            &[70, 33, 33],
            576,
            min + 6,
        );
        if mul_mat::folds_norm(
            ctx,
            GgmlType::Q4_1,
            (70, 576),
            ctx.matrix_memory(GgmlType::Q4_1),
        ) {
            check_normed(
                ctx,
                GgmlType::Q4_1,
                &[70, 33, 33],
                576,
                min + 1,
                Columns::All,
            );
        }
    }
    assert!(
        ran > 0 || !lavapipe_here("ks1i_tiles_of_eight"),
        "no adapter ran ks"
    );
}

/// Q4_K, Q5_K and Q6_K batches in `mul_mat_ks1i`'s integer tiles: two, four, six and
/// eight slots a lane unpack their chunks in pairs (`CHUNK_PAIRS`: the K-quants' bytes
/// two chunks share), three one at a time; tiles of four and of eight (a last tile of
/// eight padded, or one token short of whole); into a residual stream, into fused
/// outputs, and with the norm folded in.
#[test]
fn k_quant_batches_in_integer_tiles() {
    let eight = mul_mat::KS1I_EIGHT_MIN as usize;
    let ctxs = ks1_contexts();
    for ctx in ctxs.iter().copied() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            let gw = upload(ctx, ty, 9, 2048, &weight(ty, 9, 2048, 3));
            let q8 = mul_mat::quantizes_batches(ctx, Variant::Ks, &gw, Columns::All);
            assert!(q8, "{ty} batches in integers on {}", label(ctx));
            for (rows, cols, toks) in [
                (33, 512, 9),
                (67, 1024, 8),
                (35, 768, 12),
                (19, 1536, eight + 2),
                (33, 2048, eight + 5),
                (33, 2048, eight),
                (17, 2048, eight - 1),
            ] {
                check(ctx, Variant::Ks, ty, rows, cols, toks, Columns::All);
            }
            check_store(
                ctx,
                Variant::Ks,
                ty,
                67,
                2048,
                eight + 2,
                Columns::All,
                Store::Add,
            );
            check_fused(ctx, Variant::Ks, ty, &[70, 33, 33], 2048, 9);
            if mul_mat::folds_norm(ctx, ty, (70, 2048), ctx.matrix_memory(ty)) {
                check_normed(ctx, ty, &[70, 33, 33], 2048, eight + 1, Columns::All);
            }
        }
    }
    assert!(
        !ctxs.is_empty() || !lavapipe_here("k_quant_batches_in_integer_tiles"),
        "no adapter ran ks"
    );
}

#[test]
fn window_fits_the_private_array() {
    for ty in GPU_TYPES {
        let w = Window::of(ty).expect("window");
        assert!(w.nv >= 1 && w.nv <= 16, "{ty}: {w:?}");
        assert!(
            w.chunks >= 1 && w.bytes as u64 + 15 + 4 <= 256,
            "{ty}: {w:?}"
        );
        // Whole blocks per window.
        let bs = ty.block_size() as u64;
        assert_eq!((w.chunks as u64 * 32) % bs, 0, "{ty}");
        assert_eq!(
            ty.row_bytes(w.chunks as u64 * 32),
            Some(w.bytes as u64),
            "{ty}"
        );
    }
}

#[test]
fn variant_names_round_trip() {
    for v in Variant::ALL {
        assert_eq!(Variant::parse(v.name()), Some(v));
        assert_eq!(Variant::parse(&v.name().to_uppercase()), Some(v));
    }
    assert_eq!(Variant::parse("nope"), None);
}

#[test]
fn subgroup_shaders_validate() {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let shaders = wgllm::gpu::shaders::all_with_subgroups();
    assert!(!shaders.is_empty());
    for (label, src) in &shaders {
        let module = naga::front::wgsl::parse_str(src)
            .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(src)));
        let mut v = Validator::new(
            ValidationFlags::all(),
            Capabilities::SHADER_FLOAT16_IN_FLOAT32 | Capabilities::SUBGROUP,
        );
        v.subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all());
        v.validate(&module)
            .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(src)));
    }
}
