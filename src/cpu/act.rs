//! Activations quantized for the integer dot products, once per op: every weight type
//! pairs with the activation type its kernel multiplies against (ggml's `vec_dot_type`).

use super::pool::{Pool, SharedMut};
use crate::quant::kquant::QK_K;
use crate::quant::GgmlType;
use crate::{Error, Result};
use half::f16;

/// How activations are stored for a weight type's dot product (named after the ggml types).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActType {
    /// Plain f32 (float weights).
    F32,
    /// 34-byte blocks of 32: f16 scale, 32 i8.
    Q8_0,
    /// 36-byte blocks of 32: f16 scale, f16 scale times sum, 32 i8 (weights with a min).
    Q8_1,
    /// 292-byte blocks of 256: f32 scale, 256 i8, 16 i16 sums of 16 (K-quants).
    Q8_K,
}

impl ActType {
    /// The activation type weights of `ty` are multiplied with.
    pub fn for_weight(ty: GgmlType) -> Result<ActType> {
        use GgmlType::*;
        Ok(match ty {
            F32 | F16 | BF16 => ActType::F32,
            Q4_0 | Q5_0 | Q8_0 => ActType::Q8_0,
            Q4_1 | Q5_1 => ActType::Q8_1,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => ActType::Q8_K,
            Q8_1 | Q8_K => {
                return Err(Error::Unsupported(format!(
                    "{ty} is an activation format, not a weight type the CPU multiplies"
                )))
            }
        })
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            ActType::F32 => 1,
            ActType::Q8_0 | ActType::Q8_1 => 32,
            ActType::Q8_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            ActType::F32 => 4,
            ActType::Q8_0 => 34,
            ActType::Q8_1 => 36,
            ActType::Q8_K => 292,
        }
    }

    /// Bytes of a row of `n` values (`n` a whole number of blocks).
    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.block_bytes()
    }
}

/// Quantizes `n_rows` rows of `n` values from `x` ([n, n_rows]) into `out`, which is
/// resized (its capacity kept between calls) to `n_rows * row_bytes(n)`.
pub fn quantize_rows(at: ActType, x: &[f32], n: usize, out: &mut Vec<u8>) -> Result<()> {
    resize_for(at, x, n, out)?;
    quantize_into(at, x, out);
    Ok(())
}

/// [`quantize_rows`] with the rows spread over the pool's threads (a prompt's
/// activations are quantized once per op, and alone that is a few percent of its time).
pub fn quantize_rows_on(
    pool: &Pool,
    at: ActType,
    x: &[f32],
    n: usize,
    out: &mut Vec<u8>,
) -> Result<()> {
    resize_for(at, x, n, out)?;
    let (n_rows, rb) = (x.len() / n, at.row_bytes(n));
    if n_rows < 2 * pool.n_threads() {
        quantize_into(at, x, out);
        return Ok(());
    }
    let chunk = n_rows.div_ceil(4 * pool.n_threads());
    let o = SharedMut::new(out.as_mut_slice());
    pool.run_items(n_rows.div_ceil(chunk), &|_, c| {
        let rows = c * chunk..((c + 1) * chunk).min(n_rows);
        // SAFETY: every chunk of rows is one thread's, and so are its output bytes.
        let part = unsafe { o.slice(rows.start * rb, rows.len() * rb) };
        quantize_into(at, &x[rows.start * n..rows.end * n], part);
    });
    Ok(())
}

/// Checks the shape and sizes `out` for [`quantize_into`].
fn resize_for(at: ActType, x: &[f32], n: usize, out: &mut Vec<u8>) -> Result<()> {
    let bs = at.block_size();
    if n == 0 || n % bs != 0 || x.len() % n != 0 {
        return Err(Error::invalid(format!(
            "cannot quantize {} values in rows of {n} to {at:?} blocks of {bs}",
            x.len()
        )));
    }
    out.clear();
    out.resize(x.len() / n * at.row_bytes(n), 0);
    Ok(())
}

