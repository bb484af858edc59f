//! Q4_K: 256 values in 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min
//! (packed in 12 bytes) times the f16 `d` / `dmin`: `value = d * sc * q - dmin * m`,
//! q in 0..=15.

use super::block::{Block, Quantize};
use super::kquant::{quantize_k4_like, scale_min_k4, QK_K};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q4_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins of 6 bits (see [`scale_min_k4`]).
    pub scales: [u8; 12],
    /// Element 64k + l is the low nibble of byte 32k + l, element 64k + 32 + l the high.
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

impl BlockQ4K {
    /// The quants (0..=15) in element order.
    pub fn quants(&self) -> [u8; QK_K] {
        std::array::from_fn(|e| {
            let b = self.qs[32 * (e / 64) + e % 32];
            if (e / 32) % 2 == 0 {
                b & 0x0f
            } else {
                b >> 4
            }
        })
    }
}

/// Shared by Q4_K and Q5_K: `d * sc * q - dmin * m` per 32-value sub-block.
pub(crate) fn dequantize_k4_like(
    d: f16,
    dmin: f16,
    scales: &[u8; 12],
    q: &[u8; QK_K],
    out: &mut [f32],
) {
    let (d, dmin) = (d.to_f32(), dmin.to_f32());
    for (j, (o, qs)) in out.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
        let (sc, m) = scale_min_k4(j, scales);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        for (o, &q) in o.iter_mut().zip(qs) {
            *o = dl * q as f32 - ml;
        }
    }
}

/// Shared by Q4_K and Q5_K: the factored dot product.
pub(crate) fn dot_k4_like(d: f16, dmin: f16, scales: &[u8; 12], q: &[u8; QK_K], x: &[f32]) -> f32 {
    let (mut sum_q, mut sum_m) = (0.0f32, 0.0f32);
    for (j, (xs, qs)) in x.chunks_exact(32).zip(q.chunks_exact(32)).enumerate() {
        let (sc, m) = scale_min_k4(j, scales);
        let (mut qx, mut sx) = (0.0f32, 0.0f32);
        for (&v, &q) in xs.iter().zip(qs) {
            qx += q as f32 * v;
            sx += v;
        }
        sum_q += sc as f32 * qx;
        sum_m += m as f32 * sx;
    }
    d.to_f32() * sum_q - dmin.to_f32() * sum_m
}

impl Block for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const QK: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_k4_like(self.d, self.dmin, &self.scales, &self.quants(), out);
    }

    fn dot(&self, x: &[f32]) -> f32 {
        dot_k4_like(self.d, self.dmin, &self.scales, &self.quants(), x)
    }
}

impl Quantize for BlockQ4K {
    /// `quantize_row_q4_K_ref`.
    fn quantize(x: &[f32]) -> Self {
        let (d, dmin, scales, l) = quantize_k4_like(x, 15, -1.0, 0.1, 20);
        let qs = std::array::from_fn(|b| {
            let (k, i) = (b / 32, b % 32);
            l[64 * k + i] | (l[64 * k + 32 + i] << 4)
        });
        BlockQ4K {
            d,
            dmin,
            scales,
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::*;

    #[test]
    fn known_block() {
        let mut b = BlockQ4K::zeroed();
        b.d = f16::from_f32(0.5);
        b.dmin = f16::from_f32(0.25);
        b.scales[0] = 2; // sub-block 0 scale
        b.scales[4] = 4; // sub-block 0 min
        b.qs[0] = 0x3a; // element 0 -> 10, element 32 -> 3 (sub-block 1, scale 0)
        let mut out = [0.0; QK_K];
        b.dequantize(&mut out);
        assert_eq!(out[0], 0.5 * 2.0 * 10.0 - 0.25 * 4.0);
        assert_eq!(out[1], -1.0);
        assert_eq!(out[32], 0.0);
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ4K>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ4K>();
        check_length_errors::<BlockQ4K>();
    }
}
