//! Q5_1: 32 values, f16 scale and minimum, 5-bit quants: `value = q * d + m`.
//! Bit layout as Q5_0.

use super::block::{min_max, Block, Quantize};
use super::q5_0::{pack_q5, unpack_q5};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q5_1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Fifth bits, a little-endian u32: bit j belongs to element j.
    pub qh: [u8; 4],
    /// Low nibbles: byte j holds element j (low) and element j + 16 (high).
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const QK: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (o, q) in out.iter_mut().zip(unpack_q5(&self.qs, self.qh)) {
            *o = q as f32 * d + m;
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let (mut sum_qx, mut sum_x) = (0.0f32, 0.0f32);
        for (&q, &v) in unpack_q5(&self.qs, self.qh).iter().zip(x) {
            sum_qx += q as f32 * v;
            sum_x += v;
        }
        self.d.to_f32() * sum_qx + self.m.to_f32() * sum_x
    }
}

impl Quantize for BlockQ5_1 {
    /// `quantize_row_q5_1_ref`: 32 levels spread from min to max.
    fn quantize(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; 32];
        for (qi, &v) in q.iter_mut().zip(x) {
            *qi = (((v - min) * id + 0.5) as u8).min(31);
        }
        let (qs, qh) = pack_q5(&q);
        BlockQ5_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
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
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ5_1>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ5_1>();
        check_length_errors::<BlockQ5_1>();
    }
}
