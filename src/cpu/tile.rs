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
//! (AVX2, where two products must fit an i16, so Q8_0 weights are left to the row dot).

use std::arch::x86_64::*;

use super::act::ActType;
use super::dot::avx2::{bits_to_bytes, f16_at, hsum, load, nibbles};
use crate::quant::kquant::scale_min_k4;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// Activations rearranged for the tile kernels (see the module docs).
#[derive(Default)]
pub struct Plan {
    /// The activation blocks it was made from; `None` before the first build.
    act: Option<ActType>,
    n_cols: usize,
    n_tokens: usize,
    /// Tokens per group in `d`, `s` and `s16`: `n_tokens` rounded up, plus room for an
    /// 8-wide load at the last token.
    stride: usize,
    /// [n_groups][n_tokens][32] i8 values: a group's tokens side by side, so that two
    /// tokens' groups are one 64-byte load.
    qs: Vec<i8>,
    /// [n_groups][stride] scales.
    d: Vec<f32>,
    /// [n_groups][stride] scale times the sum of the group's values.
    s: Vec<f32>,
    /// [2 n_groups][stride] the same per 16 values (Q8_K activations only).
    s16: Vec<f32>,
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

    /// Fills the plan from `n_tokens` rows of `at` blocks for rows of `n_cols` values.
    pub fn build(&mut self, at: ActType, a: &[u8], n_cols: usize, n_tokens: usize) -> Result<()> {
        let arb = at.row_bytes(n_cols);
        if at == ActType::F32 || n_cols % 32 != 0 || a.len() < arb * n_tokens {
            return Err(Error::invalid(format!(
                "tile plan: {} bytes of {at:?} for {n_tokens} rows of {n_cols}",
                a.len()
            )));
        }
        let ng = n_cols / 32;
        let stride = n_tokens.div_ceil(8) * 8 + 8;
        self.act = Some(at);
        self.n_cols = n_cols;
        self.n_tokens = n_tokens;
        self.stride = stride;
        self.qs.clear();
        self.qs.resize(n_cols * n_tokens, 0);
        for v in [&mut self.d, &mut self.s] {
            v.clear();
            v.resize(ng * stride, 0.0);
        }
        self.s16.clear();
        if at == ActType::Q8_K {
            self.s16.resize(2 * ng * stride, 0.0);
        }
        for (t, row) in a.chunks_exact(arb).take(n_tokens).enumerate() {
            match at {
                ActType::Q8_0 | ActType::Q8_1 => self.row_q8(t, row, at == ActType::Q8_1),
                _ => self.row_q8k(t, row),
            }
        }
        Ok(())
    }

    fn row_q8(&mut self, t: usize, row: &[u8], stored_sum: bool) {
        let (bb, off) = if stored_sum { (36, 4) } else { (34, 2) };
        let nt = self.n_tokens;
        for (g, blk) in row.chunks_exact(bb).enumerate() {
            let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            let mut sum = 0i32;
            let q = &mut self.qs[(g * nt + t) * 32..][..32];
            for (q, &b) in q.iter_mut().zip(&blk[off..off + 32]) {
                *q = b as i8;
                sum += b as i8 as i32;
            }
            // Q8_1 carries ggml's rounded sum, which the row dots use too.
            let s = if stored_sum {
                half::f16::from_le_bytes([blk[2], blk[3]]).to_f32()
            } else {
                d * sum as f32
            };
            self.d[g * self.stride + t] = d;
            self.s[g * self.stride + t] = s;
        }
    }

    fn row_q8k(&mut self, t: usize, row: &[u8]) {
        let nt = self.n_tokens;
        for (b, blk) in row.chunks_exact(292).enumerate() {
            let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
            for (j, vals) in blk[4..260].chunks_exact(32).enumerate() {
                let q = &mut self.qs[((8 * b + j) * nt + t) * 32..][..32];
                for (q, &v) in q.iter_mut().zip(vals) {
                    *q = v as i8;
                }
            }
            let bsum = |j: usize| i16::from_le_bytes([blk[260 + 2 * j], blk[261 + 2 * j]]) as f32;
            for j in 0..8 {
                let g = 8 * b + j;
                self.d[g * self.stride + t] = d;
                self.s[g * self.stride + t] = d * (bsum(2 * j) + bsum(2 * j + 1));
                self.s16[2 * g * self.stride + t] = d * bsum(2 * j);
                self.s16[(2 * g + 1) * self.stride + t] = d * bsum(2 * j + 1);
            }
        }
    }
}

