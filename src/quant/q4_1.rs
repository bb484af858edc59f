//! Q4_1: 32 values, f16 scale `d` and minimum `m`, 4-bit quants: `value = q * d + m`.

use super::block::{min_max, Block, Quantize};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q4_1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (added after scaling).
    pub m: f16,
    /// Byte j: element j in the low nibble, element j + 16 in the high nibble.
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

impl BlockQ4_1 {
    /// The quants (0..=15) in element order.
    pub fn quants(&self) -> [u8; 32] {
        let mut q = [0u8; 32];
        for (j, &b) in self.qs.iter().enumerate() {
            q[j] = b & 0x0f;
            q[j + 16] = b >> 4;
        }
        q
    }
}

impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const QK: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (o, q) in out.iter_mut().zip(self.quants()) {
            *o = q as f32 * d + m;
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let (mut sum_qx, mut sum_x) = (0.0f32, 0.0f32);
        for (&q, &v) in self.quants().iter().zip(x) {
            sum_qx += q as f32 * v;
            sum_x += v;
        }
        self.d.to_f32() * sum_qx + self.m.to_f32() * sum_x
    }
}

impl Quantize for BlockQ4_1 {
    /// `quantize_row_q4_1_ref`: 16 levels spread from min to max.
    fn quantize(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        let mut qs = [0u8; 16];
        for (j, b) in qs.iter_mut().enumerate() {
            *b = q(x[j]) | (q(x[j + 16]) << 4);
        }
        BlockQ4_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::*;

    #[test]
    fn constant_block_is_exact() {
        let x = [1.25f32; 32];
        let b = BlockQ4_1::quantize(&x);
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        assert_eq!(out, x);
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ4_1>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ4_1>();
        check_length_errors::<BlockQ4_1>();
    }
}
