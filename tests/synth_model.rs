//! Synthetic models from `wgllm::gguf::synth` (what `wgllm-bench synth` writes): a tiny
//! one in each weight scheme is accepted by the reader, the configuration and the
//! tokenizer, and a CPU forward pass gives finite logits.

mod common;

use std::sync::Arc;

use wgllm::cpu::backend::CpuModel;
use wgllm::gguf::synth::{LlamaShape, SynthQuant, SynthSpec};
use wgllm::gguf::GgufFile;
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::model::gpu_backend::{GpuModel, Input, LoadOptions, Logits, Output};
use wgllm::model::Config;
use wgllm::quant::GgmlType;
use wgllm::tokenizer::Tokenizer;

fn write(spec: &SynthSpec, name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wgllm-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    let mut last = (0, 0);
    spec.write(&path, |done, total| last = (done, total))
        .unwrap();
    assert_eq!(last.0, last.1, "{name}: progress did not reach the total");
    path
}

#[test]
fn tiny_synthetic_models_load_and_give_finite_logits() {
    for quant in SynthQuant::ALL {
        let spec = SynthSpec::new(LlamaShape::TINY, quant);
        let path = write(&spec, quant.name());
        let file = GgufFile::open(&path).unwrap();

        // The reader's table is the plan, type for type.
        let want = spec.tensors();
        assert_eq!(file.tensors().len(), want.len(), "{}", quant.name());
        for (got, want) in file.tensors().iter().zip(&want) {
            assert_eq!(got.name, want.name);
            assert_eq!(got.ty, want.ty, "{}", want.name);
        }
        let file_len = std::fs::metadata(&path).unwrap().len();
        assert!(file_len > spec.data_bytes().unwrap());

        let cfg = Config::from_metadata(file.metadata()).unwrap();
        assert_eq!(cfg.n_vocab as u64, LlamaShape::TINY.n_vocab);
        let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
        let ids = tok.encode("hello world", true, false).unwrap();
        assert!(ids.len() >= 2, "{}: {ids:?}", quant.name());

        let mut m = CpuModel::load(Arc::new(file), cfg, 64, 16, 2).unwrap();
        let logits = m.step(&ids, 0, Logits::Last).unwrap();
        assert_eq!(logits.len() as u64, LlamaShape::TINY.n_vocab);
        assert!(
            logits.iter().all(|x| x.is_finite()),
            "{}: non-finite logits",
            quant.name()
        );
        // Random weights still give logits that differ between tokens.
        let (lo, hi) = logits
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        assert!(hi - lo > 1e-3, "{}: flat logits {lo}..{hi}", quant.name());
        // A second step continues from the cache.
        let next = m.step(&[ids[0]], ids.len() as u32, Logits::Last).unwrap();
        assert!(next.iter().all(|x| x.is_finite()));
        std::fs::remove_file(&path).ok();
    }
}

#[test]
fn gpu_and_cpu_agree_on_synthetic_weights() {
    // Random blocks reach scale and quant values trained weights rarely do (every
    // 6-bit scale/min pattern, negative Q6_K scales): both backends must still agree.
    // Logits of random weights are nearly flat, so compare values, not argmax.
    let ctx = Arc::new(
        GpuContext::new(&DeviceOptions::default())
            .expect("a GPU adapter (lavapipe) is needed: GPU tests fail rather than skip"),
    );
    for quant in [SynthQuant::Q4_0, SynthQuant::Q8_0, SynthQuant::Q4_K_M] {
        let spec = SynthSpec::new(LlamaShape::TINY, quant);
        let path = write(&spec, &format!("gpu-{}", quant.name()));
        let file = GgufFile::open(&path).unwrap();
        let cfg = Config::from_metadata(file.metadata()).unwrap();
        let ids = [300u32, 301, 302, 7, 500];
        let lo = LoadOptions {
            n_ctx: 64,
            n_batch: 8,
            ..Default::default()
        };
        let mut gpu = GpuModel::load(ctx.clone(), &file, cfg.clone(), &lo).unwrap();
        let g = gpu.step(&ids, 0, Logits::Last).unwrap();
        let mut cpu = CpuModel::load(Arc::new(file), cfg, 64, 8, 2).unwrap();
        let c = cpu.step(&ids, 0, Logits::Last).unwrap();
        assert!(g.iter().all(|x| x.is_finite()), "{}", quant.name());
        let num: f64 = g
            .iter()
            .zip(&c)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let den: f64 = c.iter().map(|b| (*b as f64).powi(2)).sum();
        // Both quantize activations differently; about 2e-4 is what they differ by.
        assert!(
            num / den < 2e-3,
            "{}: GPU and CPU logits differ, nmse {:.2e}",
            quant.name(),
            num / den
        );
        std::fs::remove_file(&path).ok();
    }
}

