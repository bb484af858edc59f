//! The block abstraction every quant family implements, and the row loops built on it.
//!
//! A row of a quantized tensor is a run of fixed-size blocks. Blocks in files are NOT
//! aligned (Q8_0 blocks are 34 bytes), so every block is copied out with
//! `bytemuck::pod_read_unaligned`; no slice is ever cast in place.

use super::GgmlType;
use crate::{Error, Result};

/// One block of a GGML tensor type: `#[repr(C)]`, byte-for-byte the ggml layout.
pub trait Block: bytemuck::Pod {
    /// The type this block belongs to.
    const TYPE: GgmlType;
    /// Elements per block.
    const QK: usize;

    /// Writes the block's `QK` values into `out` (`out.len() == QK`).
    fn dequantize(&self, out: &mut [f32]);

    /// Dot product of the block's values with `x` (`x.len() == QK`), computed in the
    /// factored form (scales applied to integer sums), not by dequantizing first.
    fn dot(&self, x: &[f32]) -> f32;
}

/// A block type that can be produced from f32 values, matching ggml's `quantize_row_*_ref`.
pub trait Quantize: Block {
    /// Quantizes exactly `QK` values (`x.len() == QK`).
    fn quantize(x: &[f32]) -> Self;
}

/// Iterates over the blocks of `bytes`, which must hold a whole number of blocks.
fn blocks<B: Block>(bytes: &[u8]) -> Result<impl Iterator<Item = B> + '_> {
    let size = std::mem::size_of::<B>();
    // A remainder, not `is_multiple_of`: the crate supports Rust 1.85.
    let partial = bytes.len() % size;
    if partial != 0 {
        return Err(Error::invalid(format!(
            "{}: {} bytes is not a whole number of {}-byte blocks",
            B::TYPE,
            bytes.len(),
            size
        )));
    }
    Ok(bytes
        .chunks_exact(size)
        .map(bytemuck::pod_read_unaligned::<B>))
}

/// Checks that `n_values` values fill exactly the blocks in `n_bytes` bytes.
fn check_values<B: Block>(n_bytes: usize, n_values: usize) -> Result<()> {
    let n_blocks = n_bytes / std::mem::size_of::<B>();
    match n_blocks.checked_mul(B::QK) {
        Some(n) if n == n_values => Ok(()),
        _ => Err(Error::invalid(format!(
            "{}: {} blocks hold {} values, but {} were given",
            B::TYPE,
            n_blocks,
            n_blocks.saturating_mul(B::QK),
            n_values
        ))),
    }
}

/// Dequantizes a run of whole blocks into `out` (`out.len() == n_blocks * QK`).
pub fn dequantize_row<B: Block>(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let it = blocks::<B>(bytes)?;
    check_values::<B>(bytes.len(), out.len())?;
    for (b, o) in it.zip(out.chunks_exact_mut(B::QK)) {
        b.dequantize(o);
    }
    Ok(())
}

/// Dot product of one row of whole blocks with `x` (`x.len() == n_blocks * QK`).
pub fn dot_row<B: Block>(row: &[u8], x: &[f32]) -> Result<f32> {
    let it = blocks::<B>(row)?;
    check_values::<B>(row.len(), x.len())?;
    Ok(it.zip(x.chunks_exact(B::QK)).map(|(b, xs)| b.dot(xs)).sum())
}

/// Quantizes `x` (a whole number of blocks) and appends the blocks' bytes to `out`.
pub fn quantize_row<B: Quantize>(x: &[f32], out: &mut Vec<u8>) -> Result<()> {
    let partial = x.len() % B::QK;
    if partial != 0 {
        return Err(Error::invalid(format!(
            "{}: {} values is not a whole number of {}-value blocks",
            B::TYPE,
            x.len(),
            B::QK
        )));
    }
    out.reserve(x.len() / B::QK * std::mem::size_of::<B>());
    for xs in x.chunks_exact(B::QK) {
        out.extend_from_slice(bytemuck::bytes_of(&B::quantize(xs)));
    }
    Ok(())
}

