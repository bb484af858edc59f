//! The tile loops for small batches: R weight rows times T tokens accumulated in
//! registers, each weight group decoded as the loop reaches it and used for the tile's
//! T tokens. Single tokens run [`super::token`], batches of 16 tokens and more
//! [`super::blocked`].

use std::arch::x86_64::*;

use super::decode::{fifth_bits, headers, Decode, Group};
use super::{Out, Plan};
use crate::cpu::dot::avx2::{hsum, load};

/// The unsigned-by-signed byte dot product a kernel is built on, and the byte
/// operations whose best form differs between the flavours.
pub(super) trait Udot {
    /// Whether the dot sums four products in 32 bits at once (AVX-512 VNNI), so that
    /// [`Decode::WIDE`] values fit; AVX2's sums pairs in 16 bits first.
    const VNNI: bool;
    /// `q` with 16 added to byte i wherever bit i of `bits` is set (the Q5 types'
    /// fifth bits, where `q` holds the low four).
    unsafe fn fifth_bits(q: __m256i, bits: u32) -> __m256i;
    /// 8 lanes of sums of 4 products of `u` (unsigned) and `s` (signed) bytes.
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;
    /// `acc` plus [`Udot::dot`].
    unsafe fn dot_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

pub(super) struct Vnni;
impl Udot for Vnni {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn fifth_bits(q: __m256i, bits: u32) -> __m256i {
        // One masked add (AVX-512 BW): the AVX2 form spreads the bits over bytes first.
        _mm256_mask_add_epi8(q, _cvtu32_mask32(bits), q, _mm256_set1_epi8(0x10))
    }
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }
    #[inline(always)]
    unsafe fn dot_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

pub(super) struct Avx2;
impl Udot for Avx2 {
    const VNNI: bool = false;
    #[inline(always)]
    unsafe fn fifth_bits(q: __m256i, bits: u32) -> __m256i {
        _mm256_or_si256(q, fifth_bits(bits))
    }
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
    #[inline(always)]
    unsafe fn dot_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, Self::dot(u, s))
    }
}

/// `offs` (8 tokens from t0) plus group g's offset terms `off` (per half where the
/// type has two) times the tokens' scaled sums.
#[inline(always)]
unsafe fn add_offsets<D: Decode>(
    offs: __m256,
    off: [f32; 2],
    p: &Plan,
    g: usize,
    t0: usize,
) -> __m256 {
    if D::HALVES {
        let s0 = _mm256_loadu_ps(p.s16.as_ptr().add(2 * g * p.stride + t0));
        let s1 = _mm256_loadu_ps(p.s16.as_ptr().add((2 * g + 1) * p.stride + t0));
        let o = _mm256_fmadd_ps(_mm256_set1_ps(off[0]), s0, offs);
        _mm256_fmadd_ps(_mm256_set1_ps(off[1]), s1, o)
    } else {
        let s = _mm256_loadu_ps(p.s.as_ptr().add(g * p.stride + t0));
        _mm256_fmadd_ps(_mm256_set1_ps(off[0]), s, offs)
    }
}

/// The R x T tile at rows `r0..` (at `w`, `rb` bytes apart) and tokens `t0..t0 + T`:
/// row r . token t over `nb` blocks into `out`.
// Index loops over the tile: the compiler unrolls them and keeps `acc` in registers.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn tile<D: Decode, U: Udot, const R: usize, const T: usize>(
    w: *const u8,
    rb: usize,
    nb: usize,
    p: &Plan,
    r0: usize,
    t0: usize,
    out: Out,
) {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    const { assert!(T <= 8) };
    // Offset terms of the 8 tokens from t0 (only the first T are used).
    let mut offs = [_mm256_setzero_ps(); R];
    let qs = p.qs.as_ptr() as *const u8;
    let dp = p.d.as_ptr();
    for b in 0..nb {
        let hdr = headers::<D, R>(w, rb, b);
        for j in 0..D::GROUPS {
            let g = b * D::GROUPS + j;
            let mut grp = [Group::ZERO; R];
            for (r, gr) in grp.iter_mut().enumerate() {
                *gr = D::group(w.add(r * rb + b * D::BYTES), &hdr[r], j);
            }
            for t in 0..T {
                let a = load(qs.add((g * p.n_tokens + t0 + t) * 32));
                let da = _mm256_broadcast_ss(&*dp.add(g * p.stride + t0 + t));
                for r in 0..R {
                    let dot = _mm256_cvtepi32_ps(U::dot(grp[r].q, a));
                    acc[r][t] =
                        _mm256_fmadd_ps(dot, _mm256_mul_ps(grp[r].sc_lanes::<D>(), da), acc[r][t]);
                }
            }
            for r in 0..R {
                offs[r] = add_offsets::<D>(offs[r], grp[r].off, p, g, t0);
            }
        }
    }
    for r in 0..R {
        let mut o = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), offs[r]);
        for t in 0..T {
            *out.y.add((t0 + t) * out.ld + r0 + r) = hsum(acc[r][t]) + o[t];
        }
    }
}

