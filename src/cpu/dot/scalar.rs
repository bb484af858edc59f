//! Portable dot products: blocks decoded with the quant module's block types, integer
//! sums per block, one float multiply-add per block (per sub-block for K-quants).

use super::DotFn;
use crate::quant::kquant::{scale_min_k4, QK_K};
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_1::BlockQ8_1;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::{
    bf16_to_f32, f16_to_f32, q2_k::BlockQ2K, q3_k::BlockQ3K, q4_k::BlockQ4K, q5_k::BlockQ5K,
    q6_k::BlockQ6K, GgmlType,
};
use crate::{Error, Result};
use bytemuck::{pod_read_unaligned, Pod};

pub fn kernel(ty: GgmlType) -> Result<DotFn> {
    use GgmlType::*;
    Ok(match ty {
        F32 => dot_f32,
        F16 => dot_f16,
        BF16 => dot_bf16,
        Q4_0 => q4_0,
        Q4_1 => q4_1,
        Q5_0 => q5_0,
        Q5_1 => q5_1,
        Q8_0 => q8_0,
        Q2_K => q2_k,
        Q3_K => q3_k,
        Q4_K => q4_k,
        Q5_K => q5_k,
        Q6_K => q6_k,
        Q8_1 | Q8_K => {
            return Err(Error::Unsupported(format!(
                "no CPU dot product for {ty} weights"
            )))
        }
    })
}

/// Pairs of (weight block, activation block), as many as both rows hold.
fn pairs<'a, W: Pod, A: Pod>(w: &'a [u8], a: &'a [u8]) -> impl Iterator<Item = (W, A)> + 'a {
    w.chunks_exact(std::mem::size_of::<W>())
        .zip(a.chunks_exact(std::mem::size_of::<A>()))
        .map(|(w, a)| (pod_read_unaligned::<W>(w), pod_read_unaligned::<A>(a)))
}

fn idot<T: Copy + Into<i32>>(q: &[T], a: &[i8]) -> i32 {
    q.iter().zip(a).map(|(&q, &a)| q.into() * a as i32).sum()
}

fn f32s(a: &[u8]) -> impl Iterator<Item = f32> + '_ {
    a.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

pub fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    f32s(w).zip(f32s(a)).map(|(w, a)| w * a).sum()
}

pub fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    w.chunks_exact(2)
        .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
        .zip(f32s(a))
        .map(|(w, a)| w * a)
        .sum()
}

pub fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    w.chunks_exact(2)
        .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
        .zip(f32s(a))
        .map(|(w, a)| w * a)
        .sum()
}

pub fn q4_0(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ4_0, BlockQ8_0>(w, a)
        .map(|(w, a)| idot(&w.quants(), &a.qs) as f32 * w.d.to_f32() * a.d.to_f32())
        .sum()
}

pub fn q4_1(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ4_1, BlockQ8_1>(w, a)
        .map(|(w, a)| {
            idot(&w.quants(), &a.qs) as f32 * w.d.to_f32() * a.d.to_f32()
                + w.m.to_f32() * a.s.to_f32()
        })
        .sum()
}

pub fn q5_0(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ5_0, BlockQ8_0>(w, a)
        .map(|(w, a)| {
            let q = crate::quant::q5_0::unpack_q5(&w.qs, w.qh).map(|q| q as i8 - 16);
            idot(&q, &a.qs) as f32 * w.d.to_f32() * a.d.to_f32()
        })
        .sum()
}

pub fn q5_1(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ5_1, BlockQ8_1>(w, a)
        .map(|(w, a)| {
            let q = crate::quant::q5_0::unpack_q5(&w.qs, w.qh);
            idot(&q, &a.qs) as f32 * w.d.to_f32() * a.d.to_f32() + w.m.to_f32() * a.s.to_f32()
        })
        .sum()
}

pub fn q8_0(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ8_0, BlockQ8_0>(w, a)
        .map(|(w, a)| idot(&w.qs, &a.qs) as f32 * w.d.to_f32() * a.d.to_f32())
        .sum()
}

/// Sum over sub-blocks of `len` values of scale * (q . a).
fn scaled_sums<T: Copy + Into<i32>>(
    q: &[T],
    a: &[i8],
    len: usize,
    scale: impl Fn(usize) -> i32,
) -> i32 {
    q.chunks_exact(len)
        .zip(a.chunks_exact(len))
        .enumerate()
        .map(|(j, (q, a))| scale(j) * idot(q, a))
        .sum()
}

pub fn q2_k(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ2K, BlockQ8K>(w, a)
        .map(|(w, a)| {
            let isum = scaled_sums(&w.quants(), &a.qs, 16, |j| (w.scales[j] & 0x0f) as i32);
            let msum: i32 = (0..16)
                .map(|j| (w.scales[j] >> 4) as i32 * a.bsums[j] as i32)
                .sum();
            a.d * (w.d.to_f32() * isum as f32 - w.dmin.to_f32() * msum as f32)
        })
        .sum()
}

pub fn q3_k(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ3K, BlockQ8K>(w, a)
        .map(|(w, a)| {
            let sc = w.sub_scales();
            let isum = scaled_sums(&w.quants(), &a.qs, 16, |j| sc[j] as i32);
            a.d * w.d.to_f32() * isum as f32
        })
        .sum()
}

/// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
fn k4_like(d: f32, dmin: f32, scales: &[u8; 12], q: &[u8; QK_K], a: &BlockQ8K) -> f32 {
    let isum = scaled_sums(q, &a.qs, 32, |j| scale_min_k4(j, scales).0 as i32);
    let msum: i32 = (0..8)
        .map(|j| {
            scale_min_k4(j, scales).1 as i32 * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32)
        })
        .sum();
    a.d * (d * isum as f32 - dmin * msum as f32)
}

pub fn q4_k(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ4K, BlockQ8K>(w, a)
        .map(|(w, a)| k4_like(w.d.to_f32(), w.dmin.to_f32(), &w.scales, &w.quants(), &a))
        .sum()
}

pub fn q5_k(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ5K, BlockQ8K>(w, a)
        .map(|(w, a)| k4_like(w.d.to_f32(), w.dmin.to_f32(), &w.scales, &w.quants(), &a))
        .sum()
}

pub fn q6_k(w: &[u8], a: &[u8]) -> f32 {
    pairs::<BlockQ6K, BlockQ8K>(w, a)
        .map(|(w, a)| {
            let isum = scaled_sums(&w.quants(), &a.qs, 16, |j| w.scales[j] as i32);
            a.d * w.d.to_f32() * isum as f32
        })
        .sum()
}
