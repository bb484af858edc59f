//! The batch kernel: one token per register lane. A row tile's weight groups are
//! decoded once per column chunk ([`Decoded`]); then for each block of 16 tokens, each
//! 4-byte piece of a row's group is broadcast to every lane and meets the same piece
//! of the 16 tokens (laid side by side by the [`Plan`]) in one byte-dot instruction.
//! After a group's eight pieces each lane holds one token's integer dot, and the group's
//! scales and offsets are applied to 16 tokens at once.
//!
//! The per-lane-group kernels of [`super::kernel`] spend three float instructions (and
//! a share of the decoding) per two tokens' partial dots; here they spend them per
//! sixteen whole dots, so the byte products are most of the work.

use std::arch::x86_64::*;
use std::ops::Range;

use super::decode::{headers, Decode};
use super::{Out, Plan, BLOCK};

/// The vector width a blocked kernel runs in: `N` tokens per register.
pub(super) trait Lanes {
    const N: usize;
    type I: Copy;
    type F: Copy;
    unsafe fn zero_i() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    /// The 4 bytes at `p` in every lane.
    unsafe fn splat4(p: *const u8) -> Self::I;
    unsafe fn load_i(p: *const i8) -> Self::I;
    /// `acc` plus, per lane, the sum of the 8 products of unsigned `u` and signed `s`
    /// bytes (4 in each register of the pair). The unsigned bytes are at most 63 where
    /// [`Lanes::WIDE_OK`] does not hold.
    unsafe fn dot2(acc: Self::I, u: [Self::I; 2], s: [Self::I; 2]) -> Self::I;
    /// Whether [`Lanes::dot2`] takes unsigned bytes up to 255 (Q8_0's).
    const WIDE_OK: bool;
    /// `acc` plus, per lane, the sum of the 4 products of signed `w` and signed `s`
    /// bytes, `wabs` being |w| (Q8_0's values where [`Lanes::WIDE_OK`] does not hold).
    unsafe fn dot_signed(acc: Self::I, w: Self::I, wabs: Self::I, s: Self::I) -> Self::I;
    /// The bytes of `u` less 128, as signed bytes, and their magnitudes.
    unsafe fn signed(u: Self::I) -> (Self::I, Self::I);
    unsafe fn load_f(p: *const f32) -> Self::F;
    /// `acc + dot * d * sc`, lane by lane.
    unsafe fn scaled(acc: Self::F, dot: Self::I, d: Self::F, sc: f32) -> Self::F;
    /// `acc + off * s`, lane by lane.
    unsafe fn offset(acc: Self::F, off: f32, s: Self::F) -> Self::F;
    /// `acc + dot * sc`, lane by lane.
    unsafe fn fold(acc: Self::F, dot: Self::I, sc: f32) -> Self::F;
    /// `plus + dot * d`, lane by lane.
    unsafe fn dot_times(dot: Self::I, d: Self::F, plus: Self::F) -> Self::F;
    /// `acc + a * b`, lane by lane.
    unsafe fn fmadd(acc: Self::F, a: Self::F, b: Self::F) -> Self::F;
    unsafe fn store(p: *mut f32, v: Self::F);
    /// Four rows' results for the register's first `n` tokens: token t's four at
    /// `y + t * ld`, stored (or added to what is there with `add`). The 512-bit lanes
    /// store each token's four as one vector: written a value at a time, as here, they
    /// were 15% of a short row's tile.
    #[inline(always)]
    unsafe fn put4(rows: [Self::F; 4], y: *mut f32, ld: usize, n: usize, add: bool) {
        let mut v = [[0f32; 16]; 4];
        for (v, &r) in v.iter_mut().zip(&rows) {
            Self::store(v.as_mut_ptr(), r);
        }
        for t in 0..n.min(Self::N) {
            for (i, v) in v.iter().enumerate() {
                let p = y.add(t * ld + i);
                *p = if add { *p + v[t] } else { v[t] };
            }
        }
    }
}