/// Lanes 0-7 take the first token of a pair, 8-15 the second (see [`tile_zmm`]).
const PAIR_LANES: [i32; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];

/// The R x 2TP tile of [`tile`] in 512-bit registers (AVX-512 VNNI): each register
/// holds a token pair, the weight group repeated in both halves against two tokens'
/// activations side by side in the plan, so every instruction does twice the work of
/// the 256-bit tile's.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_zmm<D: Decode, const R: usize, const TP: usize>(
    w: *const u8,
    rb: usize,
    nb: usize,
    p: &Plan,
    r0: usize,
    t0: usize,
    out: Out,
) {
    const { assert!(TP <= 4) };
    let mut acc = [[_mm512_setzero_ps(); TP]; R];
    let mut offs = [_mm256_setzero_ps(); R];
    let qs = p.qs.as_ptr() as *const u8;
    let dp = p.d.as_ptr();
    // Lane i of a pair's scale register is token 2 tp + i / 8's scale (a permutation of
    // the tile's 8 scales: measured faster than loading pre-spread scales).
    let first = _mm512_loadu_si512(PAIR_LANES.as_ptr() as *const _);
    let pair_idx: [__m512i; 4] =
        [0, 2, 4, 6].map(|k| _mm512_add_epi32(first, _mm512_set1_epi32(k)));
    for b in 0..nb {
        let hdr = headers::<D, R>(w, rb, b);
        for j in 0..D::GROUPS {
            let g = b * D::GROUPS + j;
            let mut q = [_mm512_setzero_si512(); R];
            let mut sc = [_mm512_setzero_ps(); R];
            let mut off = [[0f32; 2]; R];
            for r in 0..R {
                let gr = D::group(w.add(r * rb + b * D::BYTES), &hdr[r], j);
                q[r] = _mm512_broadcast_i64x4(gr.q);
                let lanes = _mm256_castps_si256(gr.sc_lanes::<D>());
                sc[r] = _mm512_castsi512_ps(_mm512_broadcast_i64x4(lanes));
                off[r] = gr.off;
            }
            let dv = _mm512_castps256_ps512(_mm256_loadu_ps(dp.add(g * p.stride + t0)));
            for tp in 0..TP {
                let at = g * p.n_tokens + t0 + 2 * tp;
                let a = _mm512_loadu_si512(qs.add(at * 32) as *const _);
                let da = _mm512_permutexvar_ps(pair_idx[tp], dv);
                for r in 0..R {
                    let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r], a);
                    let f = _mm512_mul_ps(sc[r], da);
                    acc[r][tp] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), f, acc[r][tp]);
                }
            }
            for r in 0..R {
                offs[r] = add_offsets::<D>(offs[r], off[r], p, g, t0);
            }
        }
    }
    for r in 0..R {
        let mut o = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), offs[r]);
        for tp in 0..TP {
            let lo = _mm512_castps512_ps256(acc[r][tp]);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][tp]), 1));
            for (k, half) in [lo, hi].into_iter().enumerate() {
                let t = 2 * tp + k;
                *out.y.add((t0 + t) * out.ld + r0 + r) = hsum(half) + o[t];
            }
        }
    }
}

/// Rows `rows` of the matrix at `w` (rows `rb` bytes apart, `nb` blocks each) times
/// every token of `p`, in tiles of RT rows by TT tokens (and smaller at the edges). With
/// TP > 0 (AVX-512 only) whole tiles are [`tile_zmm`]'s of TP token pairs, TT = 2 TP.
#[inline(always)]
pub(super) unsafe fn rows_times_plan<
    D: Decode,
    U: Udot,
    const RT: usize,
    const TT: usize,
    const TP: usize,
>(
    w: &[u8],
    rb: usize,
    nb: usize,
    p: &Plan,
    rows: std::ops::Range<usize>,
    out: Out,
) {
    let wp = w.as_ptr();
    let nt = p.n_tokens;
    let mut r = rows.start;
    while r < rows.end {
        let full = r + RT <= rows.end;
        let wr = wp.add(r * rb);
        let mut t = 0;
        while t < nt {
            let whole = t + TT <= nt;
            match (full, whole) {
                (true, true) if TP > 0 => tile_zmm::<D, RT, TP>(wr, rb, nb, p, r, t, out),
                (true, true) => tile::<D, U, RT, TT>(wr, rb, nb, p, r, t, out),
                (true, false) => tile::<D, U, RT, 1>(wr, rb, nb, p, r, t, out),
                (false, true) => tile::<D, U, 1, TT>(wr, rb, nb, p, r, t, out),
                (false, false) => tile::<D, U, 1, 1>(wr, rb, nb, p, r, t, out),
            }
            t += if whole { TT } else { 1 };
        }
        r += if full { RT } else { 1 };
    }
}
