//! Model files whose metadata contradicts their tensors, or describes an impossible
//! model. Each is a tiny synthetic llama GGUF with one thing broken; loading it the way
//! the CLI does (configuration, tokenizer, GPU upload on the first adapter, and the CPU
//! model) must return an error that names the problem, and never panic. A few run
//! through the `wgllm` binary: non-zero exit, one `error:` line, no panic message.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use wgllm::cpu::backend::CpuModel;
use wgllm::gguf::{GgufFile, GgufWriter, Value, ValueType};
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::model::gpu_backend::{GpuModel, LoadOptions, Logits};
use wgllm::model::Config;
use wgllm::quant::GgmlType;
use wgllm::tokenizer::Tokenizer;

// ---------------------------------------------------------------- a tiny llama

/// One tensor to write: data is zeros of the right size for the shape and type.
#[derive(Clone, Debug)]
struct TensorSpec {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
}

/// Metadata and tensor table of a model, edited by each case before it is written.
#[derive(Clone, Debug)]
struct Spec {
    kv: Vec<(String, Value)>,
    tensors: Vec<TensorSpec>,
}

const N_EMBD: u64 = 32;
const N_HEAD: u64 = 4;
const N_HEAD_KV: u64 = 2;
const N_FF: u64 = 64;
const N_LAYER: u64 = 2;

/// Token strings: a few byte-level BPE tokens (one merged), then a BOS/EOS.
fn vocab() -> Vec<&'static str> {
    vec!["a", "b", "c", "d", "h", "i", "hi", "Ġ", "<|endoftext|>"]
}

impl Spec {
    /// A well-formed llama: 2 layers, n_embd 32, 4 heads over 2 KV heads, F32 weights.
    fn llama() -> Spec {
        let n_vocab = vocab().len() as u64;
        let u = |v: u64| Value::U32(v as u32);
        let mut kv: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String("llama".into())),
            ("llama.context_length".into(), u(64)),
            ("llama.embedding_length".into(), u(N_EMBD)),
            ("llama.feed_forward_length".into(), u(N_FF)),
            ("llama.block_count".into(), u(N_LAYER)),
            ("llama.attention.head_count".into(), u(N_HEAD)),
            ("llama.attention.head_count_kv".into(), u(N_HEAD_KV)),
            (
                "llama.attention.layer_norm_rms_epsilon".into(),
                Value::F32(1e-5),
            ),
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
        ];
        let strings = |v: Vec<&str>| {
            Value::Array(
                ValueType::String,
                v.into_iter().map(|s| Value::String(s.into())).collect(),
            )
        };
        kv.push(("tokenizer.ggml.tokens".into(), strings(vocab())));
        kv.push(("tokenizer.ggml.merges".into(), strings(vec!["h i"])));
        kv.push((
            "tokenizer.ggml.bos_token_id".into(),
            Value::U32(n_vocab as u32 - 1),
        ));
        kv.push((
            "tokenizer.ggml.eos_token_id".into(),
            Value::U32(n_vocab as u32 - 1),
        ));
        let hd = N_EMBD / N_HEAD;
        let (e, q, kvd, ff) = (N_EMBD, hd * N_HEAD, hd * N_HEAD_KV, N_FF);
        let t = |name: &str, dims: &[u64]| TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty: GgmlType::F32,
        };
        let mut tensors = vec![t("token_embd.weight", &[e, n_vocab])];
        for il in 0..N_LAYER {
            let b = |s: &str| format!("blk.{il}.{s}.weight");
            tensors.extend([
                t(&b("attn_norm"), &[e]),
                t(&b("attn_q"), &[e, q]),
                t(&b("attn_k"), &[e, kvd]),
                t(&b("attn_v"), &[e, kvd]),
                t(&b("attn_output"), &[q, e]),
                t(&b("ffn_norm"), &[e]),
                t(&b("ffn_gate"), &[e, ff]),
                t(&b("ffn_up"), &[e, ff]),
                t(&b("ffn_down"), &[ff, e]),
            ]);
        }
        tensors.push(t("output_norm.weight", &[e]));
        Spec { kv, tensors }
    }

    fn set(mut self, key: &str, v: Value) -> Spec {
        match self.kv.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = v,
            None => self.kv.push((key.into(), v)),
        }
        self
    }

    fn set_u32(self, key: &str, v: u32) -> Spec {
        self.set(key, Value::U32(v))
    }

    fn remove_key(mut self, key: &str) -> Spec {
        self.kv.retain(|(k, _)| k != key);
        self
    }

    fn remove_tensor(mut self, name: &str) -> Spec {
        self.tensors.retain(|t| t.name != name);
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType) -> Spec {
        let t = TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
        };
        match self.tensors.iter_mut().find(|x| x.name == name) {
            Some(x) => *x = t,
            None => self.tensors.push(t),
        }
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut w = GgufWriter::new();
        for (k, v) in &self.kv {
            w.add(k, v.clone());
        }
        for t in &self.tensors {
            let (ne0, rest) = t.dims.split_first().unwrap();
            let rows: u64 = rest.iter().product();
            let n = t.ty.row_bytes(*ne0).unwrap() * rows;
            let data = if t.ty == GgmlType::F32 {
                // Small non-zero values so a model that loads also computes something.
                (0..n / 4)
                    .flat_map(|i| (((i % 7) as f32 - 3.0) * 0.01 + 0.5).to_le_bytes())
                    .collect()
            } else {
                vec![0u8; n as usize]
            };
            w.add_tensor(&t.name, &t.dims, t.ty, data).unwrap();
        }
        w.to_bytes()
    }

    fn write(&self, name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wgllm-hostile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("{name}.gguf"));
        std::fs::write(&p, self.bytes()).unwrap();
        p
    }
}