/// Quantizes whole rows of `x` into `out` (sized by [`resize_for`]), in 256-bit vector
/// code where the CPU has it (the results are the same bits either way: the arithmetic
/// is elementwise and never fused).
fn quantize_into(at: ActType, x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has AVX2 and F16C, checked just above.
        return unsafe { quantize_avx2(at, x, out) };
    }
    quantize_blocks(at, x, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn quantize_avx2(at: ActType, x: &[f32], out: &mut [u8]) {
    match at {
        ActType::Q8_0 | ActType::Q8_1 => {
            let bb = at.block_bytes();
            for (o, xs) in out.chunks_exact_mut(bb).zip(x.chunks_exact(32)) {
                simd::q8_block(xs, o, at == ActType::Q8_1);
            }
        }
        ActType::Q8_K => {
            for (o, xs) in out.chunks_exact_mut(292).zip(x.chunks_exact(QK_K)) {
                simd::q8k_block(xs, o);
            }
        }
        ActType::F32 => quantize_blocks(at, x, out),
    }
}

/// The block quantizers in AVX2, bit for bit those below: the compiler leaves their
/// maximum searches and narrowing scalar, and a prompt's activations spent 8% of its
/// time there. Callers must run with AVX2 enabled.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::QK_K;
    use std::arch::x86_64::*;

    /// The largest |v| of `n` values at `x` (n a multiple of 8); NaNs are passed over
    /// as the scalar comparisons do.
    #[inline(always)]
    unsafe fn abs_max(x: *const f32, n: usize) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            // maxps returns its second operand where either is NaN: a NaN is dropped.
            m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(i))), m);
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_movehdup_ps(h));
        _mm_cvtss_f32(h)
    }

    /// 16 i32 lanes (two registers, in order) narrowed to 16 i8 with saturation, and
    /// their sum.
    #[inline(always)]
    unsafe fn narrow16(a: __m256i, b: __m256i) -> (__m128i, i32) {
        let w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);
        let bytes = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        let s = _mm256_add_epi32(a, b);
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let s = _mm_hadd_epi32(s, s);
        (bytes, _mm_cvtsi128_si32(_mm_hadd_epi32(s, s)))
    }

    /// [`super::q8k_block`].
    #[inline(always)]
    pub(super) unsafe fn q8k_block(x: &[f32], out: &mut [u8]) {
        let amax = abs_max(x.as_ptr(), QK_K);
        out.fill(0);
        if amax == 0.0 || amax.is_nan() {
            return;
        }
        // The first value of the largest magnitude gives the sign, as in the scalar search.
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        let id = _mm256_set1_ps(iscale);
        out[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        let p = x.as_ptr();
        for g in 0..QK_K / 16 {
            let (a, b) = (k_lanes(p.add(16 * g), id), k_lanes(p.add(16 * g + 8), id));
            let (bytes, sum) = narrow16(a, b);
            _mm_storeu_si128(out.as_mut_ptr().add(4 + 16 * g) as *mut __m128i, bytes);
            out[260 + 2 * g..262 + 2 * g].copy_from_slice(&(sum as i16).to_le_bytes());
        }
    }

    /// 8 values at `x` times `id`, rounded to even and capped at 127 as Q8_K does
    /// (minps returns 127 for a NaN, as f32::min does).
    #[inline(always)]
    unsafe fn k_lanes(x: *const f32, id: __m256) -> __m256i {
        let v = _mm256_mul_ps(_mm256_loadu_ps(x), id);
        let v = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        _mm256_cvtps_epi32(_mm256_min_ps(v, _mm256_set1_ps(127.0)))
    }

    /// 8 values at `x` times `id`, rounded half away from zero as Q8_0 does: truncated,
    /// then stepped by the fraction's sign; a NaN gives 0, as `as i32` does.
    #[inline(always)]
    unsafe fn q8_lanes(x: *const f32, id: __m256) -> __m256i {
        let v = _mm256_mul_ps(_mm256_loadu_ps(x), id);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
        let frac = _mm256_sub_ps(v, t);
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        let down = _mm256_cmp_ps::<_CMP_LE_OQ>(frac, _mm256_set1_ps(-0.5));
        let ordered = _mm256_cmp_ps::<_CMP_ORD_Q>(v, v);
        let ti = _mm256_sub_epi32(_mm256_cvttps_epi32(t), _mm256_castps_si256(up));
        let ti = _mm256_add_epi32(ti, _mm256_castps_si256(down));
        _mm256_and_si256(ti, _mm256_castps_si256(ordered))
    }

    /// [`super::q8_block`].
    #[inline(always)]
    pub(super) unsafe fn q8_block(x: &[f32], out: &mut [u8], with_sum: bool) {
        let d = abs_max(x.as_ptr(), 32) / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let p = x.as_ptr();
        let off = if with_sum { 4 } else { 2 };
        let (lo, s0) = narrow16(q8_lanes(p, id), q8_lanes(p.add(8), id));
        let (hi, s1) = narrow16(q8_lanes(p.add(16), id), q8_lanes(p.add(24), id));
        _mm_storeu_si128(out.as_mut_ptr().add(off) as *mut __m128i, lo);
        _mm_storeu_si128(out.as_mut_ptr().add(off + 16) as *mut __m128i, hi);
        out[0..2].copy_from_slice(&f16_bits(d).to_le_bytes());
        if with_sum {
            let sum = (s0 + s1) as f32 * d;
            out[2..4].copy_from_slice(&f16_bits(sum).to_le_bytes());
        }
    }

    /// `v` as f16 bits, rounded to nearest even as `half` does, by one F16C instruction
    /// (`half`'s conversion, a call that checks the CPU each time, was 1% of a small
    /// model's generation with the plans' conversions below).
    #[inline(always)]
    unsafe fn f16_bits(v: f32) -> u16 {
        _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v))) as u16
    }
}

