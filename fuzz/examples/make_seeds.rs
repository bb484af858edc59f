//! Writes the committed seed corpus under `fuzz/seeds/`: tiny synthetic GGUF models for
//! `gguf_parse` and text snippets for the tokenizer targets.
//!
//! Run from `fuzz/`: `cargo run --example make_seeds`.

use std::path::Path;

use wgllm::gguf::{GgufWriter, Value, ValueType};
use wgllm::quant::{self, GgmlType};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Deterministic values in [-0.5, 0.5).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn encode(ty: GgmlType, x: &[f32]) -> Res<Vec<u8>> {
    Ok(match ty {
        GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        _ => {
            let mut q = Vec::new();
            quant::quantize(ty, x, &mut q)?;
            q
        }
    })
}

fn strings(items: &[&str]) -> Value {
    Value::Array(
        ValueType::String,
        items.iter().map(|s| Value::String(s.to_string())).collect(),
    )
}

/// GPT-2's byte-to-character table: printable bytes stand for themselves, the rest are
/// shifted past U+0100.
fn gpt2_byte_chars() -> Vec<String> {
    let mut shifted = 0u32;
    (0u32..256)
        .map(|b| {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            let c = if printable {
                b
            } else {
                shifted += 1;
                255 + shifted
            };
            char::from_u32(c).map(String::from).unwrap_or_default()
        })
        .collect()
}

struct Tok {
    tokens: Vec<String>,
    types: Vec<i32>,
}

/// A byte-level BPE vocabulary: every byte, a few merges, ChatML specials.
fn bpe_vocab(w: &mut GgufWriter) -> usize {
    let mut t = Tok {
        tokens: gpt2_byte_chars(),
        types: vec![1; 256],
    };
    let merges = ["h e", "l l", "he ll", "Ġ w", "o r", "Ġw or"];
    for m in merges {
        t.tokens.push(m.replace(' ', ""));
        t.types.push(1);
    }
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        t.tokens.push(s.to_string());
        t.types.push(3);
    }
    let n = t.tokens.len();
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.add("tokenizer.ggml.pre", Value::String("smollm".into()));
    let refs: Vec<&str> = t.tokens.iter().map(String::as_str).collect();
    w.add("tokenizer.ggml.tokens", strings(&refs));
    w.add(
        "tokenizer.ggml.token_type",
        Value::Array(
            ValueType::I32,
            t.types.iter().map(|&v| Value::I32(v)).collect(),
        ),
    );
    w.add("tokenizer.ggml.merges", strings(&merges));
    w.add("tokenizer.ggml.bos_token_id", Value::U32(n as u32 - 3));
    w.add("tokenizer.ggml.eos_token_id", Value::U32(n as u32 - 1));
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(false));
    n
}

