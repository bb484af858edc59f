//! Weight blocks decoded to the tile kernels' common shape: groups of 32 unsigned bytes
//! `q` with a per-lane scale and a per-half offset, `w = scale * q + offset` (see the
//! module docs of [`super`]). One [`Decode`] per weight type.

use std::arch::x86_64::*;

use super::kernel::Udot;
use crate::cpu::dot::avx2::{bits_to_bytes, f16_at, load, nibbles};
use crate::quant::kquant::unpack_scales_k4;

/// One decoded group: `w = sc * q + off`, both per 16-value half (equal halves unless
/// the type is [`Decode::HALVES`]).
#[derive(Clone, Copy)]
pub(super) struct Group {
    pub q: __m256i,
    pub sc: [f32; 2],
    pub off: [f32; 2],
}

impl Group {
    /// A group of zeros, to fill arrays before the groups are decoded.
    pub const ZERO: Group = Group {
        // SAFETY: `__m256i` is 32 bytes of plain integers; any bit pattern is valid.
        q: unsafe { std::mem::transmute::<[u8; 32], __m256i>([0; 32]) },
        sc: [0.0; 2],
        off: [0.0; 2],
    };

    /// The scales as 8 lanes of the group's i32 sums: lanes 0-3 hold the first half's.
    #[inline(always)]
    pub fn sc_lanes<D: Decode>(&self) -> __m256 {
        // SAFETY: plain register broadcasts, available wherever the kernels run.
        unsafe {
            if D::HALVES {
                _mm256_set_m128(_mm_set1_ps(self.sc[1]), _mm_set1_ps(self.sc[0]))
            } else {
                _mm256_set1_ps(self.sc[0])
            }
        }
    }
}

/// A weight type's blocks, seen as groups of 32.
pub(super) trait Decode {
    const BYTES: usize;
    const GROUPS: usize;
    /// Offsets differ between the halves of a group (Q6_K's 16-value sub-blocks).
    const HALVES: bool = false;
    /// The values are 8-bit, stored plus 128 with an offset of -128 scales (Q8_0): too
    /// wide for the 16-bit sums of AVX2's byte products.
    const WIDE: bool = false;
    /// The offset is this multiple of the scale (-8, -16, -128 for the symmetric types
    /// Q4_0, Q5_0, Q8_0; per half -4 and -32 for Q3_K and Q6_K), or 0 where the offset
    /// is a value of its own.
    const OFF_RATIO: f32 = 0.0;
    /// Blocks of one group whose quants [`Decode::pair`] decodes two rows at a time.
    const PAIRS: bool = false;
    /// Blocks of eight groups whose header holds their scales and offsets as eight
    /// floats each ([`Decode::scales8`]).
    const SCALES8: bool = false;
    /// What a block's groups share, decoded once per block.
    type Hdr: Copy;
    const ZERO: Self::Hdr;
    unsafe fn hdr(b: *const u8) -> Self::Hdr;
    unsafe fn group(b: *const u8, h: &Self::Hdr, j: usize) -> Group;
    /// The quants of two rows' blocks at `b0` and `b1` (types with [`Decode::PAIRS`]):
    /// element h holds values 16h..16h + 16 of `b0`'s block in its low 128 bits and of
    /// `b1`'s in its high 128, as unsigned bytes like [`Group::q`].
    #[inline(always)]
    unsafe fn pair<U: Udot>(_b0: *const u8, _b1: *const u8) -> [__m256i; 2] {
        unreachable!("pair decoding of a type without PAIRS")
    }
    /// The eight groups' scales and offsets held in a header (types with
    /// [`Decode::SCALES8`]).
    fn scales8(_h: &Self::Hdr) -> (&[f32; 8], &[f32; 8]) {
        unreachable!("scales of a type without SCALES8")
    }
}

