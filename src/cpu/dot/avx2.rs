//! AVX2 + FMA + F16C dot products (x86_64). Each kernel is an `unsafe` function compiled
//! for those features behind a safe wrapper that [`super::kernel`] hands out only after
//! run-time detection. Blocks are read with unaligned loads straight from the rows; the
//! block count is the smaller of the two rows', so no load passes a row's end.
//!
//! The integer core is the usual one: `maddubs` multiplies unsigned bytes by signed
//! bytes into pairs of i16, `madd` with ones (or with a sub-block scale) widens to i32.
//! For signed weights the sign of the weight is moved onto the activation first.

use std::arch::x86_64::*;

use super::DotFn;
use crate::quant::kquant::scale_min_k4;
use crate::quant::GgmlType;

/// The AVX2 kernel for `ty`, or `None` where the scalar one is used.
pub fn kernel(ty: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    // SAFETY (all wrappers): only reachable through `super::kernel`, which checks that
    // the CPU has AVX2, FMA and F16C.
    Some(match ty {
        F32 => |w, a| unsafe { dot_f32(w, a) },
        F16 => |w, a| unsafe { dot_f16(w, a) },
        BF16 => |w, a| unsafe { dot_bf16(w, a) },
        Q4_0 => |w, a| unsafe { q4_0(w, a) },
        Q4_1 => |w, a| unsafe { q4_1(w, a) },
        Q5_0 => |w, a| unsafe { q5_0(w, a) },
        Q5_1 => |w, a| unsafe { q5_1(w, a) },
        Q8_0 => |w, a| unsafe { q8_0(w, a) },
        Q4_K => |w, a| unsafe { q4_k(w, a) },
        Q5_K => |w, a| unsafe { q5_k(w, a) },
        Q6_K => |w, a| unsafe { q6_k(w, a) },
        Q2_K | Q3_K | Q8_1 | Q8_K => return None,
    })
}

/// Blocks both rows hold whole.
#[inline(always)]
fn n_blocks(w: &[u8], ws: usize, a: &[u8], as_: usize) -> usize {
    (w.len() / ws).min(a.len() / as_)
}

/// The f16 at `p` as f32, with F16C (a library conversion would check the CPU's
/// features on every call, which costs more than the block's arithmetic).
#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Unsigned bytes times signed bytes, summed into 8 i32 lanes, as floats.
#[inline(always)]
unsafe fn mul_sum_us8(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)))
}

/// Signed bytes times signed bytes (|x| < 128), summed into 8 lanes, as floats.
#[inline(always)]
unsafe fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
    mul_sum_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// 16 bytes of nibble pairs as 32 bytes: low nibbles in the low lane, high in the high.
#[inline(always)]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let b = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    _mm256_and_si256(b, _mm256_set1_epi8(0x0f))
}

/// Bit i of `x` as byte i: 0xff when set, 0 when clear.
#[inline(always)]
pub(crate) unsafe fn bits_to_bytes(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let b = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64));
    _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1))
}

#[inline(always)]
pub(crate) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    let n = (w.len() / 4).min(a.len() / 4);
    let (wp, ap) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let x = _mm256_loadu_ps(wp.add(i + 8 * k));
            *acc = _mm256_fmadd_ps(x, _mm256_loadu_ps(ap.add(i + 8 * k)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(wp.add(i)),
            _mm256_loadu_ps(ap.add(i)),
            acc[0],
        );
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(v);
    while i < n {
        s += wp.add(i).read_unaligned() * ap.add(i).read_unaligned();
        i += 1;
    }
    s
}

