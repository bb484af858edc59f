//! Tiled quantized matmul for x86_64: a tile of R weight rows times T tokens is computed
//! in registers, so each weight group decoded is used T times and each activation group
//! loaded is used R times (ggml's CPU backend and llamafile's tinyBLAS do the same).
//!
//! Every weight type is seen through one shape: groups of 32 values, each decoded to 32
//! unsigned bytes `q`, a per-lane scale (the i32 lanes 0-3 hold the first 16 values,
//! 4-7 the last 16) and an offset per half, so that `w = scale * q + offset`. The
//! activations are the 8-bit blocks of [`super::act`], rearranged once per matmul into a
//! [`Plan`]: the i8 values of each token row, and per group the scale and the scaled
//! sum of the values, group-major so that a tile's tokens sit side by side. Then
//!
//! `sum(w * a) = scale * d_a * sum(q * a_q) + offset * (d_a * sum(a_q))`.
//!
//! The byte products are summed with `vpdpbusd` (AVX-512 VNNI) or `maddubs` + `madd`
//! (AVX2, where two products must fit an i16: Q8_0 weights go to the row dot in small
//! batches, and a single token dots them as signed bytes, `token::signed`).
//!
//! Three kernels share that shape. Small batches ([`kernel`]) hold a tile's tokens per
//! register lane group and decode each weight group as they reach it. A single token's
//! ([`token`]) sum four rows' integer dots across their lanes first, so that the scales
//! and offsets are applied to four rows per instruction.
//! Batches of [`BLOCK`] tokens or more ([`blocked`]) put one token in each lane: a row
//! tile's weights are decoded once, and each 4-byte piece of a weight group, broadcast,
//! meets the same piece of 16 tokens in one instruction, so the scales are applied to 16
//! outputs at a time instead of one.

mod blocked;
mod decode;
mod kernel;
mod token;

use super::act::ActType;
use super::kv_cache::f16_to_f32;
use super::lines::LineBuf;
use super::pool::{split, Pool};
use crate::quant::GgmlType;
use crate::{Error, Result};
use blocked::{rows_times_blocks, Lanes, Ymm, Zmm};
use decode::*;
use kernel::{rows_times_plan, Avx2, Vnni};
use token::rows_times_token;

/// Tokens per block of a blocked plan (one per lane of a 512-bit register); batches of
/// at least this many tokens are planned in blocks.
pub const BLOCK: usize = 16;

/// Activations rearranged for the tile kernels (see the module docs).
#[derive(Default)]
pub struct Plan {
    /// The activation blocks it was made from; `None` before the first build.
    act: Option<ActType>,
    n_cols: usize,
    n_tokens: usize,
    /// Tokens per group in `d`, `s`, `s16`, `sb` and `sb16`: `n_tokens` rounded up to
    /// whole blocks, plus room for an 8-wide load at the last token. The padding holds
    /// whatever an earlier plan left: its lanes are computed but never stored.
    stride: usize,
    /// Planned in blocks of [`BLOCK`] tokens (`qt`), else token by token (`qs`).
    blocked: bool,
    /// [n_groups][n_tokens][32] i8 values: a group's tokens side by side, so that two
    /// tokens' groups are one 64-byte load (unblocked plans).
    qs: LineBuf<i8>,
    /// [n_blocks][n_groups][8][BLOCK][4] i8 values (blocked plans): piece c (values 4c..
    /// 4c + 4) of a group for the block's 16 tokens side by side, a block's groups in
    /// order. Tokens past the batch's end hold stale values, as the padding above.
    qt: LineBuf<i8>,
    /// [n_groups][stride] scales.
    d: Vec<f32>,
    /// [n_groups][stride] scale times the sum of the group's values (Q8_K: unblocked
    /// plans only).
    s: Vec<f32>,
    /// [2 n_groups][stride] the same per 16 values (Q8_K activations, unblocked plans).
    s16: Vec<f32>,
    /// `s` and `s16` without the scale, for Q8_K's blocked plans, whose kernel applies
    /// the scale (one per 8 groups) once per block.
    sb: Vec<f32>,
    sb16: Vec<f32>,
    /// A single token's `d` and `s` for [`token`]'s kernel over pairs of blocks (Q8_0
    /// and Q8_1 activations; empty for other plans): per pair of groups (2k, 2k + 1),
    /// eight lanes holding group 2k's value in lanes 0, 1, 4, 5 and group 2k + 1's in 2,
    /// 3, 6, 7 (2k's in all eight where 2k + 1 is past the end). One load per step,
    /// where picking them out of `d` and `s` took two loads, two broadcasts and a blend
    /// each (1.02-1.05x the models' generation).
    pub(super) d8: Vec<f32>,
    pub(super) s8: Vec<f32>,
}

