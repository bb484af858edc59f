//! One test per bug found by fuzzing or by the hostile-input tests, named after what the
//! input was. Each failed (panicked or was accepted) before its fix.

use wgllm::gguf::{Metadata, Value};
use wgllm::model::Config;

/// The llama keys `Config::from_metadata` needs, for a 4-head model of width 32, with
/// `over` replacing or adding keys.
fn llama_metadata(over: &[(&str, Value)]) -> Metadata {
    let base = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.embedding_length", Value::U32(32)),
        ("llama.feed_forward_length", Value::U32(64)),
        ("llama.block_count", Value::U32(1)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.vocab_size", Value::U32(10)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    let mut md = Metadata::new();
    // `insert` keeps the first value of a key: the overrides go in first.
    for (k, v) in over.iter().cloned().chain(base) {
        md.insert(k.to_string(), v);
    }
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
    let c = Config::from_metadata(&llama_metadata(&[])).unwrap();
    assert_eq!((c.head_dim, c.q_dim(), c.kv_dim()), (8, 32, 32));
}

/// Heads of 2^16 dimensions times 2^16 heads: `q_dim()` overflowed u32 (a panic with
/// overflow checks, a wrapped size without).
#[test]
fn head_size_times_heads_overflowing_u32() {
    let big = |heads: u32, kv: u32, dim: u32| {
        llama_metadata(&[
            ("llama.attention.head_count", Value::U32(heads)),
            ("llama.attention.head_count_kv", Value::U32(kv)),
            ("llama.attention.key_length", Value::U32(dim)),
            ("llama.rope.dimension_count", Value::U32(64)),
        ])
    };
    let err = config_error(&big(1 << 16, 1 << 16, 1 << 16));
    assert!(err.contains("overflow"), "{err}");
    // One head of 2^31 fits; two do not.
    assert!(Config::from_metadata(&big(1, 1, 1 << 31)).is_ok());
    let err = config_error(&big(2, 2, 1 << 31));
    assert!(err.contains("overflow"), "{err}");
}

/// `key_length = 0` gave heads of no dimension: an infinite attention scale and
/// zero-sized Q/K/V tensors expected from the file.
#[test]
fn key_length_zero() {
    let md = llama_metadata(&[("llama.attention.key_length", Value::U32(0))]);
    let err = config_error(&md);
    assert!(err.contains("llama.attention.key_length is 0"), "{err}");
}

/// `context_length = 0` made the CLI's default context 0, refused later with a message
/// about the `-c` option the user never gave.
#[test]
fn context_length_zero() {
    let md = llama_metadata(&[("llama.context_length", Value::U32(0))]);
    let err = config_error(&md);
    assert!(err.contains("llama.context_length is 0"), "{err}");
}