/// Four rows of four tokens (each __m128 one row) transposed: one token's rows each.
#[inline(always)]
unsafe fn transpose4(r: [__m128; 4]) -> [__m128; 4] {
    let t01 = _mm_unpacklo_ps(r[0], r[1]);
    let t23 = _mm_unpacklo_ps(r[2], r[3]);
    let u01 = _mm_unpackhi_ps(r[0], r[1]);
    let u23 = _mm_unpackhi_ps(r[2], r[3]);
    [
        _mm_movelh_ps(t01, t23),
        _mm_movehl_ps(t23, t01),
        _mm_movelh_ps(u01, u23),
        _mm_movehl_ps(u23, u01),
    ]
}

/// Stores (or adds) token t's four rows `v[t]` at `y + t * ld`, for the first `n`.
#[inline(always)]
unsafe fn put_tokens(v: [__m128; 4], y: *mut f32, ld: usize, n: usize, add: bool) {
    for (t, &v) in v.iter().enumerate().take(n) {
        let p = y.add(t * ld);
        let v = if add {
            _mm_add_ps(_mm_loadu_ps(p), v)
        } else {
            v
        };
        _mm_storeu_ps(p, v);
    }
}

/// 512-bit registers with `vpdpbusd` (AVX-512 VNNI): 16 tokens per register.
pub(super) struct Zmm;
impl Lanes for Zmm {
    const N: usize = 16;
    type I = __m512i;
    type F = __m512;
    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat4(p: *const u8) -> __m512i {
        _mm512_set1_epi32((p as *const i32).read_unaligned())
    }
    #[inline(always)]
    unsafe fn load_i(p: *const i8) -> __m512i {
        _mm512_loadu_si512(p as *const _)
    }
    #[inline(always)]
    unsafe fn dot2(acc: __m512i, u: [__m512i; 2], s: [__m512i; 2]) -> __m512i {
        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, u[0], s[0]), u[1], s[1])
    }
    const WIDE_OK: bool = true;
    #[inline(always)]
    unsafe fn dot_signed(acc: __m512i, w: __m512i, wabs: __m512i, s: __m512i) -> __m512i {
        // s negated where w is negative (AVX-512 has no byte `sign`).
        let neg = _mm512_movepi8_mask(w);
        let s = _mm512_mask_sub_epi8(s, neg, _mm512_setzero_si512(), s);
        _mm512_dpbusd_epi32(acc, wabs, s)
    }
    #[inline(always)]
    unsafe fn signed(u: __m512i) -> (__m512i, __m512i) {
        let w = _mm512_xor_si512(u, _mm512_set1_epi8(-128));
        (w, _mm512_abs_epi8(w))
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn scaled(acc: __m512, dot: __m512i, d: __m512, sc: f32) -> __m512 {
        let f = _mm512_mul_ps(d, _mm512_set1_ps(sc));
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), f, acc)
    }
    #[inline(always)]
    unsafe fn offset(acc: __m512, off: f32, s: __m512) -> __m512 {
        _mm512_fmadd_ps(_mm512_set1_ps(off), s, acc)
    }
    #[inline(always)]
    unsafe fn fold(acc: __m512, dot: __m512i, sc: f32) -> __m512 {
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(sc), acc)
    }
    #[inline(always)]
    unsafe fn fmadd(acc: __m512, a: __m512, b: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, acc)
    }
    #[inline(always)]
    unsafe fn dot_times(dot: __m512i, d: __m512, plus: __m512) -> __m512 {
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), d, plus)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn put4(rows: [__m512; 4], y: *mut f32, ld: usize, n: usize, add: bool) {
        // Quarter k of each row: tokens 4k .. 4k + 4.
        let mut q = [[_mm_setzero_ps(); 4]; 4];
        for (i, r) in rows.iter().enumerate() {
            q[0][i] = _mm512_extractf32x4_ps::<0>(*r);
            q[1][i] = _mm512_extractf32x4_ps::<1>(*r);
            q[2][i] = _mm512_extractf32x4_ps::<2>(*r);
            q[3][i] = _mm512_extractf32x4_ps::<3>(*r);
        }
        for (k, &quarter) in q.iter().enumerate().take(n.div_ceil(4)) {
            put_tokens(transpose4(quarter), y.add(4 * k * ld), ld, n - 4 * k, add);
        }
    }
}

