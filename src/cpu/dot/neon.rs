//! NEON dot products (little-endian aarch64), in two builds of the integer kernels: one
//! on the `sdot` instruction (the `dotprod` extension, Armv8.2 and later: Cortex-A55/A76,
//! Neoverse, Apple M), one on plain NEON widening multiplies for the Armv8.0 cores that
//! lack it (Cortex-A53/A57/A72, the Raspberry Pi 3 and 4). The float kernels need only
//! NEON, which every aarch64 CPU has. As in [`super::avx2`], each kernel is an `unsafe`
//! function compiled for its features behind a safe wrapper that [`super::kernel`] hands
//! out only after run-time detection; blocks are read with unaligned byte loads, and the
//! block count is the smaller of the two rows', so no load passes a row's end.
//!
//! The integer kernels return exactly what [`super::scalar`] returns: a block's (or
//! K-quant sub-block's) sum is an exact integer, and the float arithmetic per block is
//! the scalar kernel's, in its order. So the `sdot` and plain builds agree bit for bit
//! and a model's output does not depend on which aarch64 core runs it. That matters
//! because a quantized model can sit close enough to a tie between two tokens that
//! float rounding in the dots decides it (the fifth greedy token of Gemma 3 270M in
//! the CPU tests is such a case). The float kernels sum in vector lanes, so they
//! differ from the scalar ones by rounding (and are the same code in both builds).
//!
//! Two instructions come through inline assembly because their intrinsics are not
//! stable at the crate's MSRV (1.89): `sdot` (`vdotq_s32` is still unstable) and the
//! f16 to f32 conversion `fcvtl`/`fcvt` (`vcvt_f32_f16` is stable from 1.94 only).

use std::arch::aarch64::*;
use std::arch::asm;

use super::DotFn;
use crate::quant::kquant::scale_min_k4;
use crate::quant::GgmlType;

/// The NEON kernel for `ty`, on `sdot` when `dotprod`, or `None` where the scalar one
/// is used.
pub fn kernel(ty: GgmlType, dotprod: bool) -> Option<DotFn> {
    use GgmlType::*;
    // SAFETY (all wrappers): only reachable through `super::kernel`, which checks that
    // the CPU has NEON (and the dot-product instructions for `sdot`'s kernels).
    let float: DotFn = match ty {
        F32 => |w, a| unsafe { dot_f32(w, a) },
        F16 => |w, a| unsafe { dot_f16(w, a) },
        BF16 => |w, a| unsafe { dot_bf16(w, a) },
        _ if dotprod => return sdot::kernel(ty),
        _ => return mull::kernel(ty),
    };
    Some(float)
}

