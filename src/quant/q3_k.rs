//! Q3_K: 256 values in 16 sub-blocks of 16, each with a signed 6-bit scale (stored +32)
//! times the f16 `d`: `value = d * (sc - 32) * q`, q in -4..=3. The low 2 bits of q are
//! packed like Q2_K; the third bit is in `hmask`, and a CLEAR bit means "subtract 4".

use super::block::{nearest_int, Block, Quantize};
use super::kquant::{make_q3_quants, QK_K};
use super::q2_k::pack_2bit;
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q3_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bits: element e is bit e / 32 of byte e % 32.
    pub hmask: [u8; 32],
    /// Low 2 bits: element 128n + 32k + l is bits 2k..2k+2 of byte 32n + l.
    pub qs: [u8; 64],
    /// 16 scales of 6 bits: low nibbles in bytes 0..8 (scales 0..8 low, 8..16 high
    /// nibble), top 2 bits of scale j at bits 2(j/4) of byte 8 + j%4.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

impl BlockQ3K {
    /// The 16 sub-block scales, already minus 32.
    pub fn sub_scales(&self) -> [i8; 16] {
        std::array::from_fn(|j| {
            let low = if j < 8 {
                self.scales[j] & 0x0f
            } else {
                self.scales[j - 8] >> 4
            };
            let high = (self.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }

    /// The quants (-4..=3) in element order.
    pub fn quants(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| {
            let low = (self.qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
            let high = (self.hmask[e % 32] >> (e / 32)) & 1;
            low as i8 - if high != 0 { 0 } else { 4 }
        })
    }
}

impl Block for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const QK: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let sc = self.sub_scales();
        let q = self.quants();
        for (s, (o, qs)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * sc[s] as f32;
            for (o, &q) in o.iter_mut().zip(qs) {
                *o = dl * q as f32;
            }
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let sc = self.sub_scales();
        let q = self.quants();
        let mut sum = 0.0f32;
        for (s, (xs, qs)) in x.chunks_exact(16).zip(q.chunks_exact(16)).enumerate() {
            let qx: f32 = xs.iter().zip(qs).map(|(&v, &q)| q as f32 * v).sum();
            sum += sc[s] as f32 * qx;
        }
        sum * self.d.to_f32()
    }
}

impl Quantize for BlockQ3K {
    /// `quantize_row_q3_K_ref`.
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        let mut packed = [0u8; 12];
        let mut d = f16::ZERO;
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                // ggml stores the rounded value in an int8_t before clamping.
                let q = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    packed[j] = q & 0x0f;
                } else {
                    packed[j - 8] |= (q & 0x0f) << 4;
                }
                packed[8 + j % 4] |= (q >> 4) << (2 * (j / 4));
            }
            d = f16::from_f32(1.0 / iscale);
        }
        let block = BlockQ3K {
            hmask: [0; 32],
            qs: [0; 64],
            scales: packed,
            d,
        };
        // Requantize against the scales as they will be decoded; L holds q + 4.
        for (j, &sc) in block.sub_scales().iter().enumerate() {
            let dl = d.to_f32() * sc as f32;
            if dl == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / dl).clamp(-4, 3) + 4) as i8;
            }
        }
        let mut hmask = [0u8; 32];
        let mut low = [0u8; QK_K];
        for (e, &q) in l.iter().enumerate() {
            let mut q = q as u8;
            if q > 3 {
                hmask[e % 32] |= 1 << (e / 32);
                q -= 4;
            }
            low[e] = q;
        }
        BlockQ3K {
            hmask,
            qs: pack_2bit(&low),
            ..block
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::*;

    #[test]
    fn scale_unpack_known_bytes() {
        let mut b = BlockQ3K::zeroed();
        b.scales[0] = 0x5a; // scale 0 low nibble 0xa, scale 8 low nibble 0x5
        b.scales[8] = 0b10_00_00_11; // scale 0 top bits 3, scale 12 top bits 2
        let s = b.sub_scales();
        assert_eq!(s[0], 0x3a - 32);
        assert_eq!(s[8], 0x05 - 32);
        assert_eq!(s[12], 0x20 - 32);
        assert_eq!(s[1], -32);
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ3K>() < MAX_TOTAL_ERROR_3BITS);
        check_dot_matches_dequantize::<BlockQ3K>();
        check_length_errors::<BlockQ3K>();
    }
}