impl Plan {
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn n_cols(&self) -> usize {
        self.n_cols
    }

    pub fn act(&self) -> Option<ActType> {
        self.act
    }

    /// Planned in blocks of [`BLOCK`] tokens, for the batch kernel.
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// Fills the plan from `n_tokens` rows of `at` blocks for rows of `n_cols` values.
    pub fn build(&mut self, at: ActType, a: &[u8], n_cols: usize, n_tokens: usize) -> Result<()> {
        self.build_with(None, at, a, n_cols, n_tokens)
    }

    /// [`Plan::build`] with the tokens spread over the pool's threads.
    pub fn build_on(
        &mut self,
        pool: &Pool,
        at: ActType,
        a: &[u8],
        n_cols: usize,
        n_tokens: usize,
    ) -> Result<()> {
        self.build_with(Some(pool), at, a, n_cols, n_tokens)
    }

    fn build_with(
        &mut self,
        pool: Option<&Pool>,
        at: ActType,
        a: &[u8],
        n_cols: usize,
        n_tokens: usize,
    ) -> Result<()> {
        let arb = at.row_bytes(n_cols);
        if at == ActType::F32 || n_cols % 32 != 0 || a.len() < arb * n_tokens {
            return Err(Error::invalid(format!(
                "tile plan: {} bytes of {at:?} for {n_tokens} rows of {n_cols}",
                a.len()
            )));
        }
        let ng = n_cols / 32;
        let stride = n_tokens.div_ceil(BLOCK) * BLOCK + 8;
        self.act = Some(at);
        self.n_cols = n_cols;
        self.n_tokens = n_tokens;
        self.stride = stride;
        self.blocked = blocked_for(n_tokens);
        let (qs, qt) = if self.blocked {
            (0, n_tokens.div_ceil(BLOCK) * BLOCK * n_cols)
        } else {
            (n_cols * n_tokens, 0)
        };
        // Every value a kernel keeps is written below; the lanes of the tokens that pad
        // a block are computed but never stored. So the buffers only grow, and what an
        // earlier plan left in them is harmless (clearing them was 1% of a prompt).
        // On cache lines, so that the kernels' 64-byte loads of a token block never
        // straddle two ([`LineBuf`]).
        for (buf, n) in [(&mut self.qs, qs), (&mut self.qt, qt)] {
            if buf.len() < n {
                *buf = LineBuf::zeroed(n).ok_or_else(|| {
                    Error::invalid(format!("tile plan: no memory for {n} token values"))
                })?;
            }
        }
        grow(&mut self.d, ng * stride);
        // The sums each kernel reads: Q8_K's blocked plans without the scale.
        let (s, s16) = if at == ActType::Q8_K && self.blocked {
            (&mut self.sb, &mut self.sb16)
        } else {
            (&mut self.s, &mut self.s16)
        };
        grow(s, ng * stride);
        if at == ActType::Q8_K {
            grow(s16, 2 * ng * stride);
        }
        let fill = Fill {
            qs: self.qs.as_mut_ptr(),
            qt: self.qt.as_mut_ptr(),
            d: self.d.as_mut_ptr(),
            s: self.s.as_mut_ptr(),
            s16: self.s16.as_mut_ptr(),
            sb: self.sb.as_mut_ptr(),
            sb16: self.sb16.as_mut_ptr(),
            blocked: self.blocked,
            ng,
            n_tokens,
            stride,
        };
        let row = |t: usize| {
            let row = &a[t * arb..(t + 1) * arb];
            // SAFETY: the buffers were sized above for n_tokens tokens of ng groups, and
            // each token's values are written by one thread only.
            unsafe {
                match at {
                    ActType::Q8_0 | ActType::Q8_1 => fill.row_q8(t, row, at == ActType::Q8_1),
                    _ => fill.row_q8k(t, row),
                }
            }
        };
        match pool {
            // A prompt's plans, built on one thread, were 2% of its time while the
            // others waited.
            Some(pool) if n_tokens >= 2 * BLOCK && pool.n_threads() > 1 => {
                pool.run(&|ith, nth| split(n_tokens, ith, nth).for_each(row))
            }
            _ => (0..n_tokens).for_each(row),
        }
        if n_tokens == 1 && !self.blocked && matches!(at, ActType::Q8_0 | ActType::Q8_1) {
            pair_lanes(&self.d, stride, ng, &mut self.d8);
            pair_lanes(&self.s, stride, ng, &mut self.s8);
        } else {
            self.d8.clear();
            self.s8.clear();
        }
        Ok(())
    }
}

/// `v`'s first token of each of `ng` groups (`stride` apart) in the lanes of
/// [`Plan::d8`].
fn pair_lanes(v: &[f32], stride: usize, ng: usize, out: &mut Vec<f32>) {
    out.clear();
    for g in (0..ng).step_by(2) {
        let a = v[g * stride];
        let b = if g + 1 < ng { v[(g + 1) * stride] } else { a };
        out.extend_from_slice(&[a, a, b, b, a, a, b, b]);
    }
}

