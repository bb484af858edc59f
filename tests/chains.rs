//! Chains (`ops::chain`): on lavapipe a decode step runs each run of single-token
//! kernels (a layer's attention, products and norms) as one dispatch, in turn. The same model loaded with and
//! without chains must give bit for bit the same logits at every single-token step (the
//! products run the same code on the same data; only the dispatching differs), before
//! and after a batch step (which runs without chains) and deep enough that each chain's
//! counters have been zeroed and reused many times.
//!
//! Uses the real models in `models/` and the first adapter (lavapipe here).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use wgllm::gguf::GgufFile;
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::model::gpu_backend::{GpuModel, LoadOptions, Logits};
use wgllm::model::Config;
use wgllm::tokenizer::Tokenizer;

fn load(model: &str, chains: bool) -> (GpuModel, Tokenizer) {
    load_sized(model, chains, 256, 16)
}

fn load_sized(model: &str, chains: bool, n_ctx: u32, n_batch: u32) -> (GpuModel, Tokenizer) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(model);
    let file = GgufFile::open(path).unwrap();
    let cfg = Config::from_metadata(file.metadata()).unwrap();
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let opts = DeviceOptions {
        chains: Some(chains),
        ..Default::default()
    };
    let ctx = Arc::new(GpuContext::new(&opts).unwrap());
    let lo = LoadOptions {
        n_ctx,
        n_batch,
        ..Default::default()
    };
    (GpuModel::load(ctx, &file, cfg, &lo).unwrap(), tok)
}

/// Greedy steps of both engines from `prompt`, `n` single tokens, a batch of three
/// tokens, then `n` more; every step's logits compared bit for bit.
fn same_logits(model: &str, n: usize, most_builds: usize) {
    let (mut on, tok) = load(model, true);
    let (mut off, _) = load(model, false);
    // A layer's attention, products and norms join one chain: at least three
    // dispatches spared per layer (SmolLM2's attention and four products, Gemma 3's
    // attention, three products and two post-norms).
    let layers = on.cfg.n_layer as usize;
    assert!(
        on.chained_dispatches() >= 3 * (layers - 1),
        "{model}: chains spare {} dispatches of {layers} layers",
        on.chained_dispatches()
    );
    assert_eq!(off.chained_dispatches(), 0);
    // Few pipelines to compile beside the first tokens, whatever the mix of weight
    // types across the layers (Gemma 3's made six of the longest runs).
    assert!(
        (1..=most_builds).contains(&on.chain_builds()),
        "{model}: {} chain pipelines",
        on.chain_builds()
    );
    // The chains' pipelines compile beside the first steps; from here on every
    // single-token step runs them.
    on.wait_for_chains().unwrap();
    let ids = tok
        .encode("The history of the Roman empire", false, false)
        .unwrap();
    let mut pos = 0u32;
    let mut step = |tokens: &[u32], what: &str| -> u32 {
        let logits = same_step(&mut on, &mut off, tokens, pos, &format!("{model}, {what}"));
        pos += tokens.len() as u32;
        wgllm::sampling::argmax(&logits)
    };
    let mut next = step(&ids, "prompt");
    for _ in 0..n {
        next = step(&[next], "single token");
    }
    next = step(&[next, 42, 7], "batch");
    for _ in 0..n {
        next = step(&[next], "single token after a batch");
    }
    assert_eq!(on.chained_steps(), 2 * n, "{model}: steps run with chains");
    assert_eq!(off.chained_steps(), 0);
}

#[test]
fn smollm2_chained_steps_give_the_same_logits() {
    if !common::lavapipe_here("smollm2_chained_steps_give_the_same_logits") {
        return;
    }
    same_logits("SmolLM2-135M-Instruct.Q4_1.gguf", 12, 1);
}

#[test]
fn gemma3_chained_steps_give_the_same_logits() {
    if !common::lavapipe_here("gemma3_chained_steps_give_the_same_logits") {
        return;
    }
    same_logits("gemma-3-270m-q4_k_m.gguf", 6, 2);
}