/// Sixteen signed byte products added into the four i32 lanes of `acc`. Which lane a
/// product lands in differs between the implementations; every caller scales or sums
/// all four lanes alike.
trait Dot {
    unsafe fn dot(acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t;
}

/// `sdot`: each lane adds the four products of its bytes.
struct Sdot;

/// Plain NEON: `smull` into i16 products (|x y| <= 2^14, so no overflow), `sadalp` adds
/// neighbouring pairs into the i32 lanes.
struct Mull;

impl Dot for Sdot {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t {
        sdot_asm(acc, x, y)
    }
}

impl Dot for Mull {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(x), vget_low_s8(y));
        let hi = vmull_high_s8(x, y);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// `sdot` in assembly (see the module comment). Carries the `dotprod` feature itself:
/// the assembler accepts the instruction only in functions compiled with it, and the
/// kernels that inline this one all are.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot_asm(mut acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t {
    asm!(
        "sdot {acc:v}.4s, {x:v}.16b, {y:v}.16b",
        acc = inout(vreg) acc,
        x = in(vreg) x,
        y = in(vreg) y,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// The integer kernels built on one [`Dot`], as `unsafe` functions compiled for
/// `$features`, with the table of safe wrappers [`kernel`] hands out.
macro_rules! integer_kernels {
    ($m:ident, $features:literal, $dot:ty) => {
        mod $m {
            use super::*;
            integer_kernels!(@fns $features, $dot;
                Q4_0 q4_0, Q4_1 q4_1, Q5_0 q5_0, Q5_1 q5_1, Q8_0 q8_0,
                Q4_K q4_k, Q5_K q5_k, Q6_K q6_k);
        }
    };
    (@fns $features:literal, $dot:ty; $($t:ident $f:ident),*) => {
        pub fn kernel(ty: GgmlType) -> Option<DotFn> {
            // SAFETY: see `super::kernel`.
            Some(match ty {
                $(GgmlType::$t => |w, a| unsafe { $f(w, a) },)*
                _ => return None,
            })
        }
        $(
            #[target_feature(enable = $features)]
            unsafe fn $f(w: &[u8], a: &[u8]) -> f32 {
                super::$f::<$dot>(w, a)
            }
        )*
    };
}

integer_kernels!(sdot, "neon,dotprod", Sdot);
integer_kernels!(mull, "neon", Mull);

/// Blocks both rows hold whole.
#[inline(always)]
fn n_blocks(w: &[u8], ws: usize, a: &[u8], as_: usize) -> usize {
    (w.len() / ws).min(a.len() / as_)
}

/// An f16's bits as f32, by the base FP instruction (the `half` crate's conversion
/// checks the CPU's features on every call, which costs more than a block's arithmetic).
#[inline(always)]
unsafe fn f16_to_f32(bits: u16) -> f32 {
    let out: f32;
    asm!(
        "fcvt {o:s}, {h:h}",
        o = lateout(vreg) out,
        h = in(vreg) bits,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    f16_to_f32(u16::from_le_bytes([*p, *p.add(1)]))
}

/// Four f16s as f32s.
#[inline(always)]
unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    asm!(
        "fcvtl {o:v}.4s, {h:v}.4h",
        o = lateout(vreg) out,
        h = in(vreg) h,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

/// Four bf16s as f32s: the bits moved to the top half.
#[inline(always)]
unsafe fn bf16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
}

// Loads go through bytes, which need no alignment (the rows are byte slices at any
// offset of the file map or the activation buffer).
#[inline(always)]
unsafe fn ld_u8(p: *const u8) -> uint8x16_t {
    vld1q_u8(p)
}

#[inline(always)]
unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    vreinterpretq_s8_u8(vld1q_u8(p))
}

#[inline(always)]
unsafe fn ld_f32(p: *const u8) -> float32x4_t {
    vreinterpretq_f32_u8(vld1q_u8(p))
}

#[inline(always)]
unsafe fn s8(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

#[target_feature(enable = "neon")]
unsafe fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    let n = (w.len() / 4).min(a.len() / 4);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let o = 4 * (i + 4 * k);
            *acc = vfmaq_f32(*acc, ld_f32(wp.add(o)), ld_f32(ap.add(o)));
        }
        i += 16;
    }
    while i + 4 <= n {
        acc[0] = vfmaq_f32(acc[0], ld_f32(wp.add(4 * i)), ld_f32(ap.add(4 * i)));
        i += 4;
    }
    let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    let mut s = vaddvq_f32(v);
    while i < n {
        let (x, y) = (wp.add(4 * i), ap.add(4 * i));
        s += f32::from_le_bytes([*x, *x.add(1), *x.add(2), *x.add(3)])
            * f32::from_le_bytes([*y, *y.add(1), *y.add(2), *y.add(3)]);
        i += 1;
    }
    s
}

/// Shared loop of the 16-bit float types; `cvt` turns 4 halves into 4 floats, `one`
/// converts the tail's single values.
#[inline(always)]
unsafe fn dot_half(
    w: &[u8],
    a: &[u8],
    cvt: impl Fn(uint16x4_t) -> float32x4_t,
    one: impl Fn(u16) -> f32,
) -> f32 {
    let n = (w.len() / 2).min(a.len() / 4);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        let h0 = vreinterpretq_u16_u8(ld_u8(wp.add(2 * i)));
        let h1 = vreinterpretq_u16_u8(ld_u8(wp.add(2 * i + 16)));
        let x = [
            cvt(vget_low_u16(h0)),
            cvt(vget_high_u16(h0)),
            cvt(vget_low_u16(h1)),
            cvt(vget_high_u16(h1)),
        ];
        for (k, (acc, x)) in acc.iter_mut().zip(x).enumerate() {
            *acc = vfmaq_f32(*acc, x, ld_f32(ap.add(4 * (i + 4 * k))));
        }
        i += 16;
    }
    let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    let mut s = vaddvq_f32(v);
    while i < n {
        let bits = u16::from_le_bytes([*wp.add(2 * i), *wp.add(2 * i + 1)]);
        let y = ap.add(4 * i);
        s += one(bits) * f32::from_le_bytes([*y, *y.add(1), *y.add(2), *y.add(3)]);
        i += 1;
    }
    s
}