#[inline(always)]
fn quantize_blocks(at: ActType, x: &[f32], out: &mut [u8]) {
    match at {
        ActType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        ActType::Q8_0 | ActType::Q8_1 => {
            for (o, xs) in out
                .chunks_exact_mut(at.block_bytes())
                .zip(x.chunks_exact(32))
            {
                q8_block(xs, o, at == ActType::Q8_1);
            }
        }
        ActType::Q8_K => {
            for (o, xs) in out.chunks_exact_mut(292).zip(x.chunks_exact(QK_K)) {
                q8k_block(xs, o);
            }
        }
    }
}

/// `v` rounded to the nearest integer, ties to even, for |v| < 2^22: adding 1.5 * 2^23
/// pushes the fraction out of the mantissa. Plain arithmetic, so loops of it vectorise
/// (`round_ties_even` is a library call on baseline x86-64).
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// `v` rounded half away from zero (as `f32::round`), for |v| < 2^31, in arithmetic
/// that vectorises.
#[inline(always)]
fn round_away(v: f32) -> i32 {
    let t = v as i32;
    let frac = v - t as f32;
    t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)
}

/// One Q8_K block of 256 values, as ggml's reference quantizer (and `quant::q8_k`)
/// computes it: scale from the signed absmax, round to even, clamp at 127, sums of 16.
#[inline(always)]
fn q8k_block(x: &[f32], out: &mut [u8]) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    out.fill(0);
    if amax == 0.0 {
        return;
    }
    let iscale = -127.0 / max;
    let mut q = [0i8; QK_K];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = round_even(iscale * v).min(127.0) as i8;
    }
    out[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for (o, &q) in out[4..260].iter_mut().zip(&q) {
        *o = q as u8;
    }
    for (g, qs) in q.chunks_exact(16).enumerate() {
        let sum: i16 = qs.iter().map(|&q| q as i16).sum();
        out[260 + 2 * g..262 + 2 * g].copy_from_slice(&sum.to_le_bytes());
    }
}

