//! The kernels for a single token (generation): four weight rows at a time, each row's
//! integer dot of a group summed across its lanes before it is scaled.
//!
//! [`super::kernel::tile`] with one token spends most of its instructions on each row's
//! own scale: a broadcast, a multiply and two FMAs per group of 32 weights. These
//! kernels first sum each row's integer dot across its lanes, four rows to one register
//! (`hadd`), so that one multiply and two FMAs scale four rows (Q4_0 1.7x, Q6_K 1.6x
//! from the L3 cache). Four rows, not eight: eight rows' streams read the weights from
//! memory 0.89x as fast (the Q8_0 output head).

use std::arch::x86_64::*;

use super::decode::{ask_ahead, headers, Decode, Group};
use super::kernel::{tile, Udot};
use super::{Out, Plan};
use crate::cpu::dot::avx2::{hsum, load};

/// Rows `r0..r0 + 4` (at `w`, `rb` bytes apart) times a plan's single token. Lanes 0-3
/// of the sums hold the rows' first halves (values 0-15 of a group), lanes 4-7 their
/// second, so the types scaled per 16 values ([`Decode::HALVES`]) fit too.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn quad_token<D: Decode, U: Udot>(
    w: *const u8,
    rb: usize,
    nb: usize,
    p: &Plan,
    r0: usize,
    out: Out,
) {
    let mut acc = _mm256_setzero_ps();
    let mut offs = _mm256_setzero_ps();
    let qs = p.qs.as_ptr() as *const u8;
    let st = p.stride;
    for b in 0..nb {
        let hdr = headers::<D, 4>(w, rb, b);
        for j in 0..D::GROUPS {
            let g = b * D::GROUPS + j;
            let a = load(qs.add(g * 32));
            let mut grp = [Group::ZERO; 4];
            let mut dot = [_mm256_setzero_si256(); 4];
            for r in 0..4 {
                grp[r] = D::group(w.add(r * rb + b * D::BYTES), &hdr[r], j);
                dot[r] = U::dot(grp[r].q, a);
            }
            let sums = sum_lanes4(dot);
            // The token's scaled sums the offsets count against, per half; where the
            // halves share an offset, in the first half's lanes only (it counts once).
            let s = if D::HALVES {
                let s16 = p.s16.as_ptr();
                _mm256_set_m128(
                    _mm_set1_ps(*s16.add((2 * g + 1) * st)),
                    _mm_set1_ps(*s16.add(2 * g * st)),
                )
            } else {
                _mm256_set_m128(_mm_setzero_ps(), _mm_set1_ps(*p.s.as_ptr().add(g * st)))
            };
            let [g0, g1, g2, g3] = grp;
            let sc0 = _mm_setr_ps(g0.sc[0], g1.sc[0], g2.sc[0], g3.sc[0]);
            let sc1 = _mm_setr_ps(g0.sc[1], g1.sc[1], g2.sc[1], g3.sc[1]);
            let sc = _mm256_set_m128(sc1, sc0);
            let da = _mm256_set1_ps(*p.d.as_ptr().add(g * st));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(sc, da), acc);
            // The symmetric types' offsets are their scales times a constant, applied
            // once at the end.
            let off = if D::OFF_RATIO != 0.0 {
                sc
            } else {
                let off0 = _mm_setr_ps(g0.off[0], g1.off[0], g2.off[0], g3.off[0]);
                let off1 = _mm_setr_ps(g0.off[1], g1.off[1], g2.off[1], g3.off[1]);
                _mm256_set_m128(off1, off0)
            };
            offs = _mm256_fmadd_ps(off, s, offs);
        }
    }
    let v = _mm256_fmadd_ps(offs, _mm256_set1_ps(off_ratio::<D>()), acc);
    store_halves_added(v, out, r0);
}

/// Four registers of i32 sums, each register's 128-bit halves summed apart: lanes
/// 0-3 hold the low halves' sums of registers 0-3, lanes 4-7 the high halves'.
#[inline(always)]
unsafe fn sum_lanes4(d: [__m256i; 4]) -> __m256i {
    _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]))
}

/// Four rows' results whose two halves (lanes r and 4 + r) are added, at row `r0`.
#[inline(always)]
unsafe fn store_halves_added(v: __m256, out: Out, r0: usize) {
    let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    _mm_storeu_ps(out.y.add(r0), v);
}