/// Top-k's candidates chosen on the device hold the best and the listed logits of a
/// model whose vocabulary (512) splits into a few spans and whose buffers are small.
#[test]
fn a_tiny_vocabulary_chooses_its_top_k_on_the_device() {
    let opts = DeviceOptions {
        top_k_on_device: Some(true),
        ..Default::default()
    };
    let ctx = Arc::new(GpuContext::new(&opts).expect("a GPU adapter (lavapipe) is needed"));
    let spec = SynthSpec::new(LlamaShape::TINY, SynthQuant::Q8_0);
    let path = write(&spec, "gpu-top-k");
    let file = GgufFile::open(&path).unwrap();
    let cfg = Config::from_metadata(file.metadata()).unwrap();
    let lo = LoadOptions {
        n_ctx: 64,
        n_batch: 8,
        ..Default::default()
    };
    let mut gpu = GpuModel::load(ctx, &file, cfg, &lo).unwrap();
    let ids = [300u32, 301, 302, 7, 500];
    let logits = gpu.step(&ids, 0, Logits::Last).unwrap();
    for (k, listed) in [(1u32, vec![]), (2, vec![9u32, 300]), (4, vec![])] {
        let got = gpu
            .step_top_k_io(Input::Tokens(&ids), 0, k, &listed)
            .unwrap();
        let mut best = got.clone();
        let want = k as usize + listed.len();
        wgllm::sampling::keep_best(&mut best, want);
        assert_eq!(best, wgllm::sampling::top_k(&logits, want), "top-{k}");
        for id in listed {
            assert!(got.contains(&(id, logits[id as usize])), "top-{k}: {id}");
        }
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn the_q4_k_m_mix_uses_q6_k_where_llama_cpp_does() {
    let spec = SynthSpec::new(LlamaShape::TINY, SynthQuant::Q4_K_M);
    let ty = |n: &str| spec.tensors().into_iter().find(|t| t.name == n).unwrap().ty;
    assert_eq!(ty("output.weight"), GgmlType::Q6_K);
    assert_eq!(ty("token_embd.weight"), GgmlType::Q4_K);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q4_K);
    // Two layers: both are in the first or last eighth rounded, so both get more bits.
    assert_eq!(ty("blk.1.ffn_down.weight"), GgmlType::Q6_K);
    assert_eq!(ty("blk.0.attn_norm.weight"), GgmlType::F32);
    let pure = SynthSpec {
        pure: true,
        ..spec.clone()
    };
    assert!(pure
        .tensors()
        .iter()
        .all(|t| t.dims.len() == 1 || t.ty == GgmlType::Q4_K));
}

#[test]
fn shapes_that_do_not_fit_the_types_are_refused() {
    let shape = LlamaShape {
        n_embd: 96,
        ..LlamaShape::TINY
    };
    let n_head = LlamaShape {
        n_head: 3,
        n_head_kv: 3,
        ..shape
    };
    let err = SynthSpec::new(n_head, SynthQuant::Q4_K_M)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("token_embd.weight"), "{err}");
    let err = SynthSpec::new(
        LlamaShape {
            n_vocab: 100,
            ..LlamaShape::TINY
        },
        SynthQuant::Q8_0,
    )
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("vocab 100"), "{err}");
}