/// The 16 bytes at `p0` and at `p1` as one register, `p0`'s in the low half.
#[inline(always)]
unsafe fn two_rows(p0: *const u8, p1: *const u8) -> __m256i {
    let lo = _mm256_castsi128_si256(_mm_loadu_si128(p0 as *const __m128i));
    _mm256_inserti128_si256(lo, _mm_loadu_si128(p1 as *const __m128i), 1)
}

/// Two rows' 16 bytes of nibble pairs (at `p0` and `p1`) as [`Decode::pair`] wants
/// them: the low nibbles are a block's first 16 values, the high its last 16.
#[inline(always)]
unsafe fn nibble_pair(p0: *const u8, p1: *const u8) -> [__m256i; 2] {
    let b = two_rows(p0, p1);
    let m = _mm256_set1_epi8(0x0f);
    [
        _mm256_and_si256(b, m),
        _mm256_and_si256(_mm256_srli_epi16(b, 4), m),
    ]
}

/// Two rows' Q5 blocks: nibbles at `NIB` bytes in, the fifth bits (a u32) at `NIB - 4`.
#[inline(always)]
unsafe fn q5_pair<U: Udot, const NIB: usize>(b0: *const u8, b1: *const u8) -> [__m256i; 2] {
    let [lo, hi] = nibble_pair(b0.add(NIB), b1.add(NIB));
    let (h0, h1) = (u32_at(b0.add(NIB - 4)), u32_at(b1.add(NIB - 4)));
    // Bits 0-15 are the first 16 values' fifth bits, 16-31 the last 16's.
    let first = (h0 & 0xffff) | (h1 << 16);
    let last = (h0 >> 16) | (h1 & 0xffff_0000);
    [U::fifth_bits(lo, first), U::fifth_bits(hi, last)]
}

/// Bit i of `x` as byte i: 0x10 when set, 0 when clear.
#[inline(always)]
pub(super) unsafe fn fifth_bits(x: u32) -> __m256i {
    _mm256_and_si256(bits_to_bytes(x), _mm256_set1_epi8(0x10))
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned()
}

#[inline(always)]
fn simple(q: __m256i, d: f32, off: f32) -> Group {
    Group {
        q,
        sc: [d, d],
        off: [off, off],
    }
}

pub(super) struct Q4_0;
impl Decode for Q4_0 {
    const BYTES: usize = 18;
    const GROUPS: usize = 1;
    const OFF_RATIO: f32 = -8.0;
    const PAIRS: bool = true;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        let d = f16_at(b);
        simple(nibbles(b.add(2)), d, Self::OFF_RATIO * d)
    }
    #[inline(always)]
    unsafe fn pair<U: Udot>(b0: *const u8, b1: *const u8) -> [__m256i; 2] {
        nibble_pair(b0.add(2), b1.add(2))
    }
}

pub(super) struct Q4_1;
impl Decode for Q4_1 {
    const BYTES: usize = 20;
    const GROUPS: usize = 1;
    const PAIRS: bool = true;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        simple(nibbles(b.add(4)), f16_at(b), f16_at(b.add(2)))
    }
    #[inline(always)]
    unsafe fn pair<U: Udot>(b0: *const u8, b1: *const u8) -> [__m256i; 2] {
        nibble_pair(b0.add(4), b1.add(4))
    }
}

pub(super) struct Q5_0;
impl Decode for Q5_0 {
    const BYTES: usize = 22;
    const GROUPS: usize = 1;
    const OFF_RATIO: f32 = -16.0;
    const PAIRS: bool = true;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        let d = f16_at(b);
        let q = _mm256_or_si256(nibbles(b.add(6)), fifth_bits(u32_at(b.add(2))));
        simple(q, d, Self::OFF_RATIO * d)
    }
    #[inline(always)]
    unsafe fn pair<U: Udot>(b0: *const u8, b1: *const u8) -> [__m256i; 2] {
        q5_pair::<U, 6>(b0, b1)
    }
}