/// [`quad_token`] for the types whose header holds eight groups' scales and offsets
/// as floats ([`Decode::SCALES8`]: Q4_K, Q5_K). The four rows' scales are transposed
/// once per block into four registers, each holding groups k and k + 4 of the four
/// rows, and the sums of those two groups are folded into the same layout, so that
/// one multiply and two FMAs scale two groups of four rows.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn quad_token_k<D: Decode, U: Udot>(
    w: *const u8,
    rb: usize,
    nb: usize,
    p: &Plan,
    r0: usize,
    out: Out,
) {
    const { assert!(!D::SCALES8 || D::GROUPS == 8 && !D::HALVES) };
    let mut acc = _mm256_setzero_ps();
    let mut offs = _mm256_setzero_ps();
    let qs = p.qs.as_ptr() as *const u8;
    let (dp, sp, st) = (p.d.as_ptr(), p.s.as_ptr(), p.stride);
    for b in 0..nb {
        let hdr = headers::<D, 4>(w, rb, b);
        let mut sc = [_mm256_setzero_ps(); 4];
        let mut mn = [_mm256_setzero_ps(); 4];
        for r in 0..4 {
            let (s, m) = D::scales8(&hdr[r]);
            sc[r] = _mm256_loadu_ps(s.as_ptr());
            mn[r] = _mm256_loadu_ps(m.as_ptr());
        }
        let (sc, mn) = (pairs_of_groups(sc), pairs_of_groups(mn));
        // The activations' scale is one per block (Q8_K).
        let da = _mm256_set1_ps(*dp.add(8 * b * st));
        for k in 0..4 {
            let mut sums = [_mm256_setzero_si256(); 2];
            for (i, j) in [k, k + 4].into_iter().enumerate() {
                let a = load(qs.add((8 * b + j) * 32));
                let mut dot = [_mm256_setzero_si256(); 4];
                for r in 0..4 {
                    let q = D::group(w.add(r * rb + b * D::BYTES), &hdr[r], j).q;
                    dot[r] = U::dot(q, a);
                }
                sums[i] = sum_lanes4(dot);
            }
            // Each group's halves added: group k's rows in lanes 0-3, group k + 4's in 4-7.
            let v = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(sums[0], sums[1]),
                _mm256_permute2x128_si256::<0x31>(sums[0], sums[1]),
            );
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(sc[k], da), acc);
            let s = _mm256_set_m128(
                _mm_set1_ps(*sp.add((8 * b + k + 4) * st)),
                _mm_set1_ps(*sp.add((8 * b + k) * st)),
            );
            offs = _mm256_fmadd_ps(mn[k], s, offs);
        }
    }
    store_halves_added(_mm256_add_ps(acc, offs), out, r0);
}

/// Four rows' eight values each as four registers, register k holding value k of the
/// four rows in lanes 0-3 and value k + 4 in lanes 4-7.
#[inline(always)]
unsafe fn pairs_of_groups(m: [__m256; 4]) -> [__m256; 4] {
    let t0 = _mm256_unpacklo_ps(m[0], m[1]);
    let t1 = _mm256_unpackhi_ps(m[0], m[1]);
    let t2 = _mm256_unpacklo_ps(m[2], m[3]);
    let t3 = _mm256_unpackhi_ps(m[2], m[3]);
    [
        _mm256_shuffle_ps::<0x44>(t0, t2),
        _mm256_shuffle_ps::<0xee>(t0, t2),
        _mm256_shuffle_ps::<0x44>(t1, t3),
        _mm256_shuffle_ps::<0xee>(t1, t3),
    ]
}

/// What the offsets summed by the single-token kernels are multiplied by at the end.
#[inline(always)]
fn off_ratio<D: Decode>() -> f32 {
    if D::OFF_RATIO != 0.0 {
        D::OFF_RATIO
    } else {
        1.0
    }
}

/// [`quad_token`] for the types of one group per block ([`Decode::PAIRS`]), two blocks
/// per step: two rows share each register, the first in its low 128 bits, against the
/// token's half-groups repeated in both, so a pair of rows takes one decode and two
/// dots. Slot s of a step is rows `2 (s % 2)` and `2 (s % 2) + 1` at block `b + s / 2`;
/// after three `hadd`s lane s holds the slot's first row, lane 4 + s its second.
#[inline(always)]
unsafe fn pairs_token<D: Decode, U: Udot>(
    w: *const u8,
    rb: usize,
    nb: usize,
    p: &Plan,
    r0: usize,
    out: Out,
) {
    const { assert!(!D::PAIRS || D::GROUPS == 1 && !D::HALVES) };
    let mut acc = [_mm256_setzero_ps(); 2];
    // Whole steps, then an odd last block alone: a step that may lack its second block
    // tests for it at each slot and clears its lanes (SmolLM2's generation 1.04-1.09x,
    // Gemma 3's 1.03-1.04x, token by token).
    let mut b = 0;
    while b + 2 <= nb {
        pair_step::<D, U, true>(w, rb, p, b, &mut acc);
        b += 2;
    }
    if b < nb {
        pair_step::<D, U, false>(w, rb, p, b, &mut acc);
    }
    let [acc, offs] = acc;
    let mut lanes = [0f32; 8];
    let v = _mm256_fmadd_ps(offs, _mm256_set1_ps(off_ratio::<D>()), acc);
    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
    // Lanes s and s + 2 hold the same rows at two blocks.
    for (r, l) in [0, 4, 1, 5].into_iter().enumerate() {
        *out.y.add(r0 + r) = lanes[l] + lanes[l + 2];
    }
}

