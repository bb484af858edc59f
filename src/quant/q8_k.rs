//! Q8_K: 256 activations quantized to i8 with an f32 scale, plus sums of each 16 quants
//! (used to apply K-quant mins without touching every quant). Activations only.

use super::block::{nearest_int, Block, Quantize};
use super::kquant::QK_K;
use super::GgmlType;
use bytemuck::{Pod, Zeroable};

/// Mirrors ggml-common.h `block_q8_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Scale (f32, unlike the other formats).
    pub d: f32,
    /// Quants in element order.
    pub qs: [i8; QK_K],
    /// Sum of each group of 16 quants.
    pub bsums: [i16; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl Block for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;
    const QK: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = self.d * q as f32;
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let sum: f32 = self.qs.iter().zip(x).map(|(&q, &v)| q as f32 * v).sum();
        sum * self.d
    }
}

impl Quantize for BlockQ8K {
    /// `quantize_row_q8_K_ref`: the extreme value maps to -127.
    fn quantize(x: &[f32]) -> Self {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            return BlockQ8K::zeroed();
        }
        let iscale = -127.0 / max;
        let qs: [i8; QK_K] = std::array::from_fn(|j| nearest_int(iscale * x[j]).min(127) as i8);
        let bsums =
            std::array::from_fn(|g| qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum());
        BlockQ8K {
            d: 1.0 / iscale,
            qs,
            bsums,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::*;

    #[test]
    fn extreme_maps_to_127_and_sums() {
        let mut x = cos_wave(0.0)[..QK_K].to_vec();
        x[7] = -5.0;
        let b = BlockQ8K::quantize(&x);
        assert_eq!(b.qs[7], -127);
        assert!((b.d - 5.0 / 127.0).abs() < 1e-7);
        for g in 0..16 {
            let s: i32 = b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(b.bsums[g] as i32, s);
        }
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ8K>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ8K>();
        check_length_errors::<BlockQ8K>();
    }
}