/// The unsigned-by-signed byte dot product a kernel is built on.
trait Udot {
    /// 8 lanes of sums of 4 products of `u` (unsigned) and `s` (signed) bytes.
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;
}

struct Vnni;
impl Udot for Vnni {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }
}

struct Avx2;
impl Udot for Avx2 {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
}

/// One decoded group: `w = sc * q + off` (per half for `off`).
#[derive(Clone, Copy)]
struct Group {
    q: __m256i,
    sc: __m256,
    off: [f32; 2],
}

/// A weight type's blocks, seen as groups of 32.
trait Decode {
    const BYTES: usize;
    const GROUPS: usize;
    /// Offsets differ between the halves of a group (Q6_K's 16-value sub-blocks).
    const HALVES: bool = false;
    /// What a block's groups share, decoded once per block.
    type Hdr: Copy;
    const ZERO: Self::Hdr;
    unsafe fn hdr(b: *const u8) -> Self::Hdr;
    unsafe fn group(b: *const u8, h: &Self::Hdr, j: usize) -> Group;
}

/// Bit i of `x` as byte i: 0x10 when set, 0 when clear.
#[inline(always)]
unsafe fn fifth_bits(x: u32) -> __m256i {
    _mm256_and_si256(bits_to_bytes(x), _mm256_set1_epi8(0x10))
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned()
}

#[inline(always)]
fn simple(q: __m256i, d: f32, off: f32) -> Group {
    // SAFETY: plain register broadcast, available wherever the kernels run.
    let sc = unsafe { _mm256_set1_ps(d) };
    Group {
        q,
        sc,
        off: [off, off],
    }
}

struct Q4_0;
impl Decode for Q4_0 {
    const BYTES: usize = 18;
    const GROUPS: usize = 1;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        let d = f16_at(b);
        simple(nibbles(b.add(2)), d, -8.0 * d)
    }
}

struct Q4_1;
impl Decode for Q4_1 {
    const BYTES: usize = 20;
    const GROUPS: usize = 1;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        simple(nibbles(b.add(4)), f16_at(b), f16_at(b.add(2)))
    }
}

struct Q5_0;
impl Decode for Q5_0 {
    const BYTES: usize = 22;
    const GROUPS: usize = 1;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        let d = f16_at(b);
        let q = _mm256_or_si256(nibbles(b.add(6)), fifth_bits(u32_at(b.add(2))));
        simple(q, d, -16.0 * d)
    }
}

struct Q5_1;
impl Decode for Q5_1 {
    const BYTES: usize = 24;
    const GROUPS: usize = 1;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        let q = _mm256_or_si256(nibbles(b.add(8)), fifth_bits(u32_at(b.add(4))));
        simple(q, f16_at(b), f16_at(b.add(2)))
    }
}

/// Q8_0 as unsigned bytes: q + 128, offset by -128 d (VNNI only: two such products
/// overflow the i16 of `maddubs`).
struct Q8_0;
impl Decode for Q8_0 {
    const BYTES: usize = 34;
    const GROUPS: usize = 1;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        let d = f16_at(b);
        let q = _mm256_xor_si256(load(b.add(2)), _mm256_set1_epi8(0x80u8 as i8));
        simple(q, d, -128.0 * d)
    }
}

/// Q4_K and Q5_K: d, dmin, 12 bytes of 6-bit scales and mins, per group of 32.
#[derive(Clone, Copy)]
struct KHdr {
    sc: [f32; 8],
    mn: [f32; 8],
}