// ---------------------------------------------------------------- loading like the CLI

fn gpu() -> Arc<GpuContext> {
    static CTX: OnceLock<Arc<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| {
        Arc::new(
            GpuContext::new(&DeviceOptions::default())
                .expect("a GPU adapter (lavapipe) is needed: GPU tests fail rather than skip"),
        )
    })
    .clone()
}

/// Configuration and tokenizer, as `wgllm run` builds them before any upload.
fn prepare(bytes: Vec<u8>) -> wgllm::Result<(GgufFile, Config)> {
    let file = GgufFile::from_bytes(bytes)?;
    let cfg = Config::from_metadata(file.metadata())?;
    Tokenizer::from_gguf(file.metadata())?;
    Ok((file, cfg))
}

fn load_gpu(bytes: Vec<u8>) -> wgllm::Result<()> {
    let (file, cfg) = prepare(bytes)?;
    let opts = LoadOptions {
        n_ctx: cfg.n_ctx_train.min(64),
        n_batch: 8,
        ..Default::default()
    };
    let mut m = GpuModel::load(gpu(), &file, cfg, &opts)?;
    m.step(&[0, 1], 0, Logits::Last)?;
    Ok(())
}

fn load_cpu(bytes: Vec<u8>) -> wgllm::Result<()> {
    let (file, cfg) = prepare(bytes)?;
    let n_ctx = cfg.n_ctx_train.min(64);
    let mut m = CpuModel::load(Arc::new(file), cfg, n_ctx, 8, 1)?;
    m.step(&[0, 1], 0, Logits::Last)?;
    Ok(())
}

/// Both backends must refuse `spec` with an error whose text contains every `needle`.
fn refused(what: &str, spec: &Spec, needles: &[&str]) {
    let bytes = spec.bytes();
    for (backend, load) in [
        ("gpu", load_gpu as fn(Vec<u8>) -> wgllm::Result<()>),
        ("cpu", load_cpu),
    ] {
        let outcome = catch_unwind(AssertUnwindSafe(|| load(bytes.clone())));
        let err = match outcome {
            Err(_) => panic!("{what} ({backend}): panicked instead of returning an error"),
            Ok(Ok(())) => panic!("{what} ({backend}): loaded and ran"),
            Ok(Err(e)) => e.to_string(),
        };
        for n in needles {
            assert!(
                err.contains(n),
                "{what} ({backend}): error {err:?} does not mention {n:?}"
            );
        }
        assert!(
            !err.contains('\n'),
            "{what}: error is not one line: {err:?}"
        );
    }
}