pub(super) struct Q5_1;
impl Decode for Q5_1 {
    const BYTES: usize = 24;
    const GROUPS: usize = 1;
    const PAIRS: bool = true;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        let q = _mm256_or_si256(nibbles(b.add(8)), fifth_bits(u32_at(b.add(4))));
        simple(q, f16_at(b), f16_at(b.add(2)))
    }
    #[inline(always)]
    unsafe fn pair<U: Udot>(b0: *const u8, b1: *const u8) -> [__m256i; 2] {
        q5_pair::<U, 8>(b0, b1)
    }
}

/// Q8_0 as unsigned bytes: q + 128, offset by -128 d (VNNI only: two such products
/// overflow the i16 of `maddubs`).
pub(super) struct Q8_0;
impl Decode for Q8_0 {
    const BYTES: usize = 34;
    const GROUPS: usize = 1;
    const WIDE: bool = true;
    const OFF_RATIO: f32 = -128.0;
    const PAIRS: bool = true;
    type Hdr = ();
    const ZERO: () = ();
    #[inline(always)]
    unsafe fn hdr(_: *const u8) {}
    #[inline(always)]
    unsafe fn group(b: *const u8, _: &(), _: usize) -> Group {
        let d = f16_at(b);
        let q = _mm256_xor_si256(load(b.add(2)), _mm256_set1_epi8(0x80u8 as i8));
        simple(q, d, Self::OFF_RATIO * d)
    }
    #[inline(always)]
    unsafe fn pair<U: Udot>(b0: *const u8, b1: *const u8) -> [__m256i; 2] {
        let flip = _mm256_set1_epi8(0x80u8 as i8);
        let (b0, b1) = (b0.add(2), b1.add(2));
        [
            _mm256_xor_si256(two_rows(b0, b1), flip),
            _mm256_xor_si256(two_rows(b0.add(16), b1.add(16)), flip),
        ]
    }
}

/// Q4_K and Q5_K: d, dmin, 12 bytes of 6-bit scales and mins, per group of 32.
#[derive(Clone, Copy)]
pub(super) struct KHdr {
    sc: [f32; 8],
    mn: [f32; 8],
}

impl KHdr {
    const ZERO: KHdr = KHdr {
        sc: [0.0; 8],
        mn: [0.0; 8],
    };
}

/// Eight bytes as eight floats times `k`.
#[inline(always)]
unsafe fn scaled_bytes(b: [u8; 8], k: f32) -> [f32; 8] {
    let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
        b,
    ))));
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(v, _mm256_set1_ps(k)));
    out
}