#[target_feature(enable = "neon")]
unsafe fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    dot_half(w, a, |h| f16x4_to_f32(h), |b| f16_to_f32(b))
}

#[target_feature(enable = "neon")]
unsafe fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    dot_half(
        w,
        a,
        |h| bf16x4_to_f32(h),
        |b| f32::from_bits((b as u32) << 16),
    )
}

/// 16 bytes of nibble pairs as values 0..16 (low nibbles) and 16..32 (high nibbles).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let b = ld_u8(p);
    (vandq_u8(b, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(b))
}

/// Bit i of `x` as byte i, for bits 0..16 and 16..32: 0xff when set, 0 when clear.
#[inline(always)]
unsafe fn bits_to_bytes(x: u32) -> (uint8x16_t, uint8x16_t) {
    const BIT: u64 = 0x8040_2010_0804_0201;
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(BIT));
    let [b0, b1, b2, b3] = x.to_le_bytes();
    let lo = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    let hi = vcombine_u8(vdup_n_u8(b2), vdup_n_u8(b3));
    (vtstq_u8(lo, bit), vtstq_u8(hi, bit))
}

/// Two vectors of 16 signed values (one block of 32) times the 32 activations at `a`.
/// The block kernels reduce this to one integer and take the scalar kernel's float
/// steps from there (see the module comment).
#[inline(always)]
unsafe fn dot32<D: Dot>(x0: int8x16_t, x1: int8x16_t, a: *const u8) -> int32x4_t {
    D::dot(D::dot(vdupq_n_s32(0), x0, ld_s8(a)), x1, ld_s8(a.add(16)))
}

#[inline(always)]
unsafe fn q4_0<D: Dot>(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 18, a, 34);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let eight = vdupq_n_s8(8);
    let mut s = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (wp.add(18 * i), ap.add(34 * i));
        let (lo, hi) = nibbles(wb.add(2));
        let (lo, hi) = (vsubq_s8(s8(lo), eight), vsubq_s8(s8(hi), eight));
        let p = dot32::<D>(lo, hi, ab.add(2));
        s += vaddvq_s32(p) as f32 * f16_at(wb) * f16_at(ab);
    }
    s
}

#[inline(always)]
unsafe fn q4_1<D: Dot>(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 20, a, 36);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut s = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (wp.add(20 * i), ap.add(36 * i));
        let (lo, hi) = nibbles(wb.add(4));
        let p = dot32::<D>(s8(lo), s8(hi), ab.add(4));
        s += vaddvq_s32(p) as f32 * f16_at(wb) * f16_at(ab) + f16_at(wb.add(2)) * f16_at(ab.add(2));
    }
    s
}

#[inline(always)]
unsafe fn q5_0<D: Dot>(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 22, a, 34);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let high = vdupq_n_u8(0xf0);
    let mut s = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (wp.add(22 * i), ap.add(34 * i));
        let qh = u32::from_le_bytes([*wb.add(2), *wb.add(3), *wb.add(4), *wb.add(5)]);
        let (h0, h1) = bits_to_bytes(qh);
        let (lo, hi) = nibbles(wb.add(6));
        // A clear fifth bit means q - 16: set the byte's high nibble, making it negative.
        let lo = vorrq_u8(lo, vbicq_u8(high, h0));
        let hi = vorrq_u8(hi, vbicq_u8(high, h1));
        let p = dot32::<D>(s8(lo), s8(hi), ab.add(2));
        s += vaddvq_s32(p) as f32 * f16_at(wb) * f16_at(ab);
    }
    s
}