/// A plan's buffers as raw pointers, for threads writing the values of different
/// tokens (see [`Plan`] for the layouts).
struct Fill {
    qs: *mut i8,
    qt: *mut i8,
    d: *mut f32,
    s: *mut f32,
    s16: *mut f32,
    sb: *mut f32,
    sb16: *mut f32,
    blocked: bool,
    ng: usize,
    n_tokens: usize,
    stride: usize,
}

// SAFETY: threads write disjoint tokens' values only (the callers of its methods
// promise that).
unsafe impl Sync for Fill {}

impl Fill {
    /// Token t's Q8_0 or Q8_1 row. Callers must have sized the buffers and write each
    /// token from one thread.
    unsafe fn row_q8(&self, t: usize, row: &[u8], stored_sum: bool) {
        let (bb, off) = if stored_sum { (36, 4) } else { (34, 2) };
        for (g, blk) in row.chunks_exact(bb).enumerate() {
            // Inline conversions: `half`'s, a call that checks the CPU each time, took
            // SmolLM2's generation 1.03x as long (four plans a layer).
            let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
            let vals = &blk[off..off + 32];
            self.put_group(g, t, vals);
            // Q8_1 carries ggml's rounded sum, which the row dots use too.
            let s = if stored_sum {
                f16_to_f32(u16::from_le_bytes([blk[2], blk[3]]))
            } else {
                d * vals.iter().map(|&b| b as i8 as i32).sum::<i32>() as f32
            };
            *self.d.add(g * self.stride + t) = d;
            *self.s.add(g * self.stride + t) = s;
        }
    }

    /// Token t's Q8_K row (as [`Fill::row_q8`]).
    unsafe fn row_q8k(&self, t: usize, row: &[u8]) {
        for (b, blk) in row.chunks_exact(292).enumerate() {
            let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
            for (j, vals) in blk[4..260].chunks_exact(32).enumerate() {
                self.put_group(8 * b + j, t, vals);
            }
            let bsum = |j: usize| i16::from_le_bytes([blk[260 + 2 * j], blk[261 + 2 * j]]) as f32;
            // Blocked plans keep the sums unscaled, in `sb` and `sb16` (see `Plan`).
            let (scale, s, s16) = if self.blocked {
                (1.0, self.sb, self.sb16)
            } else {
                (d, self.s, self.s16)
            };
            for j in 0..8 {
                let (g, st) = (8 * b + j, self.stride);
                *self.d.add(g * st + t) = d;
                *s.add(g * st + t) = scale * (bsum(2 * j) + bsum(2 * j + 1));
                *s16.add(2 * g * st + t) = scale * bsum(2 * j);
                *s16.add((2 * g + 1) * st + t) = scale * bsum(2 * j + 1);
            }
        }
    }

    /// Token t's 32 values of group g, where the plan's layout puts them.
    unsafe fn put_group(&self, g: usize, t: usize, vals: &[u8]) {
        if self.blocked {
            let at = ((t / BLOCK) * self.ng + g) * 32 * BLOCK + (t % BLOCK) * 4;
            for (c, piece) in vals.chunks_exact(4).enumerate() {
                let dst = self.qt.add(at + c * 4 * BLOCK);
                std::ptr::copy_nonoverlapping(piece.as_ptr() as *const i8, dst, 4);
            }
        } else {
            let dst = self.qs.add((g * self.n_tokens + t) * 32);
            std::ptr::copy_nonoverlapping(vals.as_ptr() as *const i8, dst, 32);
        }
    }
}

/// `v` made at least `n` long.
fn grow<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// Where a tile's results go: `y[t * ld + r]` for row r and token t.
#[derive(Clone, Copy)]
pub struct Out {
    pub y: *mut f32,
    pub ld: usize,
}

/// Multiplies rows `rows` of a weight matrix (rows `rb` bytes apart) by every token of
/// a plan into `out`.
///
/// # Safety
/// `w` must hold the rows, `out` must be valid for every (row, token) written, and no
/// other thread may write those outputs meanwhile.
pub type TileFn = unsafe fn(w: &[u8], rb: usize, p: &Plan, rows: std::ops::Range<usize>, out: Out);

/// Which byte-product instruction a tile kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    Avx2,
    Vnni,
}

impl Flavor {
    /// The best flavour this CPU runs, if any.
    pub fn detect() -> Option<Flavor> {
        [Flavor::Vnni, Flavor::Avx2]
            .into_iter()
            .find(|f| f.available())
    }

    pub fn available(self) -> bool {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        match self {
            Flavor::Avx2 => avx2,
            Flavor::Vnni => {
                avx2 && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
            }
        }
    }
}

