//! Byte-level BPE (SmolLM2's vocabulary) on arbitrary bytes.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use wgllm::tokenizer::Tokenizer;

static TOKENIZER: LazyLock<Tokenizer> = LazyLock::new(|| wgllm_fuzz::load_tokenizer("gpt2"));

fuzz_target!(|data: &[u8]| {
    wgllm_fuzz::exercise_tokenizer(&TOKENIZER, data, true);
});