// ---------------------------------------------------------------- cases

#[test]
fn the_base_model_loads_and_runs_on_both_backends() {
    // Without this the other cases could fail for a reason of the builder's own.
    let bytes = Spec::llama().bytes();
    load_gpu(bytes.clone()).unwrap();
    load_cpu(bytes).unwrap();
}

#[test]
fn head_counts_that_do_not_divide() {
    let s = Spec::llama().set_u32("llama.attention.head_count_kv", 3);
    refused("4 heads over 3 KV heads", &s, &["4 heads", "3 KV heads"]);
    let s = Spec::llama()
        .set_u32("llama.attention.head_count", 5)
        .set_u32("llama.attention.head_count_kv", 5);
    refused("n_embd 32 over 5 heads", &s, &["32", "5 heads"]);
    let s = Spec::llama().set_u32("llama.attention.head_count", 0);
    refused("zero heads", &s, &["0 heads"]);
}

#[test]
fn missing_required_keys_are_named() {
    for key in [
        "general.architecture",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.block_count",
        "llama.feed_forward_length",
        "llama.attention.layer_norm_rms_epsilon",
        "tokenizer.ggml.model",
        "tokenizer.ggml.tokens",
    ] {
        refused(
            &format!("without {key}"),
            &Spec::llama().remove_key(key),
            &[key],
        );
    }
}

#[test]
fn keys_of_the_wrong_type_are_named() {
    let s = Spec::llama().set("llama.block_count", Value::String("two".into()));
    refused("block_count as a string", &s, &["llama.block_count"]);
    let s = Spec::llama().set("llama.embedding_length", Value::I32(-32));
    refused("negative embedding length", &s, &["llama.embedding_length"]);
}

#[test]
fn vocab_size_that_contradicts_the_embedding() {
    let s = Spec::llama().set_u32("llama.vocab_size", 100);
    refused("vocab_size 100", &s, &["token_embd.weight", "100"]);
    // No vocab_size key: the token list gives 9, the embedding has 12 rows.
    let s = Spec::llama().tensor("token_embd.weight", &[N_EMBD, 12], GgmlType::F32);
    refused("12 embedding rows", &s, &["token_embd.weight", "12"]);
}

#[test]
fn tensor_shapes_that_contradict_the_metadata() {
    let s = Spec::llama().tensor("blk.1.attn_q.weight", &[N_EMBD, 16], GgmlType::F32);
    refused(
        "attn_q of 16 rows",
        &s,
        &["blk.1.attn_q.weight", "[32, 16]"],
    );
    let s = Spec::llama().tensor("blk.0.ffn_down.weight", &[N_FF, N_EMBD, 2], GgmlType::F32);
    refused("3-d ffn_down", &s, &["blk.0.ffn_down.weight"]);
    let s = Spec::llama().tensor("output_norm.weight", &[N_EMBD + 1], GgmlType::F32);
    refused("output_norm of 33", &s, &["output_norm.weight"]);
    let s = Spec::llama().tensor("output.weight", &[N_EMBD, 3], GgmlType::F32);
    refused("output of 3 rows", &s, &["output.weight"]);
    let s = Spec::llama().remove_tensor("blk.1.ffn_up.weight");
    refused("no ffn_up", &s, &["missing tensor blk.1.ffn_up.weight"]);
    // More layers in the metadata than tensors in the file.
    let s = Spec::llama().set_u32("llama.block_count", 3);
    refused("3 layers declared", &s, &["blk.2."]);
}

#[test]
fn zero_context_and_zero_layers() {
    let s = Spec::llama().set_u32("llama.context_length", 0);
    refused("context_length 0", &s, &["llama.context_length"]);
    let s = Spec::llama().set_u32("llama.block_count", 0);
    refused("no layers", &s, &["0 layers"]);
    let s = Spec::llama().set_u32("llama.feed_forward_length", 0);
    refused("no feed-forward", &s, &["feed-forward 0"]);
}

