//! Q8_0: 32 values, one f16 scale, signed 8-bit quants: `value = q * d`.

use super::block::{Block, Quantize};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q8_0` (34 bytes, so blocks in a file are unaligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants in element order.
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// Symmetric 8-bit quantization shared by Q8_0 and Q8_1: returns the f32 scale
/// (before f16 rounding) and the quants. `roundf` rounds halves away from zero.
pub(crate) fn quantize_q8(x: &[f32]) -> (f32, [i8; 32]) {
    let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    (d, qs)
}

impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const QK: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let sum: f32 = self.qs.iter().zip(x).map(|(&q, &v)| q as f32 * v).sum();
        sum * self.d.to_f32()
    }
}

impl Quantize for BlockQ8_0 {
    /// `quantize_row_q8_0_ref`.
    fn quantize(x: &[f32]) -> Self {
        let (d, qs) = quantize_q8(x);
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::super::block::{dequantize_row, quantize_row};
    use super::*;

    #[test]
    fn unaligned_blocks_read() {
        // Two blocks starting at an odd offset: no aligned cast is possible.
        let x: Vec<f32> = (0..64).map(|i| i as f32 - 31.5).collect();
        let mut q = vec![0u8];
        quantize_row::<BlockQ8_0>(&x, &mut q).unwrap();
        let mut out = vec![0.0; 64];
        dequantize_row::<BlockQ8_0>(&q[1..], &mut out).unwrap();
        for (a, b) in x.iter().zip(&out) {
            assert!((a - b).abs() < 0.15, "{a} {b}");
        }
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ8_0>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ8_0>();
        check_length_errors::<BlockQ8_0>();
    }
}