/// 256-bit registers with `maddubs` + `madd` (AVX2): 8 tokens per register. Four
/// products must fit an i16, which holds for the weight types AVX2 tiles, whose
/// unsigned values are at most 63 (Q8_0 is not one of them).
pub(super) struct Ymm;
impl Lanes for Ymm {
    const N: usize = 8;
    type I = __m256i;
    type F = __m256;
    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat4(p: *const u8) -> __m256i {
        _mm256_set1_epi32((p as *const i32).read_unaligned())
    }
    #[inline(always)]
    unsafe fn load_i(p: *const i8) -> __m256i {
        _mm256_loadu_si256(p as *const _)
    }
    #[inline(always)]
    unsafe fn dot2(acc: __m256i, u: [__m256i; 2], s: [__m256i; 2]) -> __m256i {
        // Each i16 holds 4 products of at most 63 * 128: no saturation, and one widening
        // for two pieces.
        let p0 = _mm256_maddubs_epi16(u[0], s[0]);
        let p1 = _mm256_maddubs_epi16(u[1], s[1]);
        let quads = _mm256_add_epi16(p0, p1);
        _mm256_add_epi32(acc, _mm256_madd_epi16(quads, _mm256_set1_epi16(1)))
    }
    const WIDE_OK: bool = false;
    #[inline(always)]
    unsafe fn dot_signed(acc: __m256i, w: __m256i, wabs: __m256i, s: __m256i) -> __m256i {
        // |w| times s with w's sign: each pair's sum is at most 2 * 128 * 127 and fits.
        let pairs = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(s, w));
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn signed(u: __m256i) -> (__m256i, __m256i) {
        let w = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
        (w, _mm256_abs_epi8(w))
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn scaled(acc: __m256, dot: __m256i, d: __m256, sc: f32) -> __m256 {
        let f = _mm256_mul_ps(d, _mm256_set1_ps(sc));
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), f, acc)
    }
    #[inline(always)]
    unsafe fn offset(acc: __m256, off: f32, s: __m256) -> __m256 {
        _mm256_fmadd_ps(_mm256_set1_ps(off), s, acc)
    }
    #[inline(always)]
    unsafe fn fold(acc: __m256, dot: __m256i, sc: f32) -> __m256 {
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sc), acc)
    }
    #[inline(always)]
    unsafe fn fmadd(acc: __m256, a: __m256, b: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, acc)
    }
    #[inline(always)]
    unsafe fn dot_times(dot: __m256i, d: __m256, plus: __m256) -> __m256 {
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), d, plus)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
}

/// Groups per column chunk of [`Decoded`] (2048 columns): four rows' decoded chunk
/// (12 KiB) stays in L1 beside the activations streaming past it.
const CHUNK_GROUPS: usize = 64;

/// R rows' groups over one chunk of columns, decoded once for every token block: the
/// 32 bytes `q`, the scale of each 16-value half and the offset of each half.
struct Decoded<const R: usize> {
    q: [[[u8; 32]; R]; CHUNK_GROUPS],
    sc: [[[f32; 2]; R]; CHUNK_GROUPS],
    off: [[[f32; 2]; R]; CHUNK_GROUPS],
}

impl<const R: usize> Decoded<R> {
    fn new() -> Self {
        Decoded {
            q: [[[0; 32]; R]; CHUNK_GROUPS],
            sc: [[[0.0; 2]; R]; CHUNK_GROUPS],
            off: [[[0.0; 2]; R]; CHUNK_GROUPS],
        }
    }