/// Both engines' logits after `tokens` at `pos`, compared bit for bit; the first's.
fn same_step(
    on: &mut GpuModel,
    off: &mut GpuModel,
    tokens: &[u32],
    pos: u32,
    what: &str,
) -> Vec<f32> {
    let a = on.step(tokens, pos, Logits::Last).unwrap();
    let b = off.step(tokens, pos, Logits::Last).unwrap();
    let differ = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(differ, 0, "{what} at {pos}: {differ} logits differ");
    a
}

/// A chain led by a layer's attention runs it only up to the cached positions its loop
/// budget leaves (`ops::chain::KvTrips`); past them a step runs the attention apart,
/// before the chain, which skips that phase. Single tokens on both sides of the fewest
/// and of the most such positions give the same logits as without chains, and every one
/// of them runs the chains. With 4096 positions SmolLM2's attention splits its keys
/// from 2048 on, which the chains leave to the dispatches apart.
fn same_logits_past_the_attention_limit(model: &str) {
    let (mut on, _) = load_sized(model, true, 4096, 256);
    let (mut off, _) = load_sized(model, false, 4096, 256);
    on.wait_for_chains().unwrap();
    let (fewest, most) = on
        .chain_attention_limits()
        .unwrap_or_else(|| panic!("{model}: no chain is led by attention"));
    assert!(
        fewest >= 256 && most < 4096,
        "{model}: limits {fewest}..{most}"
    );
    // Any tokens will do: the same ones on both sides.
    let token = |i: u32| 100 + i * 7919 % 5000;
    let mut pos = 0u32;
    let mut singles = 0;
    for limit in [fewest, most] {
        // A batch up to four positions before the limit, then eight single tokens
        // across it.
        while pos + 4 < limit {
            let n = (limit - 4 - pos).min(256);
            let batch: Vec<u32> = (pos..pos + n).map(token).collect();
            same_step(&mut on, &mut off, &batch, pos, &format!("{model}, batch"));
            pos += n;
        }
        for _ in 0..8 {
            let what = format!("{model}, single token");
            same_step(&mut on, &mut off, &[token(pos)], pos, &what);
            pos += 1;
            singles += 1;
        }
    }
    assert_eq!(
        on.chained_steps(),
        singles,
        "{model}: steps run with chains"
    );
}

#[test]
fn smollm2_chains_past_the_attention_limit() {
    if !common::lavapipe_here("smollm2_chains_past_the_attention_limit") {
        return;
    }
    same_logits_past_the_attention_limit("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn gemma3_chains_past_the_attention_limit() {
    if !common::lavapipe_here("gemma3_chains_past_the_attention_limit") {
        return;
    }
    same_logits_past_the_attention_limit("gemma-3-270m-q4_k_m.gguf");
}

/// A run too short to repay the chains' compilation (`wgllm run -n N` under
/// `FEW_TOKENS`) leaves them off on lavapipe, where they are otherwise on by default;
/// asked for, they run anyway.
#[test]
fn a_short_run_leaves_chains_off_unless_asked() {
    if !common::lavapipe_here("a_short_run_leaves_chains_off_unless_asked") {
        return;
    }
    let ctx = |chains, few_tokens| {
        let opts = DeviceOptions {
            chains,
            few_tokens,
            ..Default::default()
        };
        GpuContext::new(&opts).unwrap().chains()
    };
    // The default where WGLLM_CHAINS leaves it (on for lavapipe).
    if std::env::var_os(wgllm::gpu::context::CHAINS_ENV).is_none() {
        assert!(ctx(None, false), "chains are on by default on lavapipe");
        assert!(!ctx(None, true), "a short run leaves them off");
    }
    assert!(ctx(Some(true), true), "asked for, a short run runs them");
    assert!(!ctx(Some(false), false));
}
