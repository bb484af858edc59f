//! One test per bug found by fuzzing or by the hostile-input tests, named after what the
//! input was. Each failed (panicked or was accepted) before its fix.

use wgllm::gguf::{Metadata, Value};
use wgllm::model::Config;

/// The llama keys `Config::from_metadata` needs, for a 4-head model of width 32.
fn llama_metadata() -> Metadata {
    let mut md = Metadata::new();
    let mut put = |k: &str, v: Value| {
        md.insert(k.to_string(), v);
    };
    put("general.architecture", Value::String("llama".into()));
    put("llama.embedding_length", Value::U32(32));
    put("llama.feed_forward_length", Value::U32(64));
    put("llama.block_count", Value::U32(1));
    put("llama.attention.head_count", Value::U32(4));
    put("llama.vocab_size", Value::U32(10));
    put("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    md
}

fn config_error(md: &Metadata) -> String {
    match Config::from_metadata(md) {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn base_metadata_is_accepted() {
    let c = Config::from_metadata(&llama_metadata()).unwrap();
    assert_eq!((c.head_dim, c.q_dim(), c.kv_dim()), (8, 32, 32));
}

/// Heads of 2^16 dimensions times 2^16 heads: `q_dim()` overflowed u32 (a panic with
/// overflow checks, a wrapped size without).
#[test]
fn head_size_times_heads_overflowing_u32() {
    let mut md = llama_metadata();
    md.insert("llama.attention.head_count".into(), Value::U32(1 << 16));
    md.insert("llama.attention.key_length".into(), Value::U32(1 << 16));
    md.insert("llama.rope.dimension_count".into(), Value::U32(64));
    let err = config_error(&md);
    assert!(err.contains("overflow"), "{err}");
    // Overflow through the KV heads alone is caught too.
    md.insert("llama.attention.head_count".into(), Value::U32(1));
    md.insert("llama.attention.key_length".into(), Value::U32(1 << 31));
    md.insert("llama.attention.head_count_kv".into(), Value::U32(1));
    assert!(Config::from_metadata(&md).is_ok());
    md.insert("llama.attention.head_count".into(), Value::U32(2));
    md.insert("llama.attention.head_count_kv".into(), Value::U32(2));
    let err = config_error(&md);
    assert!(err.contains("overflow"), "{err}");
}

/// `key_length = 0` gave heads of no dimension: an infinite attention scale and
/// zero-sized Q/K/V tensors expected from the file.
#[test]
fn key_length_zero() {
    let mut md = llama_metadata();
    md.insert("llama.attention.key_length".into(), Value::U32(0));
    let err = config_error(&md);
    assert!(err.contains("llama.attention.key_length is 0"), "{err}");
}

/// `context_length = 0` made the CLI's default context 0, refused later with a message
/// about the `-c` option the user never gave.
#[test]
fn context_length_zero() {
    let mut md = llama_metadata();
    md.insert("llama.context_length".into(), Value::U32(0));
    let err = config_error(&md);
    assert!(err.contains("llama.context_length is 0"), "{err}");
}
