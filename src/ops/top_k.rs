//! Top-k sampling's candidates chosen on the device (`shaders/ops/topk_*.wgsl`): a
//! sampled step reads back the few dozen logits that can be among the k best, with
//! their ids, instead of every logit (1 MiB a token on Gemma 3's vocabulary), and the
//! host sorts only those.
//!
//! Three passes over the last token's logits, split into at most [`MAX_SPANS`] spans:
//! 1. `topk_spans`: each span's largest logit.
//! 2. `topk_floor` (one workgroup): the floor, the k-th largest of those maxima. k spans
//!    hold a logit at or above it, so at least k logits are, and every one of the k
//!    best is.
//! 3. `topk_gather`: every logit at or above the floor joins the candidate list; spans
//!    whose maximum is below it are skipped.
//!
//! [`best`] sorts the list and keeps its k best: [`crate::sampling::top_k`] of the
//! whole vocabulary, the same ids and values in the same order. How many logits pass
//! the floor depends on the logits: with k = 40, 46-115 a token on SmolLM2 and 54-271
//! on Gemma 3 (64 sampled tokens each). More than [`CAP`] and `best` says the list
//! overflowed, and the caller reads the logits instead.

use super::{dispatch, op_pipeline, Dispatch};
use crate::gpu::GpuContext;
use crate::sampling::Cand;
use crate::{Error, Result};

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub n: u32,
    pub span: u32,
    pub spans: u32,
    pub k: u32,
    pub cap: u32,
    pub _pad: [u32; 3],
}

/// Spans at most (`MAX_SPANS` in `common/top_k.wgsl`): the floor's one workgroup holds
/// a maximum per lane. More spans make a tighter floor.
pub const MAX_SPANS: u32 = 256;

/// Logits per span at least: one per lane of `topk_spans`' workgroup.
const MIN_SPAN: u32 = 64;

/// Candidate slots in the list.
pub const CAP: u32 = 1024;

/// Words of the candidate list as read back: its count, its floor, two words of
/// padding, then [`CAP`] (key, id) pairs.
pub const FOUND_WORDS: usize = 4 + 2 * CAP as usize;

/// (logits per span, spans) for `n` logits.
pub fn spans(n: u32) -> (u32, u32) {
    let span = n.div_ceil(MAX_SPANS).max(MIN_SPAN);
    (span, n.div_ceil(span))
}

/// Whether the device chooses the candidates of top-`k` over `n` logits: k at most half
/// the spans, so that the floor stays well above most logits (a 49152- or
/// 262144-token vocabulary: k up to 128).
pub fn supports(n: u32, k: u32) -> bool {
    k >= 1 && k <= spans(n).1 / 2
}

/// Compile (or find) the pipelines, on any thread.
pub fn warm(ctx: &GpuContext) -> Result<()> {
    for name in ["topk_spans", "topk_floor", "topk_gather"] {
        op_pipeline(ctx, name)?;
    }
    Ok(())
}

/// The three passes over `logits` (`n` f32), with `maxima` ([`MAX_SPANS`] words) between
/// them, leaving the candidate list in `found` ([`FOUND_WORDS`] words).
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    logits: &wgpu::Buffer,
    maxima: &wgpu::Buffer,
    found: &wgpu::Buffer,
    n: u32,
    k: u32,
) -> Result<Vec<Dispatch>> {
    if !supports(n, k) {
        return Err(Error::Unsupported(format!(
            "top-{k} sampling on the device over {n} logits (at most top-{})",
            spans(n).1 / 2
        )));
    }
    let (span, n_spans) = spans(n);
    let p = Params {
        n,
        span,
        spans: n_spans,
        k,
        cap: CAP,
        _pad: [0; 3],
    };
    let pass = |name: &str, buffers: &[&wgpu::Buffer], groups: u32| {
        dispatch(
            ctx,
            name,
            op_pipeline(ctx, name)?,
            step,
            &p,
            buffers,
            move |_| [groups, 1, 1],
        )
    };
    Ok(vec![
        pass("topk_spans", &[logits, maxima], n_spans)?,
        pass("topk_floor", &[maxima, found], 1)?,
        pass("topk_gather", &[logits, maxima, found], n_spans)?,
    ])
}

/// The `k` best candidates of a list read back ([`FOUND_WORDS`] words), best first, as
/// [`crate::sampling::top_k`] gives them; `None` if the list overflowed.
pub fn best(words: &[u32], k: u32) -> Result<Option<Vec<Cand>>> {
    let broken = |what: &str| Error::gpu(format!("top-k sampling on the device: {what}"));
    let (&count, rest) = words
        .split_first()
        .ok_or_else(|| broken("no candidate list came back"))?;
    if count > CAP {
        return Ok(None);
    }
    if count < k {
        return Err(broken(&format!("{count} candidates for the best {k}")));
    }
    let pairs = rest
        .get(3..3 + 2 * count as usize)
        .ok_or_else(|| broken("the candidate list came back short"))?;
    let mut cands: Vec<Cand> = pairs.chunks_exact(2).map(|p| (p[1], logit(p[0]))).collect();
    crate::sampling::keep_best(&mut cands, k as usize);
    Ok(Some(cands))
}

/// `common/top_k.wgsl`'s `order_key` on the host: the logit's rank in the sampler's
/// order as a word.
pub fn key(l: f32) -> u32 {
    let b = crate::sampling::sanitize(l).to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The sanitised logit a key was made from.
pub fn logit(key: u32) -> f32 {
    f32::from_bits(if key & 0x8000_0000 != 0 {
        key & 0x7fff_ffff
    } else {
        !key
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys order logits as the sampler does and give back their sanitised values.
    #[test]
    fn keys_follow_the_samplers_order() {
        let vals = [
            f32::NEG_INFINITY,
            -f32::MAX,
            -1.5,
            -f32::from_bits(1),
            -0.0,
            0.0,
            f32::from_bits(1),
            2.0,
            f32::MAX,
        ];
        for w in vals.windows(2) {
            assert!(key(w[0]) < key(w[1]), "{} < {}", w[0], w[1]);
        }
        for v in vals {
            assert_eq!(logit(key(v)).to_bits(), v.to_bits());
        }
        assert_eq!(key(f32::NAN), key(f32::NEG_INFINITY));
        assert_eq!(key(f32::INFINITY), key(f32::MAX));
        assert!(key(f32::NEG_INFINITY) > 0);
    }

    #[test]
    fn spans_cover_the_vocabulary() {
        for n in [1u32, 63, 64, 1000, 16_385, 49_152, 262_144, 262_145] {
            let (span, count) = spans(n);
            assert!(count <= MAX_SPANS && span >= MIN_SPAN, "{n}");
            assert!(span * count >= n && span * (count - 1) < n, "{n}");
        }
        assert!(supports(262_144, 128) && !supports(262_144, 129));
        assert!(supports(49_152, 40) && !supports(1000, 40) && !supports(1000, 0));
    }

    /// A list past its slots is an overflow, one with fewer than k a broken device.
    #[test]
    fn lists_that_cannot_be_used() {
        let mut words = vec![0u32; FOUND_WORDS];
        words[0] = CAP + 1;
        assert!(best(&words, 4).unwrap().is_none());
        words[0] = 3;
        assert!(best(&words, 4).is_err());
        assert!(best(&[], 4).is_err());
        assert!(best(&[2, 0, 0, 0, key(1.0), 7], 1).is_err());
    }
}