#[test]
fn streamed_file_equals_the_in_memory_one() {
    use wgllm::gguf::{GgufStream, GgufWriter, TensorDesc, Value};
    let a: Vec<u8> = (0..4 * 40).map(|i| i as u8).collect();
    let b: Vec<u8> = (0..34 * 3).map(|i| (i * 7) as u8).collect();
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    w.add_tensor("a", &[40], GgmlType::F32, a.clone()).unwrap();
    w.add_tensor("b", &[32, 3], GgmlType::Q8_0, b.clone())
        .unwrap();
    let whole = w.to_bytes();

    let kv = vec![(
        "general.architecture".to_string(),
        Value::String("llama".into()),
    )];
    let descs = [
        TensorDesc::new("a", &[40], GgmlType::F32),
        TensorDesc::new("b", &[32, 3], GgmlType::Q8_0),
    ];
    let mut s = GgufStream::new(Vec::new(), "<test>", &kv, &descs, 32).unwrap();
    // Chunks of odd sizes, never across a tensor's end.
    for c in a.chunks(7).chain(b.chunks(50)) {
        s.write_data(c).unwrap();
    }
    assert_eq!(s.finish().unwrap(), whole);

    // Too much data for a tensor, and too little at the end, are errors naming it.
    let mut s = GgufStream::new(Vec::new(), "<test>", &kv, &descs, 32).unwrap();
    let err = s.write_data(&[0; 161]).unwrap_err().to_string();
    assert!(err.contains("'a'") && err.contains("161"), "{err}");
    s.write_data(&a).unwrap();
    s.write_data(&b[..10]).unwrap();
    let err = s.finish().unwrap_err().to_string();
    assert!(err.contains("'b'") && err.contains("92 bytes"), "{err}");
}