    /// Decodes blocks `blocks` of the R rows at `w` (`rb` bytes apart); group j of the
    /// chunk's block i goes to slot `i * D::GROUPS + j`.
    #[inline(always)]
    unsafe fn fill<D: Decode>(&mut self, w: *const u8, rb: usize, blocks: Range<usize>) {
        let b0 = blocks.start;
        for b in blocks {
            let hdr = headers::<D, R>(w, rb, b);
            for j in 0..D::GROUPS {
                let k = (b - b0) * D::GROUPS + j;
                for (r, h) in hdr.iter().enumerate() {
                    let g = D::group(w.add(r * rb + b * D::BYTES), h, j);
                    _mm256_storeu_si256(self.q[k][r].as_mut_ptr() as *mut __m256i, g.q);
                    self.sc[k][r] = g.sc;
                    self.off[k][r] = g.off;
                }
            }
        }
    }
}

/// Where a tile's tokens are: the plan, the first token, and each register's
/// activations (their block's groups, then their place in the block).
struct Tokens<'a, const NB: usize> {
    p: &'a Plan,
    t0: usize,
    a: [*const i8; NB],
}

impl<'a, const NB: usize> Tokens<'a, NB> {
    #[inline(always)]
    unsafe fn new<L: Lanes>(p: &'a Plan, t0: usize) -> Self {
        let ng = p.n_cols / 32;
        let mut a = [std::ptr::null::<i8>(); NB];
        for (n, a) in a.iter_mut().enumerate() {
            let t = t0 + n * L::N;
            *a =
                p.qt.as_ptr()
                    .add((t / BLOCK * ng) * 32 * BLOCK + t % BLOCK * 4);
        }
        Tokens { p, t0, a }
    }

    /// Register n's lanes of the plan's per-group row `v` ([group][stride]) at group g.
    #[inline(always)]
    unsafe fn at<L: Lanes>(&self, v: &[f32], g: usize, n: usize) -> L::F {
        L::load_f(v.as_ptr().add(g * self.p.stride + self.t0 + n * L::N))
    }
}

/// The tile of R rows (from r0) by NB registers of tokens (from t0, a whole number of
/// blocks) over the chunk's first `n_groups` groups, which start at group g0 of the row;
/// stored into `out`, or added to it with `add`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block_tile<D: Decode, L: Lanes, const R: usize, const NB: usize>(
    dec: &Decoded<R>,
    g0: usize,
    n_groups: usize,
    p: &Plan,
    r0: usize,
    t0: usize,
    out: Out,
    add: bool,
) {
    const { assert!(NB * L::N % BLOCK == 0 && NB * L::N <= 64) };
    let tk = Tokens::<NB>::new::<L>(p, t0);
    let mut acc = [[L::zero_f(); NB]; R];
    // The K-quants' running block sums (see `scale_block`).
    let mut blk = [[L::zero_f(); NB]; R];
    for k in 0..n_groups {
        let g = g0 + k;
        let lo = group_dots::<D, L, R, NB>(dec, k, g, &tk, &mut blk);
        if D::GROUPS > 1 {
            scale_block::<D, L, R, NB>(dec, k, g, &tk, &lo, &mut blk, &mut acc);
        } else if D::OFF_RATIO != 0.0 {
            scale_proportional::<D, L, R, NB>(dec, k, g, &tk, &lo, &mut acc);
        } else {
            scale_group::<D, L, R, NB>(dec, k, g, &tk, &lo, &mut acc);
        }
    }
    store_tile::<L, R, NB>(&acc, p, r0, t0, out, add);
}