#[inline(always)]
unsafe fn k4_hdr(b: *const u8) -> KHdr {
    let mut raw = [0u8; 12];
    std::ptr::copy_nonoverlapping(b.add(4), raw.as_mut_ptr(), 12);
    let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
    let mut h = KHdr {
        sc: [0.0; 8],
        mn: [0.0; 8],
    };
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &raw);
        h.sc[j] = d * s as f32;
        h.mn[j] = -dmin * m as f32;
    }
    h
}

/// The 32 nibbles of group j of a Q4_K/Q5_K block whose quants start at `qs`: groups
/// 2i and 2i + 1 are the low and high nibbles of the same 32 bytes.
#[inline(always)]
unsafe fn k_nibbles(qs: *const u8, j: usize) -> __m256i {
    let q = load(qs.add(32 * (j / 2)));
    let q = if j % 2 == 1 {
        _mm256_srli_epi16(q, 4)
    } else {
        q
    };
    _mm256_and_si256(q, _mm256_set1_epi8(0x0f))
}

struct Q4K;
impl Decode for Q4K {
    const BYTES: usize = 144;
    const GROUPS: usize = 8;
    type Hdr = KHdr;
    const ZERO: KHdr = KHdr {
        sc: [0.0; 8],
        mn: [0.0; 8],
    };
    #[inline(always)]
    unsafe fn hdr(b: *const u8) -> KHdr {
        k4_hdr(b)
    }
    #[inline(always)]
    unsafe fn group(b: *const u8, h: &KHdr, j: usize) -> Group {
        simple(k_nibbles(b.add(16), j), h.sc[j], h.mn[j])
    }
}

struct Q5K;
impl Decode for Q5K {
    const BYTES: usize = 176;
    const GROUPS: usize = 8;
    type Hdr = KHdr;
    const ZERO: KHdr = KHdr {
        sc: [0.0; 8],
        mn: [0.0; 8],
    };
    #[inline(always)]
    unsafe fn hdr(b: *const u8) -> KHdr {
        k4_hdr(b)
    }
    #[inline(always)]
    unsafe fn group(b: *const u8, h: &KHdr, j: usize) -> Group {
        let q = _mm256_or_si256(k_nibbles(b.add(48), j), mask_bit::<4>(b.add(16), j));
        simple(q, h.sc[j], h.mn[j])
    }
}

/// Bit j of each of the 32 bytes at `p`, moved to bit `TO` (Q5_K's and Q3_K's high bits).
#[inline(always)]
unsafe fn mask_bit<const TO: i32>(p: *const u8, j: usize) -> __m256i {
    let hb = _mm256_and_si256(load(p), _mm256_set1_epi8((1u8 << j) as i8));
    _mm256_slli_epi16(_mm256_min_epu8(hb, _mm256_set1_epi8(1)), TO)
}

/// The 2-bit field k of the 32 bytes at `p` (bits 2k..2k + 2 of each byte): Q2_K's and
/// Q3_K's quants, where value 32 k + l of each 128 is field k of byte l.
#[inline(always)]
unsafe fn crumbs(p: *const u8, k: usize) -> __m256i {
    let q = _mm256_srl_epi16(load(p), _mm_cvtsi32_si128(2 * k as i32));
    _mm256_and_si256(q, _mm256_set1_epi8(3))
}

/// A group's two 16-value halves: per-lane scales and per-half offsets.
#[inline(always)]
fn halves(q: __m256i, sc: [f32; 2], off: [f32; 2]) -> Group {
    // SAFETY: plain register broadcasts, available wherever the kernels run.
    let sc = unsafe { _mm256_set_m128(_mm_set1_ps(sc[1]), _mm_set1_ps(sc[0])) };
    Group { q, sc, off }
}