#[inline(always)]
unsafe fn q5_1<D: Dot>(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 24, a, 36);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let fifth = vdupq_n_u8(0x10);
    let mut s = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (wp.add(24 * i), ap.add(36 * i));
        let qh = u32::from_le_bytes([*wb.add(4), *wb.add(5), *wb.add(6), *wb.add(7)]);
        let (h0, h1) = bits_to_bytes(qh);
        let (lo, hi) = nibbles(wb.add(8));
        let lo = vorrq_u8(lo, vandq_u8(h0, fifth));
        let hi = vorrq_u8(hi, vandq_u8(h1, fifth));
        let p = dot32::<D>(s8(lo), s8(hi), ab.add(4));
        s += vaddvq_s32(p) as f32 * f16_at(wb) * f16_at(ab) + f16_at(wb.add(2)) * f16_at(ab.add(2));
    }
    s
}

#[inline(always)]
unsafe fn q8_0<D: Dot>(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 34, a, 34);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut s = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (wp.add(34 * i), ap.add(34 * i));
        let p = dot32::<D>(ld_s8(wb.add(2)), ld_s8(wb.add(18)), ab.add(2));
        s += vaddvq_s32(p) as f32 * f16_at(wb) * f16_at(ab);
    }
    s
}

/// Q8_K block fields: f32 scale at 0, 256 i8 at 4, 16 i16 sums at 260.
#[inline(always)]
unsafe fn q8k_d(ab: *const u8) -> f32 {
    f32::from_le_bytes([*ab, *ab.add(1), *ab.add(2), *ab.add(3)])
}

#[inline(always)]
unsafe fn q8k_bsum(ab: *const u8, j: usize) -> i32 {
    i16::from_le_bytes([*ab.add(260 + 2 * j), *ab.add(261 + 2 * j)]) as i32
}

/// Q4_K and Q5_K share everything but the fifth bit: `qh` points at the 32 high-bit
/// bytes for Q5_K. Block sums stay integers (at most 8 x 63 x 32 x 31 x 127 < 2^31)
/// until the one float multiply-add per block, the scalar kernel's.
#[inline(always)]
unsafe fn k4_like<D: Dot>(
    wb: *const u8,
    qh: Option<*const u8>,
    qs: *const u8,
    ab: *const u8,
) -> f32 {
    let mut sc = [0u8; 12];
    std::ptr::copy_nonoverlapping(wb.add(4), sc.as_mut_ptr(), 12);
    let low = vdupq_n_u8(0x0f);
    let (one, two) = (vdupq_n_u8(1), vdupq_n_u8(2));
    // The high bits of values l and 16 + l of each sub-block; each pair of sub-blocks
    // takes the lowest two bits and shifts the rest down.
    let mut hb = qh.map(|p| (ld_u8(p), ld_u8(p.add(16))));
    let mut msum = 0i32;
    let mut sums = vdupq_n_s32(0);
    for k in 0..4 {
        let (s0, m0) = scale_min_k4(2 * k, &sc);
        let (s1, m1) = scale_min_k4(2 * k + 1, &sc);
        msum += m0 as i32 * (q8k_bsum(ab, 4 * k) + q8k_bsum(ab, 4 * k + 1));
        msum += m1 as i32 * (q8k_bsum(ab, 4 * k + 2) + q8k_bsum(ab, 4 * k + 3));
        // Sub-block 2k is the low nibbles of these 32 bytes, 2k + 1 the high ones.
        let (b0, b1) = (ld_u8(qs.add(32 * k)), ld_u8(qs.add(32 * k + 16)));
        let mut q = [
            vandq_u8(b0, low),
            vandq_u8(b1, low),
            vshrq_n_u8::<4>(b0),
            vshrq_n_u8::<4>(b1),
        ];
        if let Some((h0, h1)) = hb.as_mut() {
            q[0] = vorrq_u8(q[0], vshlq_n_u8::<4>(vandq_u8(*h0, one)));
            q[1] = vorrq_u8(q[1], vshlq_n_u8::<4>(vandq_u8(*h1, one)));
            q[2] = vorrq_u8(q[2], vshlq_n_u8::<3>(vandq_u8(*h0, two)));
            q[3] = vorrq_u8(q[3], vshlq_n_u8::<3>(vandq_u8(*h1, two)));
            *h0 = vshrq_n_u8::<2>(*h0);
            *h1 = vshrq_n_u8::<2>(*h1);
        }
        let a = ab.add(4 + 64 * k);
        let p0 = dot32::<D>(s8(q[0]), s8(q[1]), a);
        let p1 = dot32::<D>(s8(q[2]), s8(q[3]), a.add(32));
        sums = vmlaq_n_s32(vmlaq_n_s32(sums, p0, s0 as i32), p1, s1 as i32);
    }
    let isum = vaddvq_s32(sums);
    q8k_d(ab) * (f16_at(wb) * isum as f32 - f16_at(wb.add(2)) * msum as f32)
}

