//! SentencePiece (Gemma 3's vocabulary) on arbitrary bytes.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use wgllm::tokenizer::Tokenizer;
use wgllm_fuzz::RoundTrip;

static TOKENIZER: LazyLock<(Tokenizer, RoundTrip)> = LazyLock::new(|| {
    let tok = wgllm_fuzz::load_tokenizer("llama");
    let rt = RoundTrip::SentencePiece;
    (tok, rt)
});

fuzz_target!(|data: &[u8]| {
    let (tok, rt) = &*TOKENIZER;
    wgllm_fuzz::exercise_tokenizer(tok, data, rt);
});