/// Q2_K: scales[16] (4-bit scale and min per 16 values), qs[64], f16 d, f16 dmin.
struct Q2K;
impl Decode for Q2K {
    const BYTES: usize = 84;
    const GROUPS: usize = 8;
    const HALVES: bool = true;
    /// Per 16 values: the scale, then the offset (minus the min).
    type Hdr = [[f32; 16]; 2];
    const ZERO: [[f32; 16]; 2] = [[0.0; 16]; 2];
    #[inline(always)]
    unsafe fn hdr(b: *const u8) -> [[f32; 16]; 2] {
        let (d, dmin) = (f16_at(b.add(80)), f16_at(b.add(82)));
        let s = |k: usize| *b.add(k);
        [
            std::array::from_fn(|k| d * (s(k) & 0x0f) as f32),
            std::array::from_fn(|k| -dmin * (s(k) >> 4) as f32),
        ]
    }
    #[inline(always)]
    unsafe fn group(b: *const u8, h: &[[f32; 16]; 2], j: usize) -> Group {
        let q = crumbs(b.add(16 + 32 * (j / 4)), j % 4);
        let k = 2 * j;
        halves(q, [h[0][k], h[0][k + 1]], [h[1][k], h[1][k + 1]])
    }
}

/// Q3_K: hmask[32], qs[64], 6-bit scales[12], f16 d; value q - 4 where q holds the two
/// low bits and the high-mask bit as its third.
struct Q3K;
impl Decode for Q3K {
    const BYTES: usize = 110;
    const GROUPS: usize = 8;
    const HALVES: bool = true;
    type Hdr = [f32; 16];
    const ZERO: [f32; 16] = [0.0; 16];
    #[inline(always)]
    unsafe fn hdr(b: *const u8) -> [f32; 16] {
        let d = f16_at(b.add(108));
        let sc = b.add(96);
        std::array::from_fn(|k| {
            let low = if k < 8 {
                *sc.add(k) & 0x0f
            } else {
                *sc.add(k - 8) >> 4
            };
            let high = (*sc.add(8 + k % 4) >> (2 * (k / 4))) & 3;
            d * ((low | (high << 4)) as i8 - 32) as f32
        })
    }
    #[inline(always)]
    unsafe fn group(b: *const u8, h: &[f32; 16], j: usize) -> Group {
        let q = _mm256_or_si256(crumbs(b.add(32 + 32 * (j / 4)), j % 4), mask_bit::<2>(b, j));
        let k = 2 * j;
        halves(q, [h[k], h[k + 1]], [-4.0 * h[k], -4.0 * h[k + 1]])
    }
}

/// Q6_K: ql[128], qh[64], i8 scales[16], f16 d; values stored plus 32, a scale per 16.
struct Q6K;
impl Decode for Q6K {
    const BYTES: usize = 210;
    const GROUPS: usize = 8;
    const HALVES: bool = true;
    type Hdr = [f32; 16];
    const ZERO: [f32; 16] = [0.0; 16];
    #[inline(always)]
    unsafe fn hdr(b: *const u8) -> [f32; 16] {
        let d = f16_at(b.add(208));
        let mut s = [0.0; 16];
        for (k, s) in s.iter_mut().enumerate() {
            *s = d * *b.add(192 + k) as i8 as f32;
        }
        s
    }
    #[inline(always)]
    unsafe fn group(b: *const u8, h: &[f32; 16], j: usize) -> Group {
        // Group j = 4n + g covers values 128n + 32g ..; see ggml's dequantize_row_q6_K.
        let (n, g) = (j / 4, j % 4);
        let ql = load(b.add(64 * n + 32 * (g % 2)));
        let lo = if g >= 2 { _mm256_srli_epi16(ql, 4) } else { ql };
        let lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0f));
        let qh = load(b.add(128 + 32 * n));
        let hi = match g {
            0 => qh,
            1 => _mm256_srli_epi16(qh, 2),
            2 => _mm256_srli_epi16(qh, 4),
            _ => _mm256_srli_epi16(qh, 6),
        };
        let hi = _mm256_and_si256(hi, _mm256_set1_epi8(3));
        let q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        let k = 8 * n + 2 * g;
        halves(q, [h[k], h[k + 1]], [-32.0 * h[k], -32.0 * h[k + 1]])
    }
}

