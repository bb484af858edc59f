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
//!    whose maximum is below it are skipped. One more workgroup reads the logits of up
//!    to [`MAX_LISTED`] listed tokens (those a repetition penalty changes).
//!
//! k and the listed tokens are the step's ([`want`]), written before it runs. With h
//! tokens listed, a sampler asks for k + h: whatever the penalty does to the listed
//! ones, its k best are then among the candidates ([`crate::sampling::candidates`]).
//! [`best`] returns them: the list, then the listed tokens below its floor.
//!
//! How many logits pass the floor depends on the logits: with k = 40, 46-115 a token
//! on SmolLM2 and 54-271 on Gemma 3 (64 sampled tokens each). More than [`CAP`] and
//! `best` says the list overflowed, and the caller reads the logits instead.

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
    pub cap: u32,
}

/// Tokens whose logits a step may ask for whatever their rank (`MAX_LISTED` in
/// `common/top_k.wgsl`): llama.cpp's default penalty window.
pub const MAX_LISTED: usize = 64;

/// Words of what a step wants ([`want`]): k, the count of listed tokens, two words of
/// padding, then the listed tokens.
pub const WANT_WORDS: usize = 4 + MAX_LISTED;

/// Spans at most (`MAX_SPANS` in `common/top_k.wgsl`): the floor's one workgroup holds
/// a maximum per lane. More spans make a tighter floor.
pub const MAX_SPANS: u32 = 256;

/// Logits per span at least: one per lane of `topk_spans`' workgroup.
const MIN_SPAN: u32 = 64;

/// Candidate slots in the list.
pub const CAP: u32 = 1024;

/// Words of the candidate list as read back: its count, its floor, two words of
/// padding, the listed tokens' keys, then [`CAP`] (key, id) pairs.
pub const FOUND_WORDS: usize = 4 + MAX_LISTED + 2 * CAP as usize;

/// (logits per span, spans) for `n` logits.
pub fn spans(n: u32) -> (u32, u32) {
    let span = n.div_ceil(MAX_SPANS).max(MIN_SPAN);
    (span, n.div_ceil(span))
}

/// Whether the device chooses the candidates of top-`k` over `n` logits with `listed`
/// tokens' logits besides: k at most half the spans, so that the floor stays well
/// above most logits (a 49152- or 262144-token vocabulary: k up to 128).
pub fn supports(n: u32, k: u32, listed: usize) -> bool {
    k >= 1 && k <= spans(n).1 / 2 && listed <= MAX_LISTED
}

/// What a step wants ([`WANT_WORDS`] words, written before it runs): the candidates
/// for the `k` best logits and the `listed` tokens'. Ids must be below the vocabulary
/// and `supports` must hold.
pub fn want(k: u32, listed: &[u32]) -> Vec<u32> {
    let mut w = vec![0u32; WANT_WORDS];
    w[0] = k;
    w[1] = listed.len().min(MAX_LISTED) as u32;
    for (slot, &id) in w[4..].iter_mut().zip(listed) {
        *slot = id;
    }
    w
}

/// Compile (or find) the pipelines, on any thread.
pub fn warm(ctx: &GpuContext) -> Result<()> {
    for name in ["topk_spans", "topk_floor", "topk_gather"] {
        op_pipeline(ctx, name)?;
    }
    Ok(())
}

/// The three passes over `logits` (`n` f32) for what `want` ([`WANT_WORDS`] words)
/// says, with `maxima` ([`MAX_SPANS`] words) between them, leaving the candidate list
/// in `found` ([`FOUND_WORDS`] words).
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    [logits, want]: [&wgpu::Buffer; 2],
    maxima: &wgpu::Buffer,
    found: &wgpu::Buffer,
    n: u32,
) -> Result<Vec<Dispatch>> {
    if !supports(n, 1, 0) {
        return Err(Error::Unsupported(format!(
            "top-k sampling on the device over {n} logits: too few for two spans"
        )));
    }
    let (span, n_spans) = spans(n);
    let p = Params {
        n,
        span,
        spans: n_spans,
        cap: CAP,
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
        pass("topk_floor", &[want, maxima, found], 1)?,
        // One workgroup past the spans reads the listed tokens' logits.
        pass("topk_gather", &[logits, want, maxima, found], n_spans + 1)?,
    ])
}

/// The candidates of a list read back ([`FOUND_WORDS`] words) for the `k` best and the
/// `listed` tokens (the step's [`want`]): every logit at or above the list's floor, then
/// the listed tokens below it, in no order; `None` if the list overflowed.
pub fn best(words: &[u32], k: u32, listed: &[u32]) -> Result<Option<Vec<Cand>>> {
    let broken = |what: &str| Error::gpu(format!("top-k sampling on the device: {what}"));
    let (&[count, floor], rest) = words
        .split_first_chunk::<2>()
        .ok_or_else(|| broken("no candidate list came back"))?;
    if count > CAP {
        return Ok(None);
    }
    if count < k {
        return Err(broken(&format!("{count} candidates for the best {k}")));
    }
    let keys = rest.get(2..2 + MAX_LISTED);
    let pairs = rest.get(2 + MAX_LISTED..2 + MAX_LISTED + 2 * count as usize);
    let (Some(keys), Some(pairs)) = (keys, pairs) else {
        return Err(broken("the candidate list came back short"));
    };
    let mut cands: Vec<Cand> = pairs.chunks_exact(2).map(|p| (p[1], logit(p[0]))).collect();
    // A listed token at or above the floor is in the list already.
    for (&id, &key) in listed.iter().zip(keys) {
        if key < floor {
            cands.push((id, logit(key)));
        }
    }
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
        assert!(supports(262_144, 128, 0) && !supports(262_144, 129, 0));
        assert!(supports(49_152, 104, 64) && !supports(49_152, 40, 65));
        assert!(supports(49_152, 40, 0) && !supports(1000, 40, 0) && !supports(1000, 0, 0));
    }

    /// A list past its slots is an overflow, one with fewer than k a broken device.
    #[test]
    fn lists_that_cannot_be_used() {
        let mut words = vec![0u32; FOUND_WORDS];
        words[0] = CAP + 1;
        assert!(best(&words, 4, &[]).unwrap().is_none());
        words[0] = 3;
        assert!(best(&words, 4, &[]).is_err());
        assert!(best(&[], 4, &[]).is_err());
        assert!(best(&[2, 0, 0, 0, key(1.0), 7], 1, &[]).is_err());
    }

    /// The listed tokens below the floor join the list; those at or above it are in it.
    #[test]
    fn listed_tokens_below_the_floor_join() {
        let mut words = vec![0u32; FOUND_WORDS];
        (words[0], words[1]) = (2, key(1.0));
        (words[4], words[5]) = (key(-3.0), key(1.5));
        let pairs = 4 + MAX_LISTED;
        words[pairs..pairs + 4].copy_from_slice(&[key(2.0), 9, key(1.5), 4]);
        let got = best(&words, 2, &[7, 4]).unwrap().unwrap();
        assert_eq!(got, vec![(9, 2.0), (4, 1.5), (7, -3.0)]);
    }
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::{check_const, wgsl_mirror};

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::Params, "common/top_k.wgsl", "Params", { n, span, spans, cap });
        check_const("common/top_k.wgsl", "MAX_SPANS", super::MAX_SPANS.into());
        check_const("common/top_k.wgsl", "MAX_LISTED", super::MAX_LISTED as u64);
    }
}
