//! Q8_1: Q8_0 plus `s = d * sum(q)`, used to quantize activations for dots with
//! Q4_1 / Q5_1 weights (the minimum term needs the activations' sum).

use super::block::{Block, Quantize};
use super::q8_0::quantize_q8;
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q8_1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`, with `d` before its f16 rounding.
    pub s: f16,
    /// Quants in element order.
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

impl Block for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
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

impl Quantize for BlockQ8_1 {
    /// `quantize_row_q8_1_ref`.
    fn quantize(x: &[f32]) -> Self {
        let (d, qs) = quantize_q8(x);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        BlockQ8_1 {
            d: f16::from_f32(d),
            s: f16::from_f32(sum as f32 * d),
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::super::q8_0::BlockQ8_0;
    use super::*;

    #[test]
    fn same_quants_as_q8_0_plus_sum() {
        let x = cos_wave(0.3);
        for xs in x.chunks_exact(32) {
            let a = BlockQ8_1::quantize(xs);
            let b = BlockQ8_0::quantize(xs);
            assert_eq!(a.d.to_bits(), b.d.to_bits());
            assert_eq!(a.qs, b.qs);
            let sum: i32 = a.qs.iter().map(|&q| q as i32).sum();
            let d = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            assert_eq!(a.s.to_bits(), f16::from_f32(sum as f32 * d).to_bits());
        }
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ8_1>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ8_1>();
        check_length_errors::<BlockQ8_1>();
    }
}