#[inline(always)]
unsafe fn k4_hdr(b: *const u8) -> KHdr {
    let mut raw = [0u8; 12];
    std::ptr::copy_nonoverlapping(b.add(4), raw.as_mut_ptr(), 12);
    let (sc, mn) = unpack_scales_k4(&raw);
    KHdr {
        sc: scaled_bytes(sc, f16_at(b)),
        mn: scaled_bytes(mn, -f16_at(b.add(2))),
    }
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

pub(super) struct Q4K;
impl Decode for Q4K {
    const SCALES8: bool = true;
    const BYTES: usize = 144;
    const GROUPS: usize = 8;
    type Hdr = KHdr;
    const ZERO: KHdr = KHdr::ZERO;
    #[inline(always)]
    unsafe fn hdr(b: *const u8) -> KHdr {
        k4_hdr(b)
    }
    fn scales8(h: &KHdr) -> (&[f32; 8], &[f32; 8]) {
        (&h.sc, &h.mn)
    }
    #[inline(always)]
    unsafe fn group(b: *const u8, h: &KHdr, j: usize) -> Group {
        simple(k_nibbles(b.add(16), j), h.sc[j], h.mn[j])
    }
}

pub(super) struct Q5K;
impl Decode for Q5K {
    const SCALES8: bool = true;
    const BYTES: usize = 176;
    const GROUPS: usize = 8;
    type Hdr = KHdr;
    const ZERO: KHdr = KHdr::ZERO;
    #[inline(always)]
    unsafe fn hdr(b: *const u8) -> KHdr {
        k4_hdr(b)
    }
    fn scales8(h: &KHdr) -> (&[f32; 8], &[f32; 8]) {
        (&h.sc, &h.mn)
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

/// A group's two 16-value halves: per-half scales and offsets.
#[inline(always)]
fn halves(q: __m256i, sc: [f32; 2], off: [f32; 2]) -> Group {
    Group { q, sc, off }
}

/// Q2_K: scales[16] (4-bit scale and min per 16 values), qs[64], f16 d, f16 dmin.
pub(super) struct Q2K;
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
pub(super) struct Q3K;
impl Decode for Q3K {
    const BYTES: usize = 110;
    const GROUPS: usize = 8;
    const HALVES: bool = true;
    const OFF_RATIO: f32 = -4.0;
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
        halves(
            q,
            [h[k], h[k + 1]],
            [Self::OFF_RATIO * h[k], Self::OFF_RATIO * h[k + 1]],
        )
    }
}

/// Q6_K: ql[128], qh[64], i8 scales[16], f16 d; values stored plus 32, a scale per 16.
pub(super) struct Q6K;
impl Decode for Q6K {
    const BYTES: usize = 210;
    const GROUPS: usize = 8;
    const HALVES: bool = true;
    const OFF_RATIO: f32 = -32.0;
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
        halves(
            q,
            [h[k], h[k + 1]],
            [Self::OFF_RATIO * h[k], Self::OFF_RATIO * h[k + 1]],
        )
    }
}

/// How many tiles ahead [`headers`] asks for weights into L2 (2, 4 and 5 measured
/// slower on both models).
const FAR_TILES: usize = 3;

/// Block b's headers for R rows (at `w`, `rb` bytes apart), and the next tile's weights
/// asked for ahead: weights stream from memory once per token, and the hardware
/// prefetcher alone leaves the kernels waiting on loads (it follows the tile's R
/// streams poorly, each a row long). A tile's rows lie one after another and the next
/// tile's right after them, so each block's step asks for the same share of the next
/// tile's bytes that it reads of this one: a tile ahead, whatever the rows' length.
/// (A fixed distance ahead within each row, as before, lands on lines the tile is
/// already reading where rows are short, as Gemma's 640-wide output head's: that put
/// Gemma 3's generation at 51 t/s against 94-98, an 8B shape's at 2.5-2.8 against
/// 4.1-4.3.) The same share of the tile [`FAR_TILES`] ahead is asked for into L2: one
/// tile's lines in flight from memory were too few to keep a core's loads fed (the
/// Q8_0 output head read 30-35 GB/s with them alone, 34-38 with both), while asking
/// that far ahead into L1 alone left each load to wait on L2 (0.55-0.7x). Plain loops,
/// not closures, in this and the kernels: a closure would not inherit the caller's
/// target features and the intrinsics in it would not be inlined.
#[inline(always)]
pub(super) unsafe fn headers<D: Decode, const R: usize>(
    w: *const u8,
    rb: usize,
    b: usize,
) -> [D::Hdr; R] {
    let mut hdr = [D::ZERO; R];
    for (r, h) in hdr.iter_mut().enumerate() {
        *h = D::hdr(w.add(r * rb + b * D::BYTES));
    }
    ask_ahead::<R>(w, rb, b * R * D::BYTES, R * D::BYTES);
    hdr
}

/// The bytes `at .. at + len` of the next tile of R rows (at `w`, `rb` bytes apart)
/// asked for into L1, and the same bytes [`FAR_TILES`] tiles ahead into L2: a kernel's
/// step reading `len` bytes of its tile's rows asks for as many of the tiles ahead
/// (see [`headers`]).
#[inline(always)]
pub(super) unsafe fn ask_ahead<const R: usize>(w: *const u8, rb: usize, at: usize, len: usize) {
    // Wrapping: the address may lie past the matrix's end; a prefetch never faults.
    let next = w.wrapping_add(R * rb + at);
    let far = w.wrapping_add(FAR_TILES * R * rb + at);
    for k in (0..len).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(k) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(far.wrapping_add(k) as *const i8);
    }
}