macro_rules! entry {
    ($name:ident, $feat:literal, $u:ty, $d:ty, $rt:literal, $tt:literal, $tp:literal,
     $lanes:ty, $br:literal, $bn:literal) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name(w: &[u8], rb: usize, p: &Plan, rows: std::ops::Range<usize>, out: Out) {
            // Never more blocks than both the weight row and the activations hold.
            let nb = (p.n_cols / 32 / <$d>::GROUPS).min(rb / <$d>::BYTES);
            let rows = rows.start..rows.end.min(w.len() / rb.max(1));
            if p.blocked {
                rows_times_blocks::<$d, $lanes, $br, $bn, { BLOCK / <$lanes>::N }>(
                    w, rb, nb, p, rows, out,
                )
            } else if p.n_tokens == 1 {
                rows_times_token::<$d, $u>(w, rb, nb, p, rows, out)
            } else if p.n_tokens < $tt {
                // Generation: tokens one by one, where four rows share each load best.
                rows_times_plan::<$d, $u, 4, 1, 0>(w, rb, nb, p, rows, out)
            } else {
                rows_times_plan::<$d, $u, $rt, $tt, $tp>(w, rb, nb, p, rows, out)
            }
        }
    };
}

macro_rules! flavors {
    ($($d:ident => $a:ident, $v:ident;)*) => {
        $(
            // AVX2 has 16 vector registers: a 4 x 2 tile's accumulators and decoded
            // groups fit. AVX-512 has 32 of twice the width: a 4 x 8 tile in token
            // pairs (measured 4% faster than 3 x 8, and 15% faster than the 256-bit
            // 3 x 8 it replaced). Blocked batches: 2 rows (AVX2) or 4 (AVX-512) by 16
            // tokens, a row's integer and float accumulators in registers.
            entry!($a, "avx2,fma,f16c", Avx2, $d, 4, 2, 0, Ymm, 2, 2);
            entry!($v, "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni", Vnni, $d, 4, 8, 4,
                Zmm, 4, 2);
        )*
    };
}

flavors! {
    Q4_0 => q4_0_avx2, q4_0_vnni;
    Q4_1 => q4_1_avx2, q4_1_vnni;
    Q5_0 => q5_0_avx2, q5_0_vnni;
    Q5_1 => q5_1_avx2, q5_1_vnni;
    Q8_0 => q8_0_avx2, q8_0_vnni;
    Q2K => q2_k_avx2, q2_k_vnni;
    Q3K => q3_k_avx2, q3_k_vnni;
    Q4K => q4_k_avx2, q4_k_vnni;
    Q5K => q5_k_avx2, q5_k_vnni;
    Q6K => q6_k_avx2, q6_k_vnni;
}

/// Whether a plan of `n_tokens` tokens is built in blocks (for the batch kernel).
pub fn blocked_for(n_tokens: usize) -> bool {
    n_tokens >= BLOCK
}

/// The tile kernel for weights of `ty` in `flavor` and plans of `n_tokens` tokens, or
/// `None` where the row dots are used (float weights; Q8_0 on AVX2 in batches too small
/// to be blocked, whose byte pairs overflow `maddubs` there). Callers must have checked
/// `flavor.available()`.
pub fn kernel(ty: GgmlType, flavor: Flavor, n_tokens: usize) -> Option<TileFn> {
    use GgmlType as G;
    let vnni = flavor == Flavor::Vnni;
    Some(match (ty, vnni) {
        (G::Q4_0, false) => q4_0_avx2,
        (G::Q4_0, true) => q4_0_vnni,
        (G::Q4_1, false) => q4_1_avx2,
        (G::Q4_1, true) => q4_1_vnni,
        (G::Q5_0, false) => q5_0_avx2,
        (G::Q5_0, true) => q5_0_vnni,
        (G::Q5_1, false) => q5_1_avx2,
        (G::Q5_1, true) => q5_1_vnni,
        (G::Q8_0, true) => q8_0_vnni,
        (G::Q8_0, false) if n_tokens == 1 || blocked_for(n_tokens) => q8_0_avx2,
        (G::Q8_0, false) => return None,
        (G::Q2_K, false) => q2_k_avx2,
        (G::Q2_K, true) => q2_k_vnni,
        (G::Q3_K, false) => q3_k_avx2,
        (G::Q3_K, true) => q3_k_vnni,
        (G::Q4_K, false) => q4_k_avx2,
        (G::Q4_K, true) => q4_k_vnni,
        (G::Q5_K, false) => q5_k_avx2,
        (G::Q5_K, true) => q5_k_vnni,
        (G::Q6_K, false) => q6_k_avx2,
        (G::Q6_K, true) => q6_k_vnni,
        _ => return None,
    })
}