/// Group g's (slot k's) integer dots of the tile's rows and tokens. The types scaled per
/// 16 values (all K-quants) fold the first half into `blk` (see `scale_block`) before
/// summing the second into the same registers.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn group_dots<D: Decode, L: Lanes, const R: usize, const NB: usize>(
    dec: &Decoded<R>,
    k: usize,
    g: usize,
    tk: &Tokens<'_, NB>,
    blk: &mut [[L::F; NB]; R],
) -> [[L::I; NB]; R] {
    const { assert!(!D::HALVES || D::GROUPS > 1) };
    let mut lo = [[L::zero_i(); NB]; R];
    // Pieces in pairs: (0, 1), (2, 3) the first half, (4, 5), (6, 7) the second.
    for c in (0..8).step_by(2) {
        if D::HALVES && c == 4 {
            for r in 0..R {
                for n in 0..NB {
                    blk[r][n] = L::fold(blk[r][n], lo[r][n], dec.sc[k][r][0]);
                    lo[r][n] = L::zero_i();
                }
            }
        }
        let mut a = [[L::zero_i(); NB]; 2];
        for (h, a) in a.iter_mut().enumerate() {
            for n in 0..NB {
                a[n] = L::load_i(tk.a[n].add(g * 32 * BLOCK + (c + h) * 4 * BLOCK));
            }
        }
        for r in 0..R {
            let w0 = L::splat4(dec.q[k][r].as_ptr().add(4 * c));
            let w1 = L::splat4(dec.q[k][r].as_ptr().add(4 * c + 4));
            if D::WIDE && !L::WIDE_OK {
                // Q8_0 on AVX2: the true signed values, one piece at a time; their
                // offset of -128 scales is then left out.
                let ((s0, a0), (s1, a1)) = (L::signed(w0), L::signed(w1));
                for n in 0..NB {
                    lo[r][n] = L::dot_signed(lo[r][n], s0, a0, a[0][n]);
                    lo[r][n] = L::dot_signed(lo[r][n], s1, a1, a[1][n]);
                }
                continue;
            }
            for n in 0..NB {
                lo[r][n] = L::dot2(lo[r][n], [w0, w1], [a[0][n], a[1][n]]);
            }
        }
    }
    lo
}

/// The K-quants: their activations (Q8_K) have one scale per block of 8 groups, so a
/// group's dots, weight scales and offsets (against the unscaled activation sums) go
/// into `blk`, and each block's sum is scaled into `acc` once. `lo` holds the whole
/// group, or its second half for types scaled per 16 values (`group_dots`).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scale_block<D: Decode, L: Lanes, const R: usize, const NB: usize>(
    dec: &Decoded<R>,
    k: usize,
    g: usize,
    tk: &Tokens<'_, NB>,
    lo: &[[L::I; NB]; R],
    blk: &mut [[L::F; NB]; R],
    acc: &mut [[L::F; NB]; R],
) {
    let p = tk.p;
    for n in 0..NB {
        for r in 0..R {
            let (sc, off) = (dec.sc[k][r], dec.off[k][r]);
            let b = &mut blk[r][n];
            if D::HALVES {
                *b = L::fold(*b, lo[r][n], sc[1]);
                *b = L::offset(*b, off[0], tk.at::<L>(&p.sb16, 2 * g, n));
                *b = L::offset(*b, off[1], tk.at::<L>(&p.sb16, 2 * g + 1, n));
            } else {
                *b = L::fold(*b, lo[r][n], sc[0]);
                *b = L::offset(*b, off[0], tk.at::<L>(&p.sb, g, n));
            }
        }
    }
    if (g + 1) % D::GROUPS == 0 {
        for n in 0..NB {
            let d = tk.at::<L>(&p.d, g, n);
            for r in 0..R {
                acc[r][n] = L::fmadd(acc[r][n], blk[r][n], d);
                blk[r][n] = L::zero_f();
            }
        }
    }
}

/// Types whose offset is a fixed multiple of the scale (Q4_0, Q5_0, Q8_0):
/// acc += sc * (dot * d + ratio * s), one float instruction a row fewer than
/// `scale_group`. Q8_0 on AVX2 sums the true signed values and has no offset.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scale_proportional<D: Decode, L: Lanes, const R: usize, const NB: usize>(
    dec: &Decoded<R>,
    k: usize,
    g: usize,
    tk: &Tokens<'_, NB>,
    lo: &[[L::I; NB]; R],
    acc: &mut [[L::F; NB]; R],
) {
    let ratio = if D::WIDE && !L::WIDE_OK {
        0.0
    } else {
        D::OFF_RATIO
    };
    for n in 0..NB {
        let d = tk.at::<L>(&tk.p.d, g, n);
        let rs = L::offset(L::zero_f(), ratio, tk.at::<L>(&tk.p.s, g, n));
        for r in 0..R {
            let t = L::dot_times(lo[r][n], d, rs);
            acc[r][n] = L::offset(acc[r][n], dec.sc[k][r][0], t);
        }
    }
}

