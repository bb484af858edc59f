//! Q2_K: 256 values in 16 sub-blocks of 16. Each sub-block has a 4-bit scale and a
//! 4-bit min, themselves scaled by the f16 `d` and `dmin`:
//! `value = d * sc * q - dmin * m`, q in 0..=3.

use super::block::{nearest_int, Block, Quantize};
use super::kquant::{make_qkx2_quants, QK_K};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q2_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Sub-block j: scale in the low nibble, min in the high nibble.
    pub scales: [u8; 16],
    /// 2-bit quants: element 128n + 32k + l is bits 2k..2k+2 of byte 32n + l.
    pub qs: [u8; 64],
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

impl BlockQ2K {
    /// The quants (0..=3) in element order.
    pub fn quants(&self) -> [u8; QK_K] {
        std::array::from_fn(|e| (self.qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3)
    }
}

/// Packs 2-bit quants in Q2_K / Q3_K order (4 per byte, strided by 32).
pub(crate) fn pack_2bit(l: &[u8; QK_K]) -> [u8; 64] {
    std::array::from_fn(|b| {
        let (n, i) = (b / 32, b % 32);
        let at = |k: usize| l[128 * n + 32 * k + i] << (2 * k);
        at(0) | at(1) | at(2) | at(3)
    })
}

impl Block for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const QK: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let q = self.quants();
        for (s, (o, qs)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * (self.scales[s] & 0x0f) as f32;
            let ml = dmin * (self.scales[s] >> 4) as f32;
            for (o, &q) in o.iter_mut().zip(qs) {
                *o = dl * q as f32 - ml;
            }
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let q = self.quants();
        let mut sum = 0.0f32;
        for (s, (xs, qs)) in x.chunks_exact(16).zip(q.chunks_exact(16)).enumerate() {
            let (mut qx, mut sx) = (0.0f32, 0.0f32);
            for (&v, &q) in xs.iter().zip(qs) {
                qx += q as f32 * v;
                sx += v;
            }
            sum +=
                d * (self.scales[s] & 0x0f) as f32 * qx - dmin * (self.scales[s] >> 4) as f32 * sx;
        }
        sum
    }
}

impl Quantize for BlockQ2K {
    /// `quantize_row_q2_K_ref`.
    fn quantize(x: &[f32]) -> Self {
        const Q4SCALE: f32 = 15.0;
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let weights: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
            let (s, m) = make_qkx2_quants(
                3,
                xs,
                &weights,
                &mut l[16 * j..16 * j + 16],
                -0.5,
                0.1,
                15,
                true,
            );
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let mut packed = [0u8; 16];
        let mut d = f16::ZERO;
        let mut dmin = f16::ZERO;
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (p, &s) in packed.iter_mut().zip(&scales) {
                *p = nearest_int(iscale * s) as u8;
            }
            d = f16::from_f32(max_scale / Q4SCALE);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (p, &m) in packed.iter_mut().zip(&mins) {
                *p |= (nearest_int(iscale * m) as u8) << 4;
            }
            dmin = f16::from_f32(max_min / Q4SCALE);
        }
        // Requantize against the scales as they will be decoded.
        for (j, &sc) in packed.iter().enumerate() {
            let dl = d.to_f32() * (sc & 0x0f) as f32;
            if dl == 0.0 {
                continue;
            }
            let dm = dmin.to_f32() * (sc >> 4) as f32;
            for i in 16 * j..16 * j + 16 {
                l[i] = nearest_int((x[i] + dm) / dl).clamp(0, 3) as u8;
            }
        }
        BlockQ2K {
            scales: packed,
            qs: pack_2bit(&l),
            d,
            dmin,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::*;

    #[test]
    fn pack_matches_unpack() {
        let l: [u8; QK_K] = std::array::from_fn(|i| ((i * 5 + i / 7) % 4) as u8);
        let b = BlockQ2K {
            scales: [0; 16],
            qs: pack_2bit(&l),
            d: f16::ZERO,
            dmin: f16::ZERO,
        };
        assert_eq!(b.quants(), l);
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ2K>() < MAX_TOTAL_ERROR_2BITS);
        check_dot_matches_dequantize::<BlockQ2K>();
        check_length_errors::<BlockQ2K>();
    }
}