/// Block b's headers for R rows (at `w`, `rb` bytes apart), and the next tile's weights
/// asked for ahead: weights stream from memory once per token, and the hardware
/// prefetcher alone leaves the kernels waiting on loads (it follows the tile's R
/// streams poorly, each a row long). A tile's rows lie one after another and the next
/// tile's right after them, so each block's step asks for the same share of the next
/// tile's bytes that it reads of this one: a tile ahead, whatever the rows' length.
/// (A fixed distance ahead within each row, as before, lands on lines the tile is
/// already reading where rows are short, as Gemma's 640-wide output head's: that put
/// Gemma 3's generation at 51 t/s against 94-98, an 8B shape's at 2.5-2.8 against
/// 4.1-4.3.) Plain loops, not closures, in this and the kernels: a closure would not
/// inherit the caller's target features and the intrinsics in it would not be inlined.
#[inline(always)]
unsafe fn headers<D: Decode, const R: usize>(w: *const u8, rb: usize, b: usize) -> [D::Hdr; R] {
    let mut hdr = [D::ZERO; R];
    for (r, h) in hdr.iter_mut().enumerate() {
        *h = D::hdr(w.add(r * rb + b * D::BYTES));
    }
    // Wrapping: the address may lie past the matrix's end; a prefetch never faults.
    let step = R * D::BYTES;
    let next = w.wrapping_add(R * rb + b * step);
    for k in (0..step).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(k) as *const i8);
    }
    hdr
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
unsafe fn tile<D: Decode, U: Udot, const R: usize, const T: usize>(
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
            let mut grp = [Group {
                q: _mm256_setzero_si256(),
                sc: _mm256_setzero_ps(),
                off: [0.0; 2],
            }; R];
            for (r, gr) in grp.iter_mut().enumerate() {
                *gr = D::group(w.add(r * rb + b * D::BYTES), &hdr[r], j);
            }
            for t in 0..T {
                let a = load(qs.add((g * p.n_tokens + t0 + t) * 32));
                let da = _mm256_broadcast_ss(&*dp.add(g * p.stride + t0 + t));
                for r in 0..R {
                    let dot = _mm256_cvtepi32_ps(U::dot(grp[r].q, a));
                    acc[r][t] = _mm256_fmadd_ps(dot, _mm256_mul_ps(grp[r].sc, da), acc[r][t]);
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
                sc[r] = _mm512_castsi512_ps(_mm512_broadcast_i64x4(_mm256_castps_si256(gr.sc)));
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

/// Where a tile's results go: `y[t * ld + r]` for row r and token t.
#[derive(Clone, Copy)]
pub struct Out {
    pub y: *mut f32,
    pub ld: usize,
}

/// Rows `rows` of the matrix at `w` (rows `rb` bytes apart, `nb` blocks each) times
/// every token of `p`, in tiles of RT rows by TT tokens (and smaller at the edges). With
/// TP > 0 (AVX-512 only) whole tiles are [`tile_zmm`]'s of TP token pairs, TT = 2 TP.
#[inline(always)]
unsafe fn rows_times_plan<D: Decode, U: Udot, const RT: usize, const TT: usize, const TP: usize>(
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
    ($name:ident, $feat:literal, $u:ty, $d:ty, $rt:literal, $tt:literal, $tp:literal) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name(w: &[u8], rb: usize, p: &Plan, rows: std::ops::Range<usize>, out: Out) {
            // Never more blocks than both the weight row and the activations hold.
            let nb = (p.n_cols / 32 / <$d>::GROUPS).min(rb / <$d>::BYTES);
            let rows = rows.start..rows.end.min(w.len() / rb.max(1));
            if p.n_tokens < $tt {
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
            // 3 x 8 it replaced).
            entry!($a, "avx2,fma,f16c", Avx2, $d, 4, 2, 0);
            entry!($v, "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni", Vnni, $d, 4, 8, 4);
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

/// The tile kernel for weights of `ty` in `flavor`, or `None` where the row dots are used
/// (float weights; Q8_0 without VNNI, whose byte pairs overflow `maddubs`).
/// Callers must have checked `flavor.available()`.
pub fn kernel(ty: GgmlType, flavor: Flavor) -> Option<TileFn> {
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
        (G::Q8_0, false) => {
            let _ = q8_0_avx2;
            return None;
        }
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