#[test]
fn absurd_sizes_fail_cleanly() {
    let big = 1u32 << 31;
    let s = Spec::llama().set_u32("llama.embedding_length", big);
    refused("n_embd 2^31", &s, &["token_embd.weight"]);
    let s = Spec::llama().set_u32("llama.feed_forward_length", big);
    refused("n_ff 2^31", &s, &["ffn_gate"]);
    let s = Spec::llama().set_u32("llama.vocab_size", u32::MAX);
    refused("n_vocab 2^32-1", &s, &["token_embd.weight"]);
    // Heads whose total size overflows 32 bits.
    let s = Spec::llama()
        .set_u32("llama.attention.head_count", 1 << 16)
        .set_u32("llama.attention.head_count_kv", 1 << 16)
        .set_u32("llama.attention.key_length", 1 << 16)
        .set_u32("llama.attention.value_length", 1 << 16)
        .set_u32("llama.rope.dimension_count", 64);
    refused("head size x heads over 2^32", &s, &["heads"]);
    let s = Spec::llama().set_u32("llama.attention.key_length", 0);
    refused("key_length 0", &s, &["llama.attention.key_length"]);
}

#[test]
fn norm_weights_of_a_quantized_type_on_the_gpu() {
    // The CPU dequantizes one-dimensional weights of any type, so a Q8_0 norm is valid
    // there; the GPU kernel reads f32 and must refuse it rather than read raw blocks.
    let s = Spec::llama().tensor("blk.0.attn_norm.weight", &[N_EMBD], GgmlType::Q8_0);
    let Err(err) = load_gpu(s.bytes()) else {
        panic!("a Q8_0 norm on the GPU must be refused")
    };
    assert!(err.to_string().contains("blk.0.attn_norm.weight"), "{err}");
}

#[test]
fn norm_weights_of_a_quantized_type_on_the_cpu() {
    // Q8_0 norm weights run on the CPU, with the values they dequantize to.
    let s = Spec::llama().tensor("blk.0.attn_norm.weight", &[N_EMBD], GgmlType::Q8_0);
    load_cpu(s.bytes()).unwrap();
}

// ---------------------------------------------------------------- through the binary

fn wgllm(model: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["run", "-m", model.to_str().unwrap(), "-p", "hi", "-n", "2"];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(&args)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn cli_refuses(name: &str, spec: &Spec, needle: &str) {
    let path = spec.write(name);
    let (code, stderr) = wgllm(&path, &["--quiet"]);
    assert_ne!(code, 0, "{name}: exit code 0; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{name}: want one error line: {stderr}");
    assert!(errors[0].contains(needle), "{name}: {stderr}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn the_cli_reports_broken_models_in_one_line() {
    cli_refuses(
        "bad_heads",
        &Spec::llama().set_u32("llama.attention.head_count_kv", 3),
        "KV heads",
    );
    cli_refuses(
        "no_embd",
        &Spec::llama().remove_key("llama.embedding_length"),
        "llama.embedding_length",
    );
    cli_refuses(
        "short_q",
        &Spec::llama().tensor("blk.1.attn_q.weight", &[N_EMBD, 16], GgmlType::F32),
        "blk.1.attn_q.weight",
    );
    cli_refuses(
        "huge_embd",
        &Spec::llama().set_u32("llama.embedding_length", 1 << 31),
        "token_embd.weight",
    );
    // Not a GGUF at all.
    let dir = std::env::temp_dir().join(format!("wgllm-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("notes.gguf");
    std::fs::write(&text, b"this is not a model").unwrap();
    let (code, stderr) = wgllm(&text, &["--quiet"]);
    assert_ne!(code, 0);
    assert!(
        stderr.starts_with("error: ") && stderr.contains("magic"),
        "{stderr}"
    );
    let (code, stderr) = wgllm(&dir.join("absent.gguf"), &["--quiet"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("absent.gguf"), "{stderr}");
}

#[test]
fn the_cli_runs_the_base_model() {
    let path = Spec::llama().write("base");
    let (code, stderr) = wgllm(&path, &["--quiet", "--temp", "0"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    let _ = std::fs::remove_file(path);
}
