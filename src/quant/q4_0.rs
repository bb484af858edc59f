//! Q4_0: 32 values, one f16 scale `d`, 4-bit quants `q` stored offset by 8:
//! `value = (q - 8) * d`.

use super::block::{signed_absmax, Block, Quantize};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q4_0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Byte j: element j in the low nibble, element j + 16 in the high nibble.
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

impl BlockQ4_0 {
    /// The signed quants (-8..=7) in element order.
    pub fn quants(&self) -> [i8; 32] {
        let mut q = [0i8; 32];
        for (j, &b) in self.qs.iter().enumerate() {
            q[j] = (b & 0x0f) as i8 - 8;
            q[j + 16] = (b >> 4) as i8 - 8;
        }
        q
    }
}

impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const QK: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, q) in out.iter_mut().zip(self.quants()) {
            *o = q as f32 * d;
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let sum: f32 = self
            .quants()
            .iter()
            .zip(x)
            .map(|(&q, &v)| q as f32 * v)
            .sum();
        sum * self.d.to_f32()
    }
}

impl Quantize for BlockQ4_0 {
    /// `quantize_row_q4_0_ref`: the extreme value maps to -8.
    fn quantize(x: &[f32]) -> Self {
        let d = signed_absmax(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // Truncation after +8.5 rounds to nearest; 16 (the +extreme) clamps to 15.
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        let mut qs = [0u8; 16];
        for (j, b) in qs.iter_mut().enumerate() {
            *b = q(x[j]) | (q(x[j + 16]) << 4);
        }
        BlockQ4_0 {
            d: f16::from_f32(d),
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::*;

    #[test]
    fn layout_and_known_block() {
        let mut bytes = vec![0u8; 18];
        bytes[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        bytes[2] = 0xf0; // element 0 -> q 0 (-8), element 16 -> q 15 (+7)
        let b: BlockQ4_0 = bytemuck::pod_read_unaligned(&bytes);
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        assert_eq!(out[0], -4.0);
        assert_eq!(out[16], 3.5);
        assert_eq!(out[1], -4.0); // nibble 0 everywhere else
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ4_0>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ4_0>();
        check_length_errors::<BlockQ4_0>();
    }
}
