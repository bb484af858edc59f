//! Elementwise kernels of the CPU backend, with the semantics of the GPU ops and their
//! references in `crate::ops`.

use super::pool::Pool;
use crate::ops::glu::Activation;
use crate::ops::rope::{Rope, RopeMode};
use crate::{Error, Result};

/// Dot product with eight partial sums, a shape the compiler turns into vector code.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// y = rms_norm(x) * w over rows of `n`; x, y: [n, n_rows]; w: [n].
pub fn rms_norm(
    pool: &Pool,
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    n: usize,
    eps: f32,
) -> Result<()> {
    if n == 0 || w.len() < n || x.len() % n != 0 || y.len() < x.len() {
        return Err(Error::invalid(format!(
            "rms_norm: {} values in rows of {n} with a weight of {}",
            x.len(),
            w.len()
        )));
    }
    // A batch's rows over the threads; a single token's are a few microseconds.
    pool.split_out(&mut y[..x.len()], n, &|rows, yr| {
        norm_rows(&x[rows.start * n..rows.end * n], w, yr, n, eps)
    });
    Ok(())
}

/// [`rms_norm`]'s rows on one thread, in 256-bit vectors where the CPU has them (the
/// same bits: the sums keep their order and nothing is fused).
fn norm_rows(x: &[f32], w: &[f32], y: &mut [f32], n: usize, eps: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { norm_rows_avx2(x, w, y, n, eps) };
    }
    norm_rows_body(x, w, y, n, eps)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn norm_rows_avx2(x: &[f32], w: &[f32], y: &mut [f32], n: usize, eps: f32) {
    norm_rows_body(x, w, y, n, eps)
}

#[inline(always)]
fn norm_rows_body(x: &[f32], w: &[f32], y: &mut [f32], n: usize, eps: f32) {
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let ss: f32 = dot(xr, xr);
        let inv = 1.0 / (ss / n as f32 + eps).sqrt();
        for ((y, x), w) in yr.iter_mut().zip(xr).zip(w) {
            *y = x * inv * w;
        }
    }
}

/// The (cos, sin) pairs of a step's positions, kept between the rope calls of a layer
/// (queries and keys rotate by the same angles) and recomputed when the rope or the
/// positions change.
#[derive(Default)]
pub struct RopeTable {
    /// (first position, tokens, rotated dims, frequency base and scale bits).
    key: Option<(u32, usize, u32, u32, u32)>,
    /// [half, n_tokens] pairs.
    cs: Vec<(f32, f32)>,
}

impl RopeTable {
    fn fill(&mut self, r: &Rope, pos0: u32, n_tokens: usize) {
        let key = (
            pos0,
            n_tokens,
            r.n_rot,
            r.freq_base.to_bits(),
            r.freq_scale.to_bits(),
        );
        if self.key == Some(key) {
            return;
        }
        let half = (r.n_rot / 2) as usize;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| r.freq_base.powf(-((2 * i) as f32) / r.n_rot as f32))
            .collect();
        self.cs.clear();
        for t in 0..n_tokens {
            let pos = (pos0 as usize + t) as f32;
            self.cs.extend(inv_freq.iter().map(|&f| {
                let (s, c) = (pos * r.freq_scale * f).sin_cos();
                (c, s)
            }));
        }
        self.key = Some(key);
    }
}

/// Rotary embedding in place on x: [head_dim, n_heads, n_tokens] for tokens at positions
/// pos0, pos0 + 1, ... with the angles from `table`; a batch's tokens over the pool's
/// threads.
pub fn rope(pool: &Pool, r: &Rope, x: &mut [f32], pos0: u32, table: &mut RopeTable) -> Result<()> {
    let (hd, nh) = (r.head_dim as usize, r.n_heads as usize);
    let half = (r.n_rot / 2) as usize;
    if hd == 0 || 2 * half > hd || x.len() % (hd * nh.max(1)) != 0 {
        return Err(Error::invalid(format!(
            "rope: {} values for heads of {hd} x {nh} rotating {}",
            x.len(),
            r.n_rot
        )));
    }
    let n_tokens = x.len() / (hd * nh.max(1));
    table.fill(r, pos0, n_tokens);
    let token = |xt: &mut [f32], cs: &[(f32, f32)]| {
        for xr in xt.chunks_exact_mut(hd) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = match r.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (xr[a], xr[b]);
                xr[a] = x0 * c - x1 * s;
                xr[b] = x0 * s + x1 * c;
            }
        }
    };
    let cs = &table.cs;
    pool.split_out(x, hd * nh, &|tokens, xs| {
        for (t, xt) in tokens.zip(xs.chunks_exact_mut(hd * nh)) {
            token(xt, &cs[t * half..(t + 1) * half]);
        }
    });
    Ok(())
}

/// e^x to about 2e-7 relative (inputs clamped to ±87), in branch-free arithmetic the
/// compiler vectorises, where `f32::exp` and `tanh` are a library call per value:
/// x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series to r^6, 2^n put into
/// the exponent bits.
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer.
    let x = x.clamp(-87.0, 87.0);
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    // ln 2 in two parts, so that n * LN2_HI is exact.
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let e = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    p * f32::from_bits((e.wrapping_add(127) as u32) << 23)
}

/// out = act(gate) * up, elementwise, over the pool's threads for a batch. SiLU is
/// x / (1 + e^-x) and the tanh GELU its equal 0.5 x (1 + tanh u) = x / (1 + e^-2u), both
/// with [`exp_fast`]. (Run on one thread, a prompt's GLUs were 4% of its time, and the
/// other threads waited for them.)
pub fn glu(pool: &Pool, gate: &[f32], up: &[f32], out: &mut [f32], act: Activation) {
    let n = out.len().min(gate.len()).min(up.len());
    pool.split_out(&mut out[..n], 1, &|r, part| {
        glu_part(&gate[r.clone()], &up[r], part, act)
    });
}

/// [`glu`] on one thread, in 256-bit vectors where the CPU has them (the same bits:
/// the arithmetic is elementwise and never fused).
pub(crate) fn glu_part(gate: &[f32], up: &[f32], out: &mut [f32], act: Activation) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { glu_avx2(gate, up, out, act) };
    }
    glu_body(gate, up, out, act)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn glu_avx2(gate: &[f32], up: &[f32], out: &mut [f32], act: Activation) {
    glu_body(gate, up, out, act)
}

#[inline(always)]
fn glu_body(gate: &[f32], up: &[f32], out: &mut [f32], act: Activation) {
    match act {
        Activation::Silu => {
            for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
                *o = g / (1.0 + exp_fast(-g)) * u;
            }
        }
        Activation::GeluTanh => {
            for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
                let v = 0.797_884_6 * (g + 0.044715 * g * g * g);
                *o = g / (1.0 + exp_fast(-2.0 * v)) * u;
            }
        }
    }
}

/// x += y, elementwise.
pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `n` zeros, or `None` when the allocation fails (instead of aborting).
pub(super) fn zeroed<T: bytemuck::Zeroable>(n: usize) -> Option<Vec<T>> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    // SAFETY: the layout has a non-zero size; on success the block holds `n` values of
    // T allocated by the global allocator with exactly this layout, which is what
    // Vec::from_raw_parts requires, and all-zero bytes are a valid T (`Zeroable`).
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            return None;
        }
        Some(Vec::from_raw_parts(p, n, n))
    }
}