/// Shared loop of the 16-bit float types; `cvt` turns 8 halves into 8 floats.
#[inline(always)]
unsafe fn dot_half(
    w: &[u8],
    a: &[u8],
    cvt: impl Fn(__m128i) -> __m256,
    one: impl Fn(u16) -> f32,
) -> f32 {
    let n = (w.len() / 2).min(a.len() / 4);
    let (wp, ap) = (w.as_ptr(), a.as_ptr() as *const f32);
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        let x0 = cvt(_mm_loadu_si128(wp.add(2 * i) as *const __m128i));
        let x1 = cvt(_mm_loadu_si128(wp.add(2 * i + 16) as *const __m128i));
        acc0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(ap.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(ap.add(i + 8)), acc1);
        i += 16;
    }
    let mut s = hsum(_mm256_add_ps(acc0, acc1));
    while i < n {
        let bits = u16::from_le_bytes([*wp.add(2 * i), *wp.add(2 * i + 1)]);
        s += one(bits) * ap.add(i).read_unaligned();
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    dot_half(
        w,
        a,
        |h| _mm256_cvtph_ps(h),
        |b| _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(b as i32))),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    dot_half(
        w,
        a,
        |h| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)),
        |b| f32::from_bits((b as u32) << 16),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 18, a, 34);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wb, ab) = (wp.add(18 * i), ap.add(34 * i));
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(ab));
        let q = _mm256_sub_epi8(nibbles(wb.add(2)), _mm256_set1_epi8(8));
        acc = _mm256_fmadd_ps(d, mul_sum_i8(q, load(ab.add(2))), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 20, a, 36);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (wp.add(20 * i), ap.add(36 * i));
        mins += f16_at(wb.add(2)) * f16_at(ab.add(2));
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(ab));
        acc = _mm256_fmadd_ps(d, mul_sum_us8(nibbles(wb.add(4)), load(ab.add(4))), acc);
    }
    hsum(acc) + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 22, a, 34);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wb, ab) = (wp.add(22 * i), ap.add(34 * i));
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(ab));
        let qh = u32::from_le_bytes([*wb.add(2), *wb.add(3), *wb.add(4), *wb.add(5)]);
        // A clear fifth bit means q - 16: set the byte's high nibble, making it negative.
        let hi = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(0xf0u8 as i8));
        let q = _mm256_or_si256(nibbles(wb.add(6)), hi);
        acc = _mm256_fmadd_ps(d, mul_sum_i8(q, load(ab.add(2))), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 24, a, 36);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (wp.add(24 * i), ap.add(36 * i));
        mins += f16_at(wb.add(2)) * f16_at(ab.add(2));
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(ab));
        let qh = u32::from_le_bytes([*wb.add(4), *wb.add(5), *wb.add(6), *wb.add(7)]);
        let hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
        let q = _mm256_or_si256(nibbles(wb.add(8)), hi);
        acc = _mm256_fmadd_ps(d, mul_sum_us8(q, load(ab.add(4))), acc);
    }
    hsum(acc) + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 34, a, 34);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wb, ab) = (wp.add(34 * i), ap.add(34 * i));
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(ab));
        acc = _mm256_fmadd_ps(d, mul_sum_i8(load(wb.add(2)), load(ab.add(2))), acc);
    }
    hsum(acc)
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
/// bytes for Q5_K, or is null for Q4_K. Adds the block's scaled sum to `acc` and returns
/// the (already scaled) min term.
#[inline(always)]
unsafe fn k4_like(
    wb: *const u8,
    qh: *const u8,
    qs: *const u8,
    ab: *const u8,
    acc: &mut __m256,
) -> f32 {
    let mut sc = [0u8; 12];
    std::ptr::copy_nonoverlapping(wb.add(4), sc.as_mut_ptr(), 12);
    let da = q8k_d(ab);
    let mut msum = 0i32;
    let mut sums = _mm256_setzero_si256();
    let low = _mm256_set1_epi8(0x0f);
    let hbits = if qh.is_null() {
        _mm256_setzero_si256()
    } else {
        load(qh)
    };
    for k in 0..4 {
        let (s0, m0) = scale_min_k4(2 * k, &sc);
        let (s1, m1) = scale_min_k4(2 * k + 1, &sc);
        msum += m0 as i32 * (q8k_bsum(ab, 4 * k) + q8k_bsum(ab, 4 * k + 1));
        msum += m1 as i32 * (q8k_bsum(ab, 4 * k + 2) + q8k_bsum(ab, 4 * k + 3));
        let q = load(qs.add(32 * k));
        let mut q0 = _mm256_and_si256(q, low);
        let mut q1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        if !qh.is_null() {
            let b0 = _mm256_set1_epi8((1u8 << (2 * k)) as i8);
            let b1 = _mm256_set1_epi8((1u8 << (2 * k + 1)) as i8);
            let h0 = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, b0), b0);
            let h1 = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, b1), b1);
            q0 = _mm256_or_si256(q0, _mm256_and_si256(h0, _mm256_set1_epi8(0x10)));
            q1 = _mm256_or_si256(q1, _mm256_and_si256(h1, _mm256_set1_epi8(0x10)));
        }
        let a0 = load(ab.add(4 + 64 * k));
        let a1 = load(ab.add(4 + 64 * k + 32));
        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q0, a0), _mm256_set1_epi16(s0 as i16));
        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q1, a1), _mm256_set1_epi16(s1 as i16));
        sums = _mm256_add_epi32(sums, _mm256_add_epi32(p0, p1));
    }
    let d = _mm256_set1_ps(f16_at(wb) * da);
    *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), *acc);
    -f16_at(wb.add(2)) * da * msum as f32
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 144, a, 292);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for i in 0..nb {
        let wb = wp.add(144 * i);
        mins += k4_like(wb, std::ptr::null(), wb.add(16), ap.add(292 * i), &mut acc);
    }
    hsum(acc) + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 176, a, 292);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for i in 0..nb {
        let wb = wp.add(176 * i);
        mins += k4_like(wb, wb.add(16), wb.add(48), ap.add(292 * i), &mut acc);
    }
    hsum(acc) + mins
}