/// The other types (Q4_1, Q5_1): acc += dot * d * sc + off * s.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scale_group<D: Decode, L: Lanes, const R: usize, const NB: usize>(
    dec: &Decoded<R>,
    k: usize,
    g: usize,
    tk: &Tokens<'_, NB>,
    lo: &[[L::I; NB]; R],
    acc: &mut [[L::F; NB]; R],
) {
    let p = tk.p;
    for n in 0..NB {
        let d = tk.at::<L>(&p.d, g, n);
        let s = tk.at::<L>(&p.s, g, n);
        for r in 0..R {
            let (sc, off) = (dec.sc[k][r], dec.off[k][r]);
            acc[r][n] = L::scaled(acc[r][n], lo[r][n], d, sc[0]);
            acc[r][n] = L::offset(acc[r][n], off[0], s);
        }
    }
}

/// The tile's results into `out` (added to it with `add`), for the batch's tokens only.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn store_tile<L: Lanes, const R: usize, const NB: usize>(
    acc: &[[L::F; NB]; R],
    p: &Plan,
    r0: usize,
    t0: usize,
    out: Out,
    add: bool,
) {
    let valid = (p.n_tokens - t0).min(NB * L::N);
    if R == 4 {
        // Four rows: each token's four results are adjacent in `out`, stored as one.
        for n in 0..NB {
            let rows = [acc[0][n], acc[1][n], acc[2][n], acc[3][n]];
            let y = out.y.add((t0 + n * L::N) * out.ld + r0);
            let count = valid.saturating_sub(n * L::N).min(L::N);
            L::put4(rows, y, out.ld, count, add);
        }
        return;
    }
    for r in 0..R {
        let mut v = [0f32; 64];
        for n in 0..NB {
            L::store(v.as_mut_ptr().add(n * L::N), acc[r][n]);
        }
        for (t, &v) in v.iter().enumerate().take(valid) {
            let y = out.y.add((t0 + t) * out.ld + r0 + r);
            *y = if add { *y + v } else { v };
        }
    }
}

/// Rows `rows` of the matrix at `w` (rows `rb` bytes apart, `nb` blocks each) times
/// every token of the blocked plan `p`: tiles of R rows, then single rows at the end.
#[inline(always)]
pub(super) unsafe fn rows_times_blocks<
    D: Decode,
    L: Lanes,
    const R: usize,
    const NB: usize,
    const NB1: usize,
>(
    w: &[u8],
    rb: usize,
    nb: usize,
    p: &Plan,
    rows: Range<usize>,
    out: Out,
) {
    // The tiles write to a buffer of this call's rows, [token][row]: written into `out`
    // directly, a tile's tokens are as many lines a whole output row apart, which for
    // wide matrices share one L1 set and miss on every store (a third of the time).
    // An `out` laid out as that buffer (the rows from 0, a token's outputs side by side)
    // is written in place.
    let len = rows.len();
    let compact = rows.start == 0 && out.ld == len;
    // Every value is stored before it is read back, so the buffer only ever grows.
    let mut buf = if compact { Vec::new() } else { YBUF.take() };
    if !compact && buf.len() < len * p.n_tokens {
        buf.resize(len * p.n_tokens, 0.0);
    }
    let local = if compact {
        out
    } else {
        Out {
            y: buf.as_mut_ptr(),
            ld: len,
        }
    };
    let mut r = rows.start;
    if r + R <= rows.end {
        let mut dec = Decoded::<R>::new();
        while r + R <= rows.end {
            let (wr, r0) = (w.as_ptr().add(r * rb), r - rows.start);
            row_tile::<D, L, R, NB, NB1>(&mut dec, wr, rb, nb, p, r0, local);
            r += R;
        }
    }
    if r < rows.end {
        let mut dec = Decoded::<1>::new();
        while r < rows.end {
            let (wr, r0) = (w.as_ptr().add(r * rb), r - rows.start);
            row_tile::<D, L, 1, NB, NB1>(&mut dec, wr, rb, nb, p, r0, local);
            r += 1;
        }
    }
    if !compact {
        for t in 0..p.n_tokens {
            let dst = out.y.add(t * out.ld + rows.start);
            std::ptr::copy_nonoverlapping(buf.as_ptr().add(t * len), dst, len);
        }
        YBUF.set(buf);
    }
}