#[inline(always)]
unsafe fn q4_k<D: Dot>(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 144, a, 292);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut s = 0.0f32;
    for i in 0..nb {
        let wb = wp.add(144 * i);
        s += k4_like::<D>(wb, None, wb.add(16), ap.add(292 * i));
    }
    s
}

#[inline(always)]
unsafe fn q5_k<D: Dot>(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 176, a, 292);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut s = 0.0f32;
    for i in 0..nb {
        let wb = wp.add(176 * i);
        s += k4_like::<D>(wb, Some(wb.add(16)), wb.add(48), ap.add(292 * i));
    }
    s
}

/// Q6_K: ql[128] at 0, qh[64] at 128, i8 scales[16] at 192, f16 d at 208. Values are
/// stored plus 32; taking the 32 off in bytes leaves signed values for the dot product.
/// Each 16-byte vector is one sub-block of 16, so its scale applies to all four lanes.
/// Block sums stay integers (at most 16 x 128 x 32 x 16 x 127 < 2^31).
#[inline(always)]
unsafe fn q6_k<D: Dot>(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 210, a, 292);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let low = vdupq_n_u8(0x0f);
    let three = vdupq_n_u8(3);
    let m32 = vdupq_n_s8(32);
    let mut s = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (wp.add(210 * i), ap.add(292 * i));
        let sc = |j: usize| *wb.add(192 + j) as i8 as i32;
        let mut sums = vdupq_n_s32(0);
        // Half n holds values 128n..128n + 128 in ql[64n..], qh[32n..]; value
        // 128n + 32g + l takes nibble g / 2 of ql[64n + 32 (g % 2) + l] and bits
        // 2g, 2g + 1 of qh[32n + l]. `h` picks l's 16-value halves.
        for n in 0..2 {
            let (ql, qh) = (wb.add(64 * n), wb.add(128 + 32 * n));
            for h in 0..2 {
                let ql0 = ld_u8(ql.add(16 * h));
                let ql1 = ld_u8(ql.add(32 + 16 * h));
                let qhv = ld_u8(qh.add(16 * h));
                let q = [
                    vorrq_u8(vandq_u8(ql0, low), vshlq_n_u8::<4>(vandq_u8(qhv, three))),
                    vorrq_u8(
                        vandq_u8(ql1, low),
                        vshlq_n_u8::<2>(vandq_u8(qhv, vdupq_n_u8(0x0c))),
                    ),
                    vorrq_u8(vshrq_n_u8::<4>(ql0), vandq_u8(qhv, vdupq_n_u8(0x30))),
                    vorrq_u8(vshrq_n_u8::<4>(ql1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qhv))),
                ];
                for (g, q) in q.into_iter().enumerate() {
                    let av = ld_s8(ab.add(4 + 128 * n + 32 * g + 16 * h));
                    let p = D::dot(vdupq_n_s32(0), vsubq_s8(s8(q), m32), av);
                    sums = vmlaq_n_s32(sums, p, sc(8 * n + 2 * g + h));
                }
            }
        }
        s += q8k_d(ab) * f16_at(wb.add(208)) * vaddvq_s32(sums) as f32;
    }
    s
}
