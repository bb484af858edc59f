//! Scale-fitting helpers shared by the K-quant quantizers (ggml-quants.c
//! `make_qkx2_quants`, `make_q3_quants`, `make_qx_quants`) and the 6-bit scale packing
//! of Q4_K / Q5_K. Float operations keep ggml's order so results match its reference.

use super::block::nearest_int;

/// Values whose magnitude stays below this are treated as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Elements per K-quant super-block (ggml `QK_K`).
pub const QK_K: usize = 256;

/// Fits `x ≈ scale * L - min_out` with `L` in `0..=nmax`, weighting errors by `weights`;
/// tries `nstep + 1` scales around `nmax / (max - min)`. Returns `(scale, min_out)` and
/// writes `L`. `min_out` is >= 0 (the fitted offset is never positive).
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        best_error += weights[i] * err(scale * q as f32 + min - x[i]);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let lf = q as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The value of largest magnitude (first on ties) and that magnitude.
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Symmetric fit `x ≈ scale * (L - nmax)`, `L` in `0..2*nmax`, weights `x²`, refined by
/// coordinate descent (ggml `make_q3_quants` with `do_rmse`). Returns the scale.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let cur = l[i] as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for li in l[..x.len()].iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Symmetric fit `x ≈ scale * (L - nmax)`, `L` in `0..2*nmax`, weights `x²`, trying 18
/// scales near `-nmax / max` (ggml `make_qx_quants`, rmse_type 1, no importance
/// weights). Returns the scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    // Sums of w·x·l and w·l² for one trial scale, optionally storing the quants.
    let fit = |iscale: f32, store: Option<&mut [i8]>| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        let mut store = store;
        for (i, &v) in x.iter().enumerate() {
            let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            if let Some(s) = store.as_deref_mut() {
                s[i] = (q + nmax) as i8;
            }
            let w = v * v;
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        (sumlx, suml2)
    };
    let (sumlx, suml2) = fit(-(nmax as f32) / max, Some(&mut *l));
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = fit(iscale, None);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fit(iscale, Some(&mut *l));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Scale and min (6 bits each) of sub-block `j` (0..8) from Q4_K / Q5_K's 12 packed
/// bytes (ggml `get_scale_min_k4`): bytes 0..4 hold scales 0..4, bytes 4..8 mins 0..4,
/// bytes 8..12 the low nibbles of scales/mins 4..8, whose top 2 bits sit in the top
/// bits of bytes 0..8.
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block ([`scale_min_k4`]'s packing, all
/// eight at once)
/// as bytes, unpacked four at a time in 32-bit words: the scales in `.0`, the mins in
/// `.1`. Byte j of the 12 is `q[j]`; the first four scales and mins are the low six
/// bits of bytes 0-3 and 4-7, the last four take their low four bits from bytes 8-11
/// (low and high nibble) and their top two from the top bits of bytes 0-3 and 4-7.
#[inline(always)]
pub fn unpack_scales_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let (six, nib, top) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x0303_0303);
    let high = |w: u32| ((w >> 6) & top) << 4;
    let bytes = |a: u32, b: u32| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&a.to_le_bytes());
        out[4..].copy_from_slice(&b.to_le_bytes());
        out
    };
    (
        bytes(w0 & six, (w2 & nib) | high(w0)),
        bytes(w1 & six, ((w2 >> 4) & nib) | high(w1)),
    )
}

/// Inverse of [`scale_min_k4`] for eight 6-bit scale/min pairs.
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// Fits Q4_K / Q5_K super-block: per 32-value sub-block an affine fit with `nmax`
/// levels, then the 8 scales and 8 mins quantized to 6 bits against their maxima.
/// Returns (d, dmin, packed scales, quants 0..=nmax in element order).
pub(crate) fn quantize_k4_like(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (half::f16, half::f16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0.0, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            rdelta,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // `as u8` wraps like ggml's cast to uint8_t before the clamp.
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = half::f16::from_f32(max_scale / 63.0);
    let dmin = half::f16::from_f32(max_min / 63.0);
    // Requantize every value against the scales as they will be decoded.
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dl = d.to_f32() * sc as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dl).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_pack_roundtrip() {
        let ls: [u8; 8] = [0, 1, 17, 63, 32, 5, 48, 63];
        let lm: [u8; 8] = [63, 2, 40, 0, 31, 33, 7, 62];
        let p = pack_scale_min_k4(&ls, &lm);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &p), (ls[j], lm[j]));
        }
    }

    /// All eight at once, against one at a time, over bytes that set every bit pattern
    /// of every field somewhere.
    #[test]
    fn unpacked_scales_equal_scale_min_k4() {
        let mut x = 0x9e37_79b9u32;
        for _ in 0..2000 {
            let q: [u8; 12] = std::array::from_fn(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            });
            let (sc, mn) = unpack_scales_k4(&q);
            for j in 0..8 {
                assert_eq!((sc[j], mn[j]), scale_min_k4(j, &q), "{q:?} j={j}");
            }
        }
    }

    #[test]
    fn qkx2_fits_affine_data_closely() {
        let x: Vec<f32> = (0..32).map(|i| -1.0 + 0.1 * i as f32).collect();
        let w = vec![1.0f32; 32];
        let mut l = [0u8; 32];
        let (scale, min) = make_qkx2_quants(15, &x, &w, &mut l, -1.0, 0.1, 20, false);
        for (i, &v) in x.iter().enumerate() {
            let y = scale * l[i] as f32 - min;
            assert!((y - v).abs() < 0.11, "{i}: {y} vs {v}");
        }
    }

    #[test]
    fn zero_input_gives_zero_scales() {
        let x = [0.0f32; 16];
        let mut l = [5i8; 16];
        assert_eq!(make_qx_quants(32, &x, &mut l), 0.0);
        assert_eq!(l, [0; 16]);
        assert_eq!(make_q3_quants(4, &x, &mut l), 0.0);
    }
}
