//! The GGUF reader on arbitrary bytes, then everything built from a parsed header: the
//! metadata walk, the tensor table, the model configuration, the tokenizer and, when the
//! tensors fit the configuration, a CPU model and one forward step.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use wgllm::cpu::backend::CpuModel;
use wgllm::gguf::{GgufFile, Value};
use wgllm::model::gpu_backend::Logits;
use wgllm::model::Config;
use wgllm::tokenizer::Tokenizer;

/// Largest tensor (in elements) dequantized per input, to keep executions fast.
const MAX_DEQUANT: u64 = 1 << 16;

fn walk(v: &Value, depth: usize) {
    let _ = (v.as_u64(), v.as_i64(), v.as_f32(), v.as_bool(), v.as_str());
    let _ = v.value_type().name();
    for i in 0..v.array_len().unwrap_or(0).min(64) {
        if let Some(item) = v.array_item(i) {
            walk(&item, depth + 1);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let md = file.metadata();
    for (key, value) in md.iter() {
        walk(value, 0);
        let _ = (
            md.get_u32(key),
            md.get_u64(key),
            md.get_f32(key),
            md.get_bool(key),
        );
        let _ = (
            md.get_str(key),
            md.get_str_array(key),
            md.get_f32_array(key),
        );
        let _ = (md.get_i32_array(key), md.get_u32_array(key));
    }
    let _ = md.architecture();
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(
            bytes.len() as u64,
            t.n_bytes,
            "tensor {} data length",
            t.name
        );
        assert!(file.tensor(&t.name).is_some());
        assert_eq!(
            t.n_rows().saturating_mul(t.row_bytes()),
            t.n_bytes,
            "{}",
            t.name
        );
        let n = t.n_elements();
        if n <= MAX_DEQUANT {
            let mut out = vec![0f32; n as usize];
            wgllm::quant::dequantize(t.ty, bytes, &mut out)
                .unwrap_or_else(|e| panic!("tensor {} passed the parser: {e}", t.name));
        }
    }
    let tok = Tokenizer::from_gguf(md).ok();
    if let Some(tok) = &tok {
        for text in ["Hello world", " <|im_start|>x\n\u{00e9}\u{1F600}", ""] {
            if let Ok(ids) = tok.encode(text, true, true) {
                let _ = tok.decode(&ids);
            }
        }
        let _ = (tok.bos(), tok.eos(), tok.eot(), tok.eog_ids());
    }
    let Ok(cfg) = Config::from_metadata(md) else {
        return;
    };
    let _ = (cfg.q_dim(), cfg.kv_dim());
    for il in 0..cfg.n_layer.min(64) {
        let _ = cfg.is_local(il);
    }
    // A model whose tensors match its configuration runs one step on the CPU. Every
    // allocation is bounded by the tensors the file holds and the small context asked.
    let file = Arc::new(file);
    if let Ok(mut m) = CpuModel::load(file, cfg.clone(), 8, 4, 1) {
        let ids = [0u32, cfg.n_vocab.saturating_sub(1)];
        if let Ok(logits) = m.step(&ids, 0, Logits::Last) {
            assert_eq!(logits.len(), cfg.n_vocab as usize);
        }
    }
});
