//! Q5_0: 32 values, one f16 scale, 5-bit quants offset by 16: `value = (q - 16) * d`.
//! The low 4 bits live in nibbles like Q4_0; bit 4 of element j is bit j of `qh`.

use super::block::{signed_absmax, Block, Quantize};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Mirrors ggml-common.h `block_q5_0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits, a little-endian u32: bit j belongs to element j.
    pub qh: [u8; 4],
    /// Low nibbles: byte j holds element j (low) and element j + 16 (high).
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// Unpacks 5-bit quants (0..=31) from the nibbles and the high-bit word.
pub(crate) fn unpack_q5(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; 32];
    for (j, &b) in qs.iter().enumerate() {
        q[j] = (b & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (b >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Packs 5-bit quants into nibbles and the high-bit word.
pub(crate) fn pack_q5(q: &[u8; 32]) -> ([u8; 16], [u8; 4]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4);
        qh |= u32::from((q[j] >> 4) & 1) << j;
        qh |= u32::from((q[j + 16] >> 4) & 1) << (j + 16);
    }
    (qs, qh.to_le_bytes())
}

impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const QK: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, q) in out.iter_mut().zip(unpack_q5(&self.qs, self.qh)) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let q = unpack_q5(&self.qs, self.qh);
        let sum: f32 = q
            .iter()
            .zip(x)
            .map(|(&q, &v)| (q as i32 - 16) as f32 * v)
            .sum();
        sum * self.d.to_f32()
    }
}

impl Quantize for BlockQ5_0 {
    /// `quantize_row_q5_0_ref`: the extreme value maps to -16.
    fn quantize(x: &[f32]) -> Self {
        let d = signed_absmax(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; 32];
        for (qi, &v) in q.iter_mut().zip(x) {
            *qi = ((v * id + 16.5) as i8).min(31) as u8;
        }
        let (qs, qh) = pack_q5(&q);
        BlockQ5_0 {
            d: f16::from_f32(d),
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
    fn pack_unpack_inverse() {
        let q: [u8; 32] = std::array::from_fn(|i| ((i * 7 + 3) % 32) as u8);
        let (qs, qh) = pack_q5(&q);
        assert_eq!(unpack_q5(&qs, qh), q);
    }

    #[test]
    fn quantize_roundtrip_and_dot() {
        assert!(roundtrip_error::<BlockQ5_0>() < MAX_TOTAL_ERROR);
        check_dot_matches_dequantize::<BlockQ5_0>();
        check_length_errors::<BlockQ5_0>();
    }
}