#[test]
fn the_synth_command_writes_a_loadable_file_and_refuses_bad_options() {
    let dir = std::env::temp_dir().join(format!("wgllm-synth-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_path = dir.join("tiny.gguf");
    let bench = env!("CARGO_BIN_EXE_wgllm-bench");
    let out = std::process::Command::new(bench)
        .args(["synth", "--size", "tiny", "--type", "q4_k_m", "-o"])
        .arg(&out_path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("100%"), "{stderr}");
    let file = GgufFile::open(&out_path).unwrap();
    assert_eq!(
        file.metadata().get_str("general.architecture").unwrap(),
        Some("llama")
    );
    std::fs::remove_file(&out_path).ok();

    for (args, needle) in [
        (["--size", "70b", "--type", "q4_0"], "--size 70b"),
        (["--size", "1b", "--type", "q3_k_s"], "--type q3_k_s"),
    ] {
        let out = std::process::Command::new(bench)
            .arg("synth")
            .args(args)
            .arg("-o")
            .arg(&out_path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(needle), "{stderr}");
        assert!(!out_path.exists(), "a refused command created {out_path:?}");
    }
}

/// `wgllm-bench model -m PATH ARGS`.
fn model_bench(path: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_wgllm-bench"));
    cmd.arg("model").arg("-m").arg(path).args(args);
    common::with_runtime_dir(&mut cmd);
    cmd.output().unwrap()
}

/// The rows of a `--json` model bench run that must have succeeded.
fn bench_rows(out: &std::process::Output) -> Vec<serde_json::Value> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    rows.as_array().cloned().unwrap_or_default()
}

/// `wgllm-bench model -d N` fills N positions first, then runs each test past them: the
/// context holds them all, and the tests are named as llama-bench names them.
#[test]
fn the_model_bench_runs_deep_into_a_context() {
    let spec = SynthSpec::new(LlamaShape::TINY, SynthQuant::Q4_0);
    let path = write(&spec, "bench-depth");
    let args = ["--ngl", "0", "-p", "5", "-n", "3", "-d", "300", "-r", "1"];
    let rows = bench_rows(&model_bench(&path, &[&args[..], &["--json"]].concat()));
    let names: Vec<&str> = rows.iter().filter_map(|r| r["test"].as_str()).collect();
    assert_eq!(names, ["pp5 @ d300", "tg3 @ d300"], "{rows:?}");
    for r in &rows {
        assert_eq!(r["n_depth"], 300, "{rows:?}");
        assert!(r["avg_ts"].as_f64().is_some_and(|t| t > 0.0), "{rows:?}");
    }
    std::fs::remove_file(&path).ok();
}

/// `wgllm-bench model --versus SETTING` times a second engine with one GPU setting
/// changed, its steps interleaved with the first's: both engines' tests are reported
/// (the second's marked with the setting), side by side with their ratio in the table;
/// a setting it does not know, or one with no GPU layers to change, is refused before
/// anything loads. It needs a GPU adapter (lavapipe here).
#[test]
fn the_model_bench_times_two_engines_side_by_side() {
    let spec = SynthSpec::new(LlamaShape::TINY, SynthQuant::Q4_0);
    let path = write(&spec, "bench-versus");
    let args = [
        "-p",
        "5",
        "-n",
        "3",
        "-r",
        "2",
        "--versus",
        "weights=buffer",
    ];
    let rows = bench_rows(&model_bench(&path, &[&args[..], &["--json"]].concat()));
    let seen: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|r| (r["test"].as_str().unwrap_or(""), r["versus"].as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("pp5", None),
            ("tg3", None),
            ("pp5", Some("weights=buffer")),
            ("tg3", Some("weights=buffer"))
        ],
        "{rows:?}"
    );
    for r in &rows {
        let samples = r["samples_ts"].as_array().map(|s| s.len());
        assert_eq!(samples, Some(2), "{rows:?}");
        assert!(r["avg_ts"].as_f64().is_some_and(|t| t > 0.0), "{rows:?}");
    }
    let out = model_bench(&path, &args);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains("| t/s with weights=buffer | ratio |"),
        "{table}"
    );
    let ratios = table.lines().filter(|l| l.ends_with("x |")).count();
    assert_eq!(ratios, 2, "{table}");

    for (args, needle) in [
        (&["--versus", "weights=disk"][..], "weights=disk"),
        (&["--versus", "mul-mat=fast"][..], "mul-mat=fast"),
        (&["--versus", "fp8"][..], "--versus fp8"),
        (&["--versus", "no-f16", "--ngl", "0"][..], "--ngl 0"),
    ] {
        let out = model_bench(&path, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn a_data_section_past_2_64_bytes_is_an_error() {
    use wgllm::gguf::{GgufStream, TensorDesc};
    // Each tensor's size fits 64 bits; their sum does not.
    let big = TensorDesc::new("big", &[1 << 20, 1 << 41], GgmlType::F32);
    let descs = [
        big.clone(),
        TensorDesc::new("next", &[1 << 20, 1 << 41], GgmlType::F32),
    ];
    let err = GgufStream::new(Vec::new(), "<test>", &[], &descs, 32)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("'next'") && err.contains("2^64"), "{err}");
}

/// The kernels of the first step named at load (`LoadOptions::first_batch`) compile
/// with the upload, so that step compiles nothing; those of other batch sizes compile
/// when a step first runs them, with the same logits.
#[test]
fn first_batch_kernels_compile_with_the_upload() {
    let spec = SynthSpec::new(LlamaShape::TINY, SynthQuant::Q4_0);
    let path = write(&spec, "first-batch");
    let file = GgufFile::open(&path).unwrap();
    let cfg = Config::from_metadata(file.metadata()).unwrap();
    let ids: Vec<u32> = (0..70).map(|i| 300 + i).collect();
    let mut runs = Vec::new();
    for first in [1, ids.len() as u32] {
        let ctx = Arc::new(
            GpuContext::new(&DeviceOptions::default())
                .expect("a GPU adapter (lavapipe) is needed: GPU tests fail rather than skip"),
        );
        let lo = LoadOptions {
            n_ctx: 128,
            n_batch: 128,
            first_batch: Some(first),
            ..Default::default()
        };
        let mut gpu = GpuModel::load(ctx.clone(), &file, cfg.clone(), &lo).unwrap();
        let loaded = ctx.pipelines.len();
        let n = ids.len() as u32;
        assert!(
            !gpu.compiles_for(1, 0),
            "single tokens compile after a load"
        );
        assert_eq!(
            gpu.compiles_for(n, 0),
            first == 1,
            "load for {first} tokens"
        );
        let logits = gpu.step(&ids, 0, Logits::Last).unwrap();
        assert!(!gpu.compiles_for(n, n), "a step's kernels compile again");
        runs.push((loaded, ctx.pipelines.len(), logits));
    }
    let (one, long) = (&runs[0], &runs[1]);
    assert_eq!(long.0, long.1, "the step named at load compiled kernels");
    assert!(
        one.1 > one.0,
        "a 70-token step compiled nothing after a load for 1"
    );
    assert!(one.0 < long.0, "a load for 1 token compiled batch kernels");
    assert_eq!(
        one.2, long.2,
        "the logits depend on when the kernels compiled"
    );
    std::fs::remove_file(&path).ok();
}

/// A GPU part keeps a copy of the token embedding only where it embeds tokens or runs
/// a tied output layer; from layer 0 with the host embedding (`hidden_in`, the split of
/// `--gpu-layers` equal to the layer count) it runs the same kernels on the host's
/// embedding as a model that embeds.
#[test]
fn a_gpu_part_holds_the_embedding_only_where_it_uses_it() {
    let ctx = Arc::new(GpuContext::new(&DeviceOptions::default()).expect("a GPU adapter"));
    let spec = SynthSpec::new(LlamaShape::TINY, SynthQuant::Q8_0);
    let path = write(&spec, "gpu-parts");
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = Config::from_metadata(file.metadata()).unwrap();
    let n = cfg.n_layer;
    let load = |layers: std::ops::Range<u32>, head: bool, hidden_in: bool| {
        let lo = LoadOptions {
            layers: Some(layers),
            head,
            hidden_in,
            n_ctx: 64,
            n_batch: 8,
            ..Default::default()
        };
        GpuModel::load(ctx.clone(), &file, cfg.clone(), &lo).unwrap()
    };
    // The synthetic model's output matrix is its own (not tied).
    let mut whole = load(0..n, true, false);
    assert!(whole.holds_embedding());
    assert!(!load(1..n, true, false).holds_embedding());
    assert!(!load(0..n, false, true).holds_embedding());
    let mut hidden_in = load(0..n, true, true);
    assert!(!hidden_in.holds_embedding());

    let ids = [300u32, 301, 302, 7, 500];
    let mut cpu = CpuModel::load_layers(file.clone(), cfg.clone(), 0..0, 64, 8, 0).unwrap();
    let embedded = cpu.step_to_hidden(&ids, 0).unwrap();
    let want = whole.step(&ids, 0, Logits::Last).unwrap();
    let got = hidden_in
        .step_io(Input::Hidden(&embedded), 0, Output::Logits(Logits::Last))
        .unwrap();
    let err = want
        .iter()
        .zip(&got)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(err < 1e-3, "largest logit difference {err}");
    // Token ids go to the model that embeds, hidden states to the one that does not.
    assert!(hidden_in.step(&ids, 0, Logits::Last).is_err());
    std::fs::remove_file(&path).ok();
}