/// A SentencePiece vocabulary: unk/bos/eos, 256 byte tokens, a few scored pieces.
fn spm_vocab(w: &mut GgufWriter) -> usize {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (i, p) in [
        "▁",
        "▁h",
        "e",
        "l",
        "o",
        "▁hello",
        "ll",
        "▁w",
        "or",
        "ld",
        "<start_of_turn>",
    ]
    .iter()
    .enumerate()
    {
        tokens.push(p.to_string());
        types.push(if p.starts_with('<') { 3 } else { 1 });
        scores.push(-(i as f32));
    }
    let n = tokens.len();
    w.add("tokenizer.ggml.model", Value::String("llama".into()));
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    w.add("tokenizer.ggml.tokens", strings(&refs));
    w.add(
        "tokenizer.ggml.scores",
        Value::Array(ValueType::F32, scores.into_iter().map(Value::F32).collect()),
    );
    w.add(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
    );
    w.add("tokenizer.ggml.unknown_token_id", Value::U32(0));
    w.add("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.add("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.add("tokenizer.ggml.add_space_prefix", Value::Bool(true));
    n
}

struct Shape {
    arch: &'static str,
    n_embd: u64,
    n_head: u64,
    n_head_kv: u64,
    n_ff: u64,
    n_layer: u64,
    matrix: GgmlType,
    tied: bool,
}

/// A whole model: hyper-parameters, tokenizer, and tensors matching them.
fn model(s: &Shape, spm: bool) -> Res<GgufWriter> {
    let mut w = GgufWriter::new();
    let a = s.arch;
    w.add("general.architecture", Value::String(a.into()));
    w.add("general.name", Value::String(format!("tiny {a}")));
    w.add(&format!("{a}.context_length"), Value::U32(64));
    w.add(
        &format!("{a}.embedding_length"),
        Value::U32(s.n_embd as u32),
    );
    w.add(
        &format!("{a}.feed_forward_length"),
        Value::U32(s.n_ff as u32),
    );
    w.add(&format!("{a}.block_count"), Value::U32(s.n_layer as u32));
    w.add(
        &format!("{a}.attention.head_count"),
        Value::U32(s.n_head as u32),
    );
    w.add(
        &format!("{a}.attention.head_count_kv"),
        Value::U32(s.n_head_kv as u32),
    );
    w.add(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    w.add(&format!("{a}.rope.freq_base"), Value::F32(10000.0));
    if a == "gemma3" {
        w.add(&format!("{a}.attention.sliding_window"), Value::U32(4));
    }
    let n_vocab = if spm {
        spm_vocab(&mut w)
    } else {
        bpe_vocab(&mut w)
    } as u64;
    let hd = s.n_embd / s.n_head;
    let (e, q, kv, ff) = (s.n_embd, hd * s.n_head, hd * s.n_head_kv, s.n_ff);
    let mut seed = 1;
    let mut tensor = |w: &mut GgufWriter, name: &str, dims: &[u64], ty: GgmlType| -> Res {
        let n: u64 = dims.iter().product();
        seed += 1;
        let mut x = values(n as usize, seed);
        if dims.len() == 1 {
            // Norm weights near one, as trained models have.
            x.iter_mut().for_each(|v| *v += 1.0);
        }
        w.add_tensor(name, dims, ty, encode(ty, &x)?)?;
        Ok(())
    };
    let m = s.matrix;
    tensor(&mut w, "token_embd.weight", &[e, n_vocab], m)?;
    for il in 0..s.n_layer {
        let b = |n: &str| format!("blk.{il}.{n}.weight");
        tensor(&mut w, &b("attn_norm"), &[e], GgmlType::F32)?;
        tensor(&mut w, &b("attn_q"), &[e, q], m)?;
        tensor(&mut w, &b("attn_k"), &[e, kv], m)?;
        tensor(&mut w, &b("attn_v"), &[e, kv], m)?;
        tensor(&mut w, &b("attn_output"), &[q, e], m)?;
        if a == "gemma3" {
            tensor(&mut w, &b("attn_q_norm"), &[hd], GgmlType::F32)?;
            tensor(&mut w, &b("attn_k_norm"), &[hd], GgmlType::F32)?;
            tensor(&mut w, &b("post_attention_norm"), &[e], GgmlType::F32)?;
            tensor(&mut w, &b("post_ffw_norm"), &[e], GgmlType::F32)?;
        }
        tensor(&mut w, &b("ffn_norm"), &[e], GgmlType::F32)?;
        tensor(&mut w, &b("ffn_gate"), &[e, ff], m)?;
        tensor(&mut w, &b("ffn_up"), &[e, ff], m)?;
        tensor(&mut w, &b("ffn_down"), &[ff, e], m)?;
    }
    tensor(&mut w, "output_norm.weight", &[e], GgmlType::F32)?;
    if !s.tied {
        tensor(&mut w, "output.weight", &[e, n_vocab], m)?;
    }
    Ok(w)
}

/// Every value type, nested and empty arrays, a non-default alignment and several
/// tensor types, with no model around them.
fn values_file() -> Res<GgufWriter> {
    let mut w = GgufWriter::new().with_alignment(64);
    w.add("u8", Value::U8(7));
    w.add("i8", Value::I8(-7));
    w.add("u16", Value::U16(700));
    w.add("i16", Value::I16(-700));
    w.add("u32", Value::U32(70_000));
    w.add("i32", Value::I32(-70_000));
    w.add("f32", Value::F32(0.5));
    w.add("bool", Value::Bool(true));
    w.add("string", Value::String("héllo".into()));
    w.add("u64", Value::U64(1 << 40));
    w.add("i64", Value::I64(-(1 << 40)));
    w.add("f64", Value::F64(-0.25));
    w.add("empty", Value::Array(ValueType::U32, Vec::new()));
    w.add(
        "nested",
        Value::Array(
            ValueType::Array,
            vec![
                Value::Array(ValueType::I16, vec![Value::I16(1), Value::I16(-2)]),
                Value::Array(ValueType::String, vec![Value::String("x".into())]),
            ],
        ),
    );
    for (i, ty) in [
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ]
    .into_iter()
    .enumerate()
    {
        let n = ty.block_size().max(32) as u64 * 2;
        let x = values(n as usize, i as u64);
        let data = match ty {
            GgmlType::F16 => x
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            GgmlType::BF16 => x
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            _ => encode(ty, &x)?,
        };
        w.add_tensor(&format!("t{i}.{ty}"), &[n / 2, 2], ty, data)?;
    }
    Ok(w)
}

const TEXTS: &[(&str, &str)] = &[
    (
        "english",
        "Hello world! The quick brown fox jumps over the lazy dog.",
    ),
    (
        "chatml",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    ),
    (
        "gemma_turn",
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    ),
    (
        "code",
        "fn main() {\n    let x = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");\n}\n",
    ),
    ("numbers", "3.14159 1234567890 1,000,000 0x1F 2024-01-01"),
    (
        "spaces",
        "  leading and   multiple    spaces\n\n\r\n\t end  ",
    ),
    (
        "unicode",
        "héllo wörld ñ Ελληνικά русский 中文字符 日本語 한국어 🦀🎉👍🏽",
    ),
    ("contractions", "I'm can't we'll they've it's DON'T"),
    ("special_like", "<|endoftext|><s></s><unk><bos> <|im_end|"),
    (
        "combining",
        "e\u{301} a\u{30A} \u{200d}\u{fe0f} \u{feff}zero width",
    ),
];

