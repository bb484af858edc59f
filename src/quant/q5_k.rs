//! Q5_K: Q4_K's scales with 5-bit quants; bit 4 of element 32j + l is bit j of `qh[l]`.

use super::block::{Block, Quantize};
use super::kquant::{quantize_k4_like, QK_K};
use super::q4_k::{dequantize_k4_like, dot_k4_like};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q5_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins of 6 bits (see `kquant::scale_min_k4`).
    pub scales: [u8; 12],
    /// Fifth bits: element e is bit e / 32 of byte e % 32.
    pub qh: [u8; 32],
    /// Low nibbles, laid out as Q4_K's `qs`.
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl BlockQ5K {
    /// The quants (0..=31) in element order.
    pub fn quants(&self) -> [u8; QK_K] {
        std::array::from_fn(|e| {
            let b = self.qs[32 * (e / 64) + e % 32];
            let low = if (e / 32) % 2 == 0 { b & 0x0f } else { b >> 4 };
            low | (((self.qh[e % 32] >> (e / 32)) & 1) << 4)
        })
    }
}

impl Block for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const QK: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_k4_like(self.d, self.dmin, &self.scales, &self.quants(), out);
    }

    fn dot(&self, x: &[f32]) -> f32 {
        dot_k4_like(self.d, self.dmin, &self.scales, &self.quants(), x)
    }
}

impl Quantize for BlockQ5K {
    /// `quantize_row_q5_K_ref`.
    fn quantize(x: &[f32]) -> Self {
        let (d, dmin, scales, l) = quantize_k4_like(x, 31, -0.5, 0.1, 15);
        let mut qh = [0u8; 32];
        for (e, &q) in l.iter().enumerate() {
            qh[e % 32] |= ((q >> 4) & 1) << (e / 32);
        }
        let qs = std::array::from_fn(|b| {
            let (k, i) = (b / 32, b % 32);
            (l[64 * k + i] & 0x0f) | ((l[64 * k + 32 + i] & 0x0f) << 4)
        });
        BlockQ5K {
            d,
            dmin,
            scales,
            qh,
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::*;

    #[test]
    fn high_bit_position() {
        let mut b = BlockQ5K::zeroed();
        b.qh[3] = 1 << 5; // element 5 * 32 + 3
        let q = b.quants();
        assert_eq!(q[163], 16);
        assert_eq!(q.iter().filter(|&&v| v != 0).count(), 1);
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ5K>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ5K>();
        check_length_errors::<BlockQ5K>();
    }
}