/// Q6_K: ql[128] at 0, qh[64] at 128, i8 scales[16] at 192, f16 d at 208. Values are
/// stored plus 32; the maddubs works on the unsigned values and the 32 times the
/// activation sums is taken off afterwards through the Q8_K block sums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, 210, a, 292);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let low = _mm256_set1_epi8(0x0f);
    let three = _mm256_set1_epi8(3);
    for i in 0..nb {
        let (wb, ab) = (wp.add(210 * i), ap.add(292 * i));
        let sc = |j: usize| *wb.add(192 + j) as i8 as i32;
        let mut bias = 0i32;
        for j in 0..16 {
            bias += sc(j) * q8k_bsum(ab, j);
        }
        let mut sums = _mm256_setzero_si256();
        for n in 0..2 {
            let ql0 = load(wb.add(64 * n));
            let ql1 = load(wb.add(64 * n + 32));
            let qh = load(wb.add(128 + 32 * n));
            let lows = [
                _mm256_and_si256(ql0, low),
                _mm256_and_si256(ql1, low),
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
            ];
            for (g, lo) in lows.into_iter().enumerate() {
                let hi = match g {
                    0 => _mm256_and_si256(qh, three),
                    1 => _mm256_and_si256(_mm256_srli_epi16(qh, 2), three),
                    2 => _mm256_and_si256(_mm256_srli_epi16(qh, 4), three),
                    _ => _mm256_and_si256(_mm256_srli_epi16(qh, 6), three),
                };
                let q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                let av = load(ab.add(4 + 128 * n + 32 * g));
                let s = 8 * n + 2 * g;
                let scv = _mm256_set_m128i(
                    _mm_set1_epi16(sc(s + 1) as i16),
                    _mm_set1_epi16(sc(s) as i16),
                );
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), scv);
                sums = _mm256_add_epi32(sums, p);
            }
        }
        let d = f16_at(wb.add(208)) * q8k_d(ab);
        let sums = _mm256_sub_epi32(sums, _mm256_setr_epi32(32 * bias, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
    }
    hsum(acc)
}