thread_local! {
    /// [`rows_times_blocks`]'s output buffer, kept for its memory.
    static YBUF: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// R rows from row r0 (at `w`) times every token block of `p`, a column chunk at a time:
/// NB registers of tokens per tile, then NB1 (one block) for the last.
#[inline(always)]
unsafe fn row_tile<D: Decode, L: Lanes, const R: usize, const NB: usize, const NB1: usize>(
    dec: &mut Decoded<R>,
    w: *const u8,
    rb: usize,
    nb: usize,
    p: &Plan,
    r0: usize,
    out: Out,
) {
    let per_chunk = CHUNK_GROUPS / D::GROUPS;
    let mut b0 = 0;
    while b0 < nb {
        let b1 = nb.min(b0 + per_chunk);
        dec.fill::<D>(w, rb, b0..b1);
        let (g0, n_groups) = (b0 * D::GROUPS, (b1 - b0) * D::GROUPS);
        let (wide, add) = (NB * L::N, b0 > 0);
        let mut t0 = 0;
        while t0 + wide <= p.n_tokens.div_ceil(BLOCK) * BLOCK {
            block_tile::<D, L, R, NB>(dec, g0, n_groups, p, r0, t0, out, add);
            t0 += wide;
        }
        while t0 < p.n_tokens {
            block_tile::<D, L, R, NB1>(dec, g0, n_groups, p, r0, t0, out, add);
            t0 += BLOCK;
        }
        b0 = b1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both widths' signed byte dots against plain arithmetic (the 512-bit one runs only
    /// where a caller's weights are too wide for its unsigned dot, so it is checked here).
    #[test]
    fn signed_dots_match_arithmetic() {
        let bytes = |seed: u32| -> [u8; 64] {
            let mut h = seed;
            std::array::from_fn(|_| {
                h = h.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (h >> 24) as u8
            })
        };
        let (u, a) = (bytes(1), bytes(2));
        // Activations stay within ±127, as the quantizers make them.
        let a = a.map(|b| (b as i8).max(-127) as u8);
        let want: Vec<i32> = (0..16)
            .map(|l| {
                (0..4)
                    .map(|k| (u[4 * l + k] as i32 - 128) * a[4 * l + k] as i8 as i32)
                    .sum()
            })
            .collect();
        let mut got = [0i32; 16];
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present.
            unsafe { ymm_signed(&u, &a, &mut got) };
            assert_eq!(got.to_vec(), want);
        }
        if is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vnni") {
            got = [0; 16];
            // SAFETY: AVX-512 BW and VNNI are present.
            unsafe { zmm_signed(&u, &a, &mut got) };
            assert_eq!(got.to_vec(), want);
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn ymm_signed(u: &[u8; 64], a: &[u8; 64], out: &mut [i32; 16]) {
        for h in 0..2 {
            let (w, wabs) = Ymm::signed(Ymm::load_i(u.as_ptr().add(32 * h) as *const i8));
            let s = Ymm::load_i(a.as_ptr().add(32 * h) as *const i8);
            let d = Ymm::dot_signed(Ymm::zero_i(), w, wabs, s);
            _mm256_storeu_si256(out.as_mut_ptr().add(8 * h) as *mut __m256i, d);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn zmm_signed(u: &[u8; 64], a: &[u8; 64], out: &mut [i32; 16]) {
        let (w, wabs) = Zmm::signed(Zmm::load_i(u.as_ptr() as *const i8));
        let d = Zmm::dot_signed(Zmm::zero_i(), w, wabs, Zmm::load_i(a.as_ptr() as *const i8));
        _mm512_storeu_si512(out.as_mut_ptr() as *mut _, d);
    }
}