fn main() -> Res {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let gguf = root.join("gguf_parse");
    std::fs::create_dir_all(&gguf)?;
    let llama = |matrix, tied, n_embd, n_head, n_head_kv| Shape {
        arch: "llama",
        n_embd,
        n_head,
        n_head_kv,
        n_ff: 2 * n_embd,
        n_layer: 1,
        matrix,
        tied,
    };
    model(&llama(GgmlType::F32, false, 8, 2, 1), false)?
        .write_file(&gguf.join("llama_bpe_f32.gguf"))?;
    model(&llama(GgmlType::Q8_0, true, 32, 4, 2), true)?
        .write_file(&gguf.join("llama_spm_q8_0.gguf"))?;
    let gemma = Shape {
        arch: "gemma3",
        n_embd: 8,
        n_head: 2,
        n_head_kv: 1,
        n_ff: 16,
        n_layer: 2,
        matrix: GgmlType::F32,
        tied: true,
    };
    model(&gemma, true)?.write_file(&gguf.join("gemma3_spm_f32.gguf"))?;
    values_file()?.write_file(&gguf.join("values.gguf"))?;
    GgufWriter::new().write_file(&gguf.join("empty.gguf"))?;
    for target in ["tokenize_bpe", "tokenize_spm"] {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, text) in TEXTS {
            std::fs::write(dir.join(name), text)?;
        }
        // Bytes that are not UTF-8: a lone continuation, a cut sequence, an overlong form.
        std::fs::write(
            dir.join("invalid_utf8"),
            b"ab\x80cd\xe2\x82 \xc0\xaf\xff\xfe end",
        )?;
    }
    println!("seeds written under {}", root.display());
    Ok(())
}