/// Round to nearest, ties to even, as ggml's `nearest_int` does (its float trick is exact
/// for |x| < 2^22, where it equals this).
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// The value of largest magnitude (the first one on ties), 0 for an empty or all-zero slice.
/// ggml's "signed max" that symmetric quantizers divide by, so the extreme maps to -nmax.
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Smallest and largest value, compared the way ggml does (`v < min`, `v > max`).
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Shared checks used by the unit tests of every family.
#[cfg(test)]
pub(crate) mod testutil {
    use super::*;

    /// ggml test-quantize-fns.cpp limits on its RMSE-like metric.
    pub const MAX_TOTAL_ERROR: f32 = 0.002;
    pub const MAX_TOTAL_ERROR_2BITS: f32 = 0.0075;
    pub const MAX_TOTAL_ERROR_3BITS: f32 = 0.0040;

    /// The test-quantize-fns.cpp test vector: `0.1 + 2 cos(i + offset)`, 4096 values.
    pub fn cos_wave(offset: f32) -> Vec<f32> {
        (0..32 * 128)
            .map(|i| (0.1 + 2.0 * ((i as f32) + offset).cos() as f64) as f32)
            .collect()
    }

    /// test-quantize-fns.cpp's `array_rmse`: sqrt(sum of squared errors) / n.
    pub fn ggml_rmse(a: &[f32], b: &[f32]) -> f32 {
        let sum: f64 = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| {
                let d = x as f64 - y as f64;
                d * d
            })
            .sum();
        (sum.sqrt() as f32) / a.len() as f32
    }

    /// Quantizes then dequantizes the cos wave; returns the ggml error metric.
    pub fn roundtrip_error<B: Quantize>() -> f32 {
        let x = cos_wave(0.0);
        let mut q = Vec::new();
        quantize_row::<B>(&x, &mut q).unwrap();
        assert_eq!(q.len(), x.len() / B::QK * std::mem::size_of::<B>());
        let mut y = vec![0.0; x.len()];
        dequantize_row::<B>(&q, &mut y).unwrap();
        ggml_rmse(&x, &y)
    }

    /// The factored dot product agrees with dequantize-then-dot on quantized cos-wave data.
    pub fn check_dot_matches_dequantize<B: Quantize>() {
        let w = cos_wave(0.0);
        let x = cos_wave(1.0);
        let mut q = Vec::new();
        quantize_row::<B>(&w, &mut q).unwrap();
        let mut deq = vec![0.0; w.len()];
        dequantize_row::<B>(&q, &mut deq).unwrap();
        let want: f64 = deq.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let scale: f64 = deq
            .iter()
            .zip(&x)
            .map(|(&a, &b)| (a * b).abs() as f64)
            .sum();
        let got = dot_row::<B>(&q, &x).unwrap() as f64;
        assert!(
            (got - want).abs() <= 1e-5 * scale + 1e-6,
            "{}: dot {got} vs dequantized dot {want}",
            B::TYPE
        );
        // ggml's dot-product error bound, per element, against the unquantized data.
        let exact: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let err = ((got - exact).abs() / w.len() as f64) as f32;
        assert!(err < 0.04, "{}: dot error {err}", B::TYPE);
    }

    /// Length checks reject partial blocks and mismatched outputs instead of panicking.
    pub fn check_length_errors<B: Quantize>() {
        let size = std::mem::size_of::<B>();
        let bytes = vec![0u8; 2 * size];
        let mut out = vec![0.0; 2 * B::QK];
        assert!(dequantize_row::<B>(&bytes, &mut out).is_ok());
        assert!(dequantize_row::<B>(&bytes[..2 * size - 1], &mut out).is_err());
        assert!(dequantize_row::<B>(&bytes, &mut out[..B::QK]).is_err());
        assert!(dot_row::<B>(&bytes, &out[1..]).is_err());
        let mut q = Vec::new();
        if B::QK > 1 {
            assert!(quantize_row::<B>(&out[1..], &mut q).is_err());
        }
    }
}