/// One step of [`pairs_token`] at blocks `b` and (`FULL`) `b + 1`, added to its sums
/// and offsets (`acc`). Without block b + 1, its slots are skipped and its lanes
/// stay zero.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn pair_step<D: Decode, U: Udot, const FULL: bool>(
    w: *const u8,
    rb: usize,
    p: &Plan,
    b: usize,
    acc: &mut [__m256; 2],
) {
    let qs = p.qs.as_ptr() as *const u8;
    let blocks = if FULL { 2 } else { 1 };
    ask_ahead::<4>(w, rb, 4 * b * D::BYTES, 4 * blocks * D::BYTES);
    let mut v = [_mm256_setzero_si256(); 4];
    let mut sc = [0f32; 8];
    for s in 0..2 * blocks {
        let (k, bs) = (s % 2, b + s / 2);
        let at = qs.add(bs * 32) as *const __m128i;
        let a0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(at));
        let a1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(at.add(1)));
        let w0 = w.add(2 * k * rb + bs * D::BYTES);
        let w1 = w0.add(rb);
        let [q0, q1] = D::pair::<U>(w0, w1);
        v[s] = if signed::<D, U>() {
            _mm256_add_epi32(signed_dot::<U>(q0, a0), signed_dot::<U>(q1, a1))
        } else {
            U::dot_add(U::dot(q0, a0), q1, a1)
        };
        // The symmetric types' scales one by one (the compiler gathers them into one
        // conversion); the others' scales and offsets below.
        if D::OFF_RATIO != 0.0 {
            for (h, wr) in [w0, w1].into_iter().enumerate() {
                sc[4 * h + s] = D::group(wr, &D::ZERO, 0).sc[0];
            }
        }
    }
    let sums = sum_lanes4(v);
    // The token's scale and scaled sum: block b's in lanes 0, 1, 4, 5, block b + 1's
    // in 2, 3, 6, 7 ([`Plan::d8`]; checked present in `rows_times_token`).
    let (da, sa) = (
        _mm256_loadu_ps(p.d8.as_ptr().add(4 * b)),
        _mm256_loadu_ps(p.s8.as_ptr().add(4 * b)),
    );
    let (sc, off) = if D::OFF_RATIO != 0.0 {
        let sc = _mm256_loadu_ps(sc.as_ptr());
        (sc, sc)
    } else {
        pair_headers::<D, FULL>(w, rb, b)
    };
    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(sc, da), acc[0]);
    if !signed::<D, U>() {
        acc[1] = _mm256_fmadd_ps(off, sa, acc[1]);
    }
}

/// Whether [`pairs_token`] dots `D`'s values as signed bytes: Q8_0 ([`Decode::WIDE`])
/// without VNNI. Stored plus 128, two of its products overflow the 16-bit pair sums of
/// AVX2's byte dot; as signed values against activations carrying the weights' signs,
/// each product is at most 128 x 127 and a pair fits, with no offset to add. (AVX2's
/// Q8_0 single tokens ran the row dots before: 25.5 -> 59.3 GB/s from L2, 22.0 -> 33.3
/// at Gemma 3's output head from memory; generation on AVX2 1.18x SmolLM2, 1.45x Gemma 3.)
#[inline(always)]
const fn signed<D: Decode, U: Udot>() -> bool {
    D::WIDE && !U::VNNI
}

/// Sums of four products of the signed bytes `q` and `a`, per 32-bit lane: the
/// magnitudes of `q` against `a` with `q`'s signs (`q`'s plus-128 form from
/// [`Decode::pair`], flipped back).
#[inline(always)]
unsafe fn signed_dot<U: Udot>(q: __m256i, a: __m256i) -> __m256i {
    let q = _mm256_xor_si256(q, _mm256_set1_epi8(0x80u8 as i8));
    U::dot(_mm256_abs_epi8(q), _mm256_sign_epi8(a, q))
}