/// One Q8_0 (or Q8_1, with the sum) block of 32 values, as ggml's reference quantizer
/// computes it (scale = absmax / 127, round half away from zero).
#[inline(always)]
fn q8_block(x: &[f32], out: &mut [u8], with_sum: bool) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let off = if with_sum { 4 } else { 2 };
    let mut sum = 0i32;
    let mut q = [0i32; 32];
    for (q, v) in q.iter_mut().zip(x) {
        *q = round_away(v * id);
    }
    for (o, &q) in out[off..off + 32].iter_mut().zip(&q) {
        sum += q;
        *o = q as i8 as u8;
    }
    out[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    if with_sum {
        out[2..4].copy_from_slice(&f16::from_f32(sum as f32 * d).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_blocks_match_the_reference_quantizer() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        for (at, ty) in [
            (ActType::Q8_0, GgmlType::Q8_0),
            (ActType::Q8_1, GgmlType::Q8_1),
            (ActType::Q8_K, GgmlType::Q8_K),
        ] {
            let mut got = Vec::new();
            quantize_rows(at, &x, 256, &mut got).unwrap();
            let mut want = Vec::new();
            crate::quant::quantize(ty, &x, &mut want).unwrap();
            assert_eq!(got, want, "{at:?}");
        }
    }

    #[test]
    fn rounding_ties_match_the_reference_quantizer() {
        // With the extreme at ±127 the scale is 1, so halves are exact ties.
        let mut x: Vec<f32> = (0..256).map(|i| (i % 64) as f32 - 31.5).collect();
        x[5] = 127.0;
        x[300 % 256] = -127.0;
        x[77] = -126.5;
        for (at, ty) in [
            (ActType::Q8_0, GgmlType::Q8_0),
            (ActType::Q8_1, GgmlType::Q8_1),
            (ActType::Q8_K, GgmlType::Q8_K),
        ] {
            for sign in [1.0f32, -1.0] {
                let xs: Vec<f32> = x.iter().map(|v| v * sign).collect();
                let mut got = Vec::new();
                quantize_rows(at, &xs, 256, &mut got).unwrap();
                let mut want = Vec::new();
                crate::quant::quantize(ty, &xs, &mut want).unwrap();
                assert_eq!(got, want, "{at:?} sign {sign}");
            }
        }
        let mut z = Vec::new();
        quantize_rows(ActType::Q8_K, &[0.0; 256], 256, &mut z).unwrap();
        assert!(z.iter().all(|&b| b == 0));
    }

    /// The vector quantizers against the scalar ones, bit for bit, on values of every
    /// scale and on infinities and NaNs.
    #[test]
    fn vector_quantizers_match_the_scalar_ones() {
        let mut h = 0x9e37_79b9u32;
        let mut x: Vec<f32> = (0..256 * 64)
            .map(|i| {
                h ^= h << 13;
                h ^= h >> 17;
                h ^= h << 5;
                let scale = [1e-3, 0.7, 30.0, 1e5][i / 256 % 4];
                (h as f32 / u32::MAX as f32 - 0.5) * scale
            })
            .collect();
        x[300] = f32::NAN;
        x[700] = f32::INFINITY;
        x[1100] = f32::NEG_INFINITY;
        x[1500..1600].fill(0.0);
        x[2000..2256].fill(0.0);
        x[3000] = -1e4;
        x[3001] = 1e4;
        for at in [ActType::Q8_0, ActType::Q8_1, ActType::Q8_K] {
            let mut vector = Vec::new();
            quantize_rows(at, &x, 256, &mut vector).unwrap();
            let mut scalar = vec![0u8; vector.len()];
            quantize_blocks(at, &x, &mut scalar);
            assert_eq!(vector, scalar, "{at:?}");
        }
    }

    #[test]
    fn threaded_quantization_equals_serial() {
        let pool = Pool::new(3);
        for (at, n, rows) in [
            (ActType::Q8_0, 96, 1),
            (ActType::Q8_1, 64, 13),
            (ActType::Q8_K, 512, 7),
        ] {
            let x: Vec<f32> = (0..n * rows)
                .map(|i| ((i * 31 % 97) as f32 - 48.0) * 0.07)
                .collect();
            let (mut serial, mut threaded) = (Vec::new(), vec![1u8; 5]);
            quantize_rows(at, &x, n, &mut serial).unwrap();
            quantize_rows_on(&pool, at, &x, n, &mut threaded).unwrap();
            assert_eq!(serial, threaded, "{at:?} {rows} rows");
        }
        assert!(quantize_rows_on(&pool, ActType::Q8_0, &[0.0; 48], 48, &mut Vec::new()).is_err());
    }

    #[test]
    fn bad_shapes_are_errors() {
        let mut out = Vec::new();
        assert!(quantize_rows(ActType::Q8_0, &[0.0; 48], 48, &mut out).is_err());
        assert!(quantize_rows(ActType::Q8_0, &[0.0; 48], 32, &mut out).is_err());
        assert!(ActType::for_weight(GgmlType::Q8_K).is_err());
    }
}
