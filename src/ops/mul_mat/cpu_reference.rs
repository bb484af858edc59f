//! The CPU references the kernels are tested against: the float product, and the one
//! of `mul_mat_ks1i`, whose batches quantize their activations to 8 bits.

use super::*;

/// Whether steps of more than one token of a product of `w` over `cols`, run as
/// variant `v`, quantize their activations to 8 bits (`mul_mat_ks1i`, [`ks1_int`]):
/// their reference is then [`reference_q8`].
pub fn quantizes_batches(ctx: &GpuContext, v: Variant, w: &GpuTensor, cols: Columns) -> bool {
    let (ty, n_cols) = (w.ty, w.n_cols());
    batch_variant(ctx, v, w, cols).is_some_and(|v| ks1_tiles_run(ctx, v, ty, n_cols) && ks1_int(ty))
}

/// Whether steps of more than one token of a product of `w` over `cols`, run as
/// variant `v`, walk the columns in slices ([`ks1_slices`]), each slice's tiles adding
/// into the output.
pub fn batches_in_slices(ctx: &GpuContext, v: Variant, w: &GpuTensor, cols: Columns) -> bool {
    batch_variant(ctx, v, w, cols).is_some_and(|v| ks1_slices(ctx, v, w.ty, w.n_cols()).is_some())
}

/// Whether single tokens of a product of `w`, run as variant `v`, walk its rows in
/// slices of the columns ([`ks1_token_slices`]).
pub fn tokens_in_slices(ctx: &GpuContext, v: Variant, w: &GpuTensor) -> bool {
    let n_cols = w.n_cols();
    let v = resolve(ctx, v, w.ty, n_cols, w.memory);
    matches!(v, Ok(Variant::Ks | Variant::KsU))
        && ks1_token_slices(ctx, w.ty, n_cols / 32).is_some()
}

/// The walk of a row (the region of `row_dot` in ops/mul_mat_ks1.wgsl that its build
/// keeps: `kblock`, `pairs`, `fields` or `plain`) that single tokens of a plain product
/// of `w` take, where variant `v` runs them in `mul_mat_ks1`; `None` where it does not.
pub fn single_token_walk(ctx: &GpuContext, v: Variant, w: &GpuTensor) -> Option<&'static str> {
    let (ty, n_cols) = (w.ty, w.n_cols());
    let v = resolve(ctx, v, ty, n_cols, w.memory).ok()?;
    let v = for_product(ctx, v, (w.n_rows(), n_cols), Columns::All);
    if !matches!(v, Variant::Ks | Variant::KsU) || !ks1_fits(ctx, v, ty, n_cols) {
        return None;
    }
    let k = Ks1::token(ctx, ty, n_cols, (false, true, false));
    Some(build::RowDot::of(ctx, ty, k).region())
}

/// The variant a batch of every token of a product of `w` runs as, where that is `Ks`
/// (the only one whose batches run `mul_mat_ks1`'s tiles).
fn batch_variant(ctx: &GpuContext, v: Variant, w: &GpuTensor, cols: Columns) -> Option<Variant> {
    let n_cols = w.n_cols();
    let v = resolve(ctx, v, w.ty, n_cols, w.memory).ok()?;
    let v = for_product(ctx, v, (w.n_rows(), n_cols), cols);
    (cols == Columns::All && v == Variant::Ks).then_some(v)
}

/// [`quantizes_batches`] for the variant [`gpu`] runs.
pub fn gpu_quantizes_batches(ctx: &GpuContext, w: &GpuTensor, cols: Columns) -> Result<bool> {
    Ok(quantizes_batches(ctx, variant(ctx, w.ty)?, w, cols))
}

/// CPU reference: y[t * n_rows + r] = dequant(W row r) . x[t * n_cols ..].
pub fn reference(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    let row_bytes = whole_row_bytes(ty, n_cols)?;
    let mut row = vec![0f32; n_cols];
    for r in 0..n_rows {
        crate::quant::dequantize(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut row)?;
        for t in 0..n_tokens {
            let xs = &x[t * n_cols..(t + 1) * n_cols];
            let s: f64 = row.iter().zip(xs).map(|(a, b)| *a as f64 * *b as f64).sum();
            y[t * n_rows + r] = s as f32;
        }
    }
    Ok(())
}

/// The CPU reference of `mul_mat_ks1i`: [`reference`] with each token's activations
/// quantized per chunk of 32 as the kernel does (ggml's Q8_0 / Q8_1: scale absmax / 127
/// kept as an f16, quants rounded half to even), and the offset of Q4_1 / Q5_1 and the K-quants'
/// weights multiplying the Q8_1 sum (`s`, the quants' sum times the scale, as an f16)
/// as ggml's dot products do for Q4_1 and Q5_1 ([`chunk_offsets`]).
pub fn reference_q8(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    use half::f16;
    let row_bytes = whole_row_bytes(ty, n_cols)?;
    // Per token and chunk: the dequantized activations, and s less their sum.
    let mut xq = vec![0f32; n_cols * n_tokens];
    let mut s_err = vec![0f64; n_cols / 32 * n_tokens];
    for (c, (xs, xo)) in x.chunks_exact(32).zip(xq.chunks_exact_mut(32)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let d16 = f16::from_f32(d).to_f32();
        let mut sum = 0i32;
        for (o, v) in xo.iter_mut().zip(xs) {
            let q = (v * id).round_ties_even() as i32;
            sum += q;
            *o = q as f32 * d16;
        }
        let s = f16::from_f32(sum as f32 * d).to_f32() as f64;
        s_err[c] = s - sum as f64 * d16 as f64;
    }
    reference(ty, w, n_rows, n_cols, &xq, n_tokens, y)?;
    // The offset multiplies s where the dequantized activations' sum stood.
    for r in 0..n_rows {
        let Some(offsets) = chunk_offsets(ty, &w[r * row_bytes..(r + 1) * row_bytes]) else {
            break;
        };
        for t in 0..n_tokens {
            let errs = &s_err[t * (n_cols / 32)..(t + 1) * (n_cols / 32)];
            let fix: f64 = offsets.iter().zip(errs).map(|(m, e)| m * e).sum();
            y[t * n_rows + r] += fix as f32;
        }
    }
    Ok(())
}

/// The offset of each chunk of 32 of a row of `ty`, whose element j is d q_j + m:
/// Q4_1 and Q5_1's m (their blocks start with the f16 d and m), Q4_K's and Q5_K's -dmin
/// times the sub-block's 6-bit min. `None` for the types without one.
fn chunk_offsets(ty: GgmlType, row: &[u8]) -> Option<Vec<f64>> {
    use half::f16;
    let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f64();
    let blocks = row.chunks_exact(ty.type_size());
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 => Some(blocks.map(|b| f16_at(b, 2)).collect()),
        GgmlType::Q4_K | GgmlType::Q5_K => Some(
            blocks
                .flat_map(|b| {
                    let dmin = f16_at(b, 2);
                    let scales: [u8; 12] = std::array::from_fn(|i| b[4 + i]);
                    (0..8).map(move |j| {
                        -dmin * crate::quant::kquant::scale_min_k4(j, &scales).1 as f64
                    })
                })
                .collect(),
        ),
        _ => None,
    }
}

/// Bytes of a row of `n_cols` elements of `ty`, which must be whole blocks.
fn whole_row_bytes(ty: GgmlType, n_cols: usize) -> Result<usize> {
    let bytes = ty
        .row_bytes(n_cols as u64)
        .ok_or_else(|| Error::invalid("row is not whole blocks"))?;
    Ok(bytes as usize)
}