/// One row (at `w`) of a [`signed`] type times a plan's single token: the rows that do
/// not fill a step of four.
#[inline(always)]
unsafe fn signed_row<D: Decode, U: Udot>(w: *const u8, nb: usize, p: &Plan, r: usize, out: Out) {
    let qs = p.qs.as_ptr() as *const u8;
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        let g = D::group(w.add(b * D::BYTES), &D::ZERO, 0);
        let d = g.sc[0] * *p.d.as_ptr().add(b * p.stride);
        let dot = signed_dot::<U>(g.q, load(qs.add(b * 32)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d), acc);
    }
    *out.y.add(r) = hsum(acc);
}

/// The scales and offsets of [`pairs_token`]'s step at blocks `b` and (`FULL`) `b + 1`,
/// in its lanes (rows 0, 2 of block b, then of b + 1, then rows 1, 3 likewise; zero for
/// a missing block b + 1), for the types with offsets of their own (Q4_1, Q5_1). Their
/// blocks begin with the f16 scale and the offset beside it: one 32-bit word per row
/// and block holds both, and the eight words convert as one vector, where the compiler
/// gathered the sixteen values one by one (`cpu_kernels shape=576x1536 batch=1`, from
/// L2, two runs of 10 alternations: Q4_1 1.06-1.21x, Q5_1 0.98-1.04x; SmolLM2's
/// generation 1.09x). For the symmetric types' eight scales the words were no gain.
#[inline(always)]
unsafe fn pair_headers<D: Decode, const FULL: bool>(
    w: *const u8,
    rb: usize,
    b: usize,
) -> (__m256, __m256) {
    // Without a block b + 1, block b's words again, its lanes then cleared.
    let b1 = if FULL { b + 1 } else { b };
    let word =
        |r: usize, blk: usize| (w.add(r * rb + blk * D::BYTES) as *const i32).read_unaligned();
    let h = _mm256_setr_epi32(
        word(0, b),
        word(2, b),
        word(0, b1),
        word(2, b1),
        word(1, b),
        word(3, b),
        word(1, b1),
        word(3, b1),
    );
    let (mut sc, mut off) = (f16_lows(h), f16_lows(_mm256_srli_epi32::<16>(h)));
    if !FULL {
        let z = _mm256_setzero_ps();
        sc = _mm256_blend_ps::<0b1100_1100>(sc, z);
        off = _mm256_blend_ps::<0b1100_1100>(off, z);
    }
    (sc, off)
}

/// The f16s in the low halves of eight 32-bit lanes, as floats.
#[inline(always)]
unsafe fn f16_lows(v: __m256i) -> __m256 {
    let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    // Per 128-bit lane: lanes 0-3 twice, then 4-7 twice; quads 0 and 2 are all eight.
    let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(lo, lo));
    _mm256_cvtph_ps(_mm256_castsi256_si128(packed))
}

/// Rows `rows` of the matrix at `w` (rows `rb` bytes apart, `nb` blocks each) times a
/// plan's single token: four rows at a time by the type's kernel ([`pairs_token`],
/// [`quad_token_k`] or [`quad_token`]), the rest one by one.
#[inline(always)]
pub(super) unsafe fn rows_times_token<D: Decode, U: Udot>(
    w: &[u8],
    rb: usize,
    nb: usize,
    p: &Plan,
    rows: std::ops::Range<usize>,
    out: Out,
) {
    const {
        assert!(
            D::PAIRS || D::HALVES || D::SCALES8,
            "no single-token kernel"
        )
    };
    // Every single token's plan of the pair types' activations (Q8_0, Q8_1) lays out
    // its scales and sums for `pairs_token`, which reads them unchecked.
    assert!(
        !D::PAIRS || (p.d8.len() >= 4 * nb && p.s8.len() >= 4 * nb),
        "a single token's plan without its pair lanes"
    );
    let wp = w.as_ptr();
    let mut r = rows.start;
    while r + 4 <= rows.end {
        if D::PAIRS {
            pairs_token::<D, U>(wp.add(r * rb), rb, nb, p, r, out);
        } else if D::SCALES8 {
            quad_token_k::<D, U>(wp.add(r * rb), rb, nb, p, r, out);
        } else {
            quad_token::<D, U>(wp.add(r * rb), rb, nb, p, r, out);
        }
        r += 4;
    }
    for r in r..rows.end {
        if signed::<D, U>() {
            signed_row::<D, U>(wp.add(r * rb), nb, p, r, out);
        } else {
            tile::<D, U, 1, 1>(wp.add(r * rb), rb, nb, p, r, 0, out);
        }
    }
}
