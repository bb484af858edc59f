//! Q6_K: 256 values in 16 sub-blocks of 16, each with a signed 8-bit scale times the
//! f16 `d`: `value = d * sc * q`, q in -32..=31 (stored +32 as 4 low + 2 high bits).

use super::block::{nearest_int, Block, Quantize};
use super::kquant::{make_qx_quants, QK_K};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q6_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits. In each 128-value half n: element 128n + l (l < 64) is the low nibble
    /// of byte 64n + l, element 128n + 64 + l the high nibble.
    pub ql: [u8; 128],
    /// High 2 bits: element 128n + 32k + l is bits 2k..2k+2 of byte 32n + l.
    pub qh: [u8; 64],
    /// Sub-block scales.
    pub scales: [i8; 16],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockQ6K {
    /// The quants (-32..=31) in element order.
    pub fn quants(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| {
            let (n, r) = (e / 128, e % 128);
            let b = self.ql[64 * n + r % 64];
            let low = if r < 64 { b & 0x0f } else { b >> 4 };
            let high = (self.qh[32 * n + r % 32] >> (2 * (r / 32))) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }
}

impl Block for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const QK: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let q = self.quants();
        for (s, (o, qs)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * self.scales[s] as f32;
            for (o, &q) in o.iter_mut().zip(qs) {
                *o = dl * q as f32;
            }
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let q = self.quants();
        let mut sum = 0.0f32;
        for (s, (xs, qs)) in x.chunks_exact(16).zip(q.chunks_exact(16)).enumerate() {
            let qx: f32 = xs.iter().zip(qs).map(|(&v, &q)| q as f32 * v).sum();
            sum += self.scales[s] as f32 * qx;
        }
        sum * self.d.to_f32()
    }
}

impl Quantize for BlockQ6K {
    /// `quantize_row_q6_K_ref`.
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_qx_quants(32, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            if scales[j].abs() > max_abs {
                max_abs = scales[j].abs();
                max_scale = scales[j];
            }
        }
        if max_abs < 1e-15 {
            return BlockQ6K::zeroed();
        }
        let iscale = -128.0 / max_scale;
        let d = f16::from_f32(1.0 / iscale);
        let sc: [i8; 16] = std::array::from_fn(|j| nearest_int(iscale * scales[j]).min(127) as i8);
        // Requantize against the scales as they will be decoded; L holds q + 32.
        for (j, &s) in sc.iter().enumerate() {
            let dl = d.to_f32() * s as f32;
            if dl == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / dl).clamp(-32, 31) + 32) as i8;
            }
        }
        let mut ql = [0u8; 128];
        let mut qh = [0u8; 64];
        for (e, &q) in l.iter().enumerate() {
            let q = q as u8;
            let (n, r) = (e / 128, e % 128);
            ql[64 * n + r % 64] |= (q & 0x0f) << (4 * (r / 64));
            qh[32 * n + r % 32] |= (q >> 4) << (2 * (r / 32));
        }
        BlockQ6K {
            ql,
            qh,
            scales: sc,
            d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::*;

    #[test]
    fn known_block() {
        let mut b = BlockQ6K::zeroed();
        b.d = f16::from_f32(0.25);
        b.scales = [2; 16];
        b.scales[4] = -3;
        b.ql[0] = 0x31; // element 0 low 1, element 64 low 3
        b.qh[0] = 0b11_00_00_10; // element 0 high 2, element 96 high 3
        let q = b.quants();
        assert_eq!(q[0], 0x21 - 32);
        assert_eq!(q[64], 3 - 32);
        assert_eq!(q[96], 0x30 - 32);
        let mut out = [0.0; QK_K];
        b.dequantize(&mut out);
        assert_eq!(out[0], 0.25 * 2.0 * 1.0);
        assert_eq!(out[64], 0.25 * -3.0 * -29.0);
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ6K>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ6K>();
        check_length_errors::<BlockQ6K>();
    }
}
