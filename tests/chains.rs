//! Chains (`ops::chain`): on lavapipe a decode step runs each run of single-token
//! products as one dispatch, its products in turn. The same model loaded with and
//! without chains must give bit for bit the same logits at every single-token step (the
//! products run the same code on the same data; only the dispatching differs), before
//! and after a batch step (which runs without chains) and deep enough that each chain's
//! counters have been zeroed and reused many times.
//!
//! Uses the real models in `models/` and the first adapter (lavapipe here).

use std::path::PathBuf;
use std::sync::Arc;

use wgllm::gguf::GgufFile;
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::model::gpu_backend::{GpuModel, LoadOptions, Logits};
use wgllm::model::Config;
use wgllm::tokenizer::Tokenizer;

fn load(model: &str, chains: bool) -> (GpuModel, Tokenizer) {
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
        n_ctx: 256,
        n_batch: 16,
        ..Default::default()
    };
    (GpuModel::load(ctx, &file, cfg, &lo).unwrap(), tok)
}

/// Greedy steps of both engines from `prompt`, `n` single tokens, a batch of three
/// tokens, then `n` more; every step's logits compared bit for bit.
fn same_logits(model: &str, n: usize) {
    let (mut on, tok) = load(model, true);
    let (mut off, _) = load(model, false);
    // A layer's products and norms join one chain, all but its attention: at least
    // three dispatches spared per layer (SmolLM2's four products, Gemma 3's five
    // products and two post-norms).
    let layers = on.cfg.n_layer as usize;
    assert!(
        on.chained_dispatches() >= 3 * (layers - 1),
        "{model}: chains spare {} dispatches of {layers} layers",
        on.chained_dispatches()
    );
    assert_eq!(off.chained_dispatches(), 0);
    // The chains' pipelines compile beside the first steps; from here on every
    // single-token step runs them.
    on.wait_for_chains().unwrap();
    let ids = tok
        .encode("The history of the Roman empire", false, false)
        .unwrap();
    let mut pos = 0u32;
    let mut step = |tokens: &[u32], what: &str| -> u32 {
        let a = on.step(tokens, pos, Logits::Last).unwrap();
        let b = off.step(tokens, pos, Logits::Last).unwrap();
        let differ = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            differ, 0,
            "{model}, {what} at {pos}: {differ} logits differ"
        );
        pos += tokens.len() as u32;
        wgllm::sampling::argmax(&a)
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
    same_logits("SmolLM2-135M-Instruct.Q4_1.gguf", 12);
}

#[test]
fn gemma3_chained_steps_give_the_same_logits() {
    same_logits("gemma-3-270m-q4_k_m.gguf", 6);
}
