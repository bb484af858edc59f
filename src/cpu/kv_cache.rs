//! The CPU engine's KV cache: one layer's keys and values in f16, and the widening of
//! f16 back to f32 that attention reads them through.

use half::{f16, slice::HalfFloatSliceExt};

use super::lines::LineBuf;
use crate::{Error, Result};

/// Keys per panel of the key cache.
pub(super) const PANEL: usize = 8;

/// One layer's keys and values, as f16 (as ggml's CPU cache and the GPU's hold them:
/// half the bytes that generation at depth waits on). Values are position-major
/// ([kv_dim, n_ctx] in ggml order: position p's row at `p * kv_dim`). Keys are in
/// panels of [`PANEL`] positions, each panel [PANEL, kv_dim]: component i of the
/// panel's keys sits in eight consecutive values, so the scores take one vector load
/// per component for eight keys. Both start on a cache line ([`LineBuf`]): attention
/// reads a KV head's slices of them and asks for the next block's lines one at a time.
pub struct KvCache {
    k: LineBuf<u16>,
    v: LineBuf<u16>,
    pub kv_dim: usize,
    pub n_ctx: usize,
}

impl KvCache {
    pub fn new(kv_dim: usize, n_ctx: usize) -> Result<KvCache> {
        let n = kv_dim
            .checked_mul(n_ctx.next_multiple_of(PANEL))
            .ok_or_else(|| Error::invalid("KV cache size overflows"))?;
        // A context too large for memory is an error, not an abort. The zeroed pages come
        // from the system lazily, so a large cache costs nothing until it is used.
        let zeros = || -> Result<LineBuf<u16>> {
            LineBuf::zeroed(n).ok_or_else(|| {
                Error::invalid(format!(
                    "the KV cache for a context of {n_ctx} needs {} MiB per layer, more than \
                     this machine can allocate; lower -c",
                    (n as u64 * 4) >> 20
                ))
            })
        };
        Ok(KvCache {
            k: zeros()?,
            v: zeros()?,
            kv_dim,
            n_ctx,
        })
    }

    /// Stores k, v ([kv_dim, n_tokens]) at positions pos, pos + 1, ...
    pub fn store(&mut self, k: &[f32], v: &[f32], pos: usize, n_tokens: usize) -> Result<()> {
        let kd = self.kv_dim;
        let n = n_tokens * kd;
        if pos + n_tokens > self.n_ctx || k.len() < n || v.len() < n {
            return Err(Error::invalid(format!(
                "KV store of {n_tokens} tokens at {pos} in a context of {}",
                self.n_ctx
            )));
        }
        // Whole slices convert in vector code (F16C where the CPU has it); one value
        // at a time, the stores were 1% of a prompt. Keys go through a small buffer on
        // the stack on their way into the panels.
        const PART: usize = 64;
        let mut kh = [f16::ZERO; PART];
        for (t, kt) in k[..n].chunks_exact(kd).enumerate() {
            let p = pos + t;
            let panel = &mut self.k[p / PANEL * PANEL * kd..][..PANEL * kd];
            for (c, part) in kt.chunks(PART).enumerate() {
                let kh = &mut kh[..part.len()];
                kh.convert_from_f32_slice(part);
                for (i, x) in kh.iter().enumerate() {
                    panel[(c * PART + i) * PANEL + p % PANEL] = x.to_bits();
                }
            }
        }
        let vs: &mut [f16] = bytemuck::cast_slice_mut(&mut self.v[pos * kd..][..n]);
        vs.convert_from_f32_slice(&v[..n]);
        Ok(())
    }

    /// Values from position `j`'s component `off` on (rows `kv_dim` apart).
    pub(super) fn values_from(&self, j: usize, off: usize) -> &[u16] {
        &self.v[j * self.kv_dim + off..]
    }

    /// Components `off .. off + len` of the keys of panel `i`, `PANEL` values each.
    pub(super) fn key_panel(&self, i: usize, off: usize, len: usize) -> &[u16] {
        &self.k[(i * self.kv_dim + off) * PANEL..][..len * PANEL]
    }
}

/// Eight f16 values as f32: one F16C instruction where `F` (the attention's AVX2
/// build, for CPUs with F16C), else
/// [`f16_to_f32`] lane by lane, which the compiler vectorises.
#[inline(always)]
pub(super) fn widen8<const F: bool>(h: &[u16]) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if F && h.len() >= 8 {
        use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm_loadu_si128};
        // SAFETY: eight values are in bounds (checked); `F` is only set in the build for
        // CPUs with F16C (`wide_vectors`).
        return unsafe {
            std::mem::transmute::<std::arch::x86_64::__m256, [f32; 8]>(_mm256_cvtph_ps(
                _mm_loadu_si128(h.as_ptr() as *const __m128i),
            ))
        };
    }
    std::array::from_fn(|i| f16_to_f32(h[i]))
}

/// W f16 values as f32, eight at a time where W allows.
#[inline(always)]
pub(super) fn widen<const F: bool, const W: usize>(h: &[u16]) -> [f32; W] {
    let mut out = [0f32; W];
    let mut c = 0;
    while c + 8 <= W {
        out[c..c + 8].copy_from_slice(&widen8::<F>(&h[c..c + 8]));
        c += 8;
    }
    for l in c..W {
        out[l] = f16_to_f32(h[l]);
    }
    out
}

/// An f16 as f32 in integer and float arithmetic with no branch or table: the bits
/// shifted into f32's places and scaled by 2^112 (which also makes subnormals normal),
/// infinities and NaNs given f32's exponent.
/// The tile plans read their scales with it too.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let em = h & 0x7fff;
    let v = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
    let v = if em >= 0x7c00 {
        f32::from_bits((em << 13) | 0x7f80_0000)
    } else {
        v
    };
    f32::from_bits(v.to_bits() | ((h & 0x8000) << 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache's f16 reads equal `half`'s for every f16, subnormals, infinities and
    /// NaNs included, in both the portable and the F16C build.
    #[test]
    fn f16_widening_is_exact() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for (i, &h) in all.iter().enumerate() {
            let want = f16::from_bits(h).to_f32();
            assert!(same(f16_to_f32(h), want), "{h:#06x}");
            if i % 8 == 0 {
                let w = widen8::<false>(&all[i..i + 8]);
                let wide = f16c();
                let x = if wide {
                    // SAFETY: the CPU has F16C (`wide_vectors`).
                    unsafe { widen8_f16c(&all[i..i + 8]) }
                } else {
                    w
                };
                for l in 0..8 {
                    let want = f16::from_bits(all[i + l]).to_f32();
                    assert!(same(w[l], want) && same(x[l], want), "{:#06x}", all[i + l]);
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen8_f16c(h: &[u16]) -> [f32; 8] {
        widen8::<true>(h)
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn widen8_f16c(h: &[u16]) -> [f32; 8] {
        widen8::<true>(h)
    }

    fn f16c() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}
