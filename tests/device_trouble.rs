//! A GPU that is absent, small or out of memory: every case ends in a clear error (or,
//! for a small binding limit, in the same results; for an absent GPU that nobody asked
//! for, in a run on the CPU), never in a panic or an abort.
//!
//! Uses the real SmolLM2 model in `models/` and the first adapter (lavapipe here).

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;

use wgllm::gguf::GgufFile;
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::model::gpu_backend::{GpuModel, Input, LoadOptions, Logits};
use wgllm::model::Config;
use wgllm::tokenizer::Tokenizer;

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// `wgllm` with `args` and extra environment, with a runtime folder
/// (`common::with_runtime_dir`), so that the only error lines are the program's.
fn wgllm(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgllm"));
    cmd.args(args);
    common::with_runtime_dir(&mut cmd);
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

/// Non-zero exit, no panic, and exactly one `error:` line, which is returned.
fn one_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit 0; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "want one error line: {stderr}");
    errors[0].to_string()
}

fn load(opts: &DeviceOptions, n_ctx: u32) -> wgllm::Result<(GpuModel, Tokenizer)> {
    let file = GgufFile::open(model_path())?;
    let cfg = Config::from_metadata(file.metadata())?;
    let tok = Tokenizer::from_gguf(file.metadata())?;
    let ctx = Arc::new(GpuContext::new(opts)?);
    let lo = LoadOptions {
        n_ctx,
        n_batch: 8,
        ..Default::default()
    };
    Ok((GpuModel::load(ctx, &file, cfg, &lo)?, tok))
}

#[test]
fn no_adapter_runs_on_the_cpu_unless_a_gpu_is_asked_for() {
    // DirectX 12 does not exist on Linux: the instance finds no adapter at all.
    if !cfg!(target_os = "linux") {
        return;
    }
    let m = model_path();
    let m = m.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", m, "-p", "hi", "-n", "1", "--quiet"];
        args.extend(extra);
        wgllm(&args, &[("WGPU_BACKEND", "dx12")])
    };
    // With no placement asked for, the model runs on the CPU and says so.
    let out = run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("device: CPU (no hardware GPU found"),
        "{stderr}"
    );
    assert!(stderr.contains("--device"), "{stderr}");
    // GPU layers asked for: an error that names the backend list that found nothing,
    // and how to do without.
    let err = one_error(&run(&["--gpu-layers", "5"]));
    assert!(err.contains("no GPU adapter found"), "{err}");
    assert!(err.contains("WGPU_BACKEND=\"dx12\""), "{err}");
    assert!(err.contains("Vulkan driver"), "{err}");
    assert!(err.contains("--gpu-layers 0"), "{err}");
    let err = one_error(&run(&["--device", "0"]));
    assert!(err.contains("no GPU adapter found"), "{err}");
    // A name wgpu does not know selects no backend: the same error, naming it.
    let out = wgllm(
        &["run", "-m", m, "-p", "hi", "-n", "1", "--device", "0"],
        &[("WGPU_BACKEND", "vulcan")],
    );
    let err = one_error(&out);
    assert!(err.contains("WGPU_BACKEND=\"vulcan\""), "{err}");
    assert!(run(&["--gpu-layers", "0"]).status.success());
    let out = wgllm(&["devices"], &[("WGPU_BACKEND", "dx12")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("no GPU adapters found"), "{stdout}");
}

#[test]
fn software_adapters_run_only_when_named() {
    let adapters = wgllm::gpu::context::list_adapters();
    let Some(first) = adapters.first() else {
        panic!("no GPU adapter: install lavapipe (mesa-vulkan-drivers)");
    };
    let m = model_path();
    let m = m.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", m, "-p", "hi", "-n", "1", "--quiet"];
        args.extend(extra);
        let out = wgllm(&args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{args:?}: {stderr}");
        stderr
    };
    let default = run(&[]);
    if first.info.device_type == wgpu::DeviceType::Cpu {
        // lavapipe / llvmpipe only: the CPU backend is the faster of the two.
        assert!(
            default.contains("device: CPU (no hardware GPU found"),
            "{default}"
        );
    } else {
        assert!(default.contains("on GPU ["), "{default}");
    }
    // Named, or given layers, the first adapter runs the model, and the device line
    // names it.
    let named = run(&["--device", "0"]);
    let want = format!("30/30 layers + output on GPU [{}", first.info.name);
    assert!(named.contains(&want), "{named}");
    assert!(run(&["--gpu-layers", "99"]).contains(&want));
    let split = run(&["--gpu-layers", "10"]);
    assert!(split.contains("10/30 layers on GPU ["), "{split}");
}

#[test]
fn each_listed_index_runs_that_adapter() {
    // `--device N` resolves against the list `wgllm devices` prints, which gives the
    // primary backends' adapters (Vulkan, Metal, DX12) before GL's: an index among the
    // first never starts GL, and one past them must still find GL's.
    let adapters = wgllm::gpu::context::list_adapters();
    assert!(!adapters.is_empty(), "no GPU adapter: install lavapipe");
    let gl = adapters
        .iter()
        .position(|a| a.info.backend == wgpu::Backend::Gl);
    if let Some(first_gl) = gl {
        assert!(
            adapters[first_gl..]
                .iter()
                .all(|a| a.info.backend == wgpu::Backend::Gl),
            "GL adapters listed among the others"
        );
    }
    let m = model_path();
    let m = m.to_str().unwrap();
    for (i, a) in adapters.iter().enumerate() {
        let index = i.to_string();
        let args = [
            "run", "-m", m, "-p", "hi", "-n", "1", "--quiet", "--device", &index,
        ];
        let out = wgllm(&args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        let want = format!("[{} ({:?})]", a.info.name, a.info.backend);
        assert!(stderr.contains(&want), "--device {i}: {stderr}, not {want}");
    }
}

#[test]
fn unknown_device_lists_the_adapters() {
    let m = model_path();
    let m = m.to_str().unwrap();
    let out = wgllm(
        &[
            "run",
            "-m",
            m,
            "-p",
            "hi",
            "--device",
            "no-such-gpu",
            "--quiet",
        ],
        &[],
    );
    let err = one_error(&out);
    let names: Vec<String> = wgllm::gpu::context::list_adapters()
        .into_iter()
        .map(|a| a.info.name)
        .collect();
    assert!(!names.is_empty());
    assert!(err.contains("no-such-gpu"), "{err}");
    for n in &names {
        assert!(err.contains(n.as_str()), "{err} does not list {n}");
    }
    let out = wgllm(
        &["run", "-m", m, "-p", "hi", "--device", "99", "--quiet"],
        &[],
    );
    let err = one_error(&out);
    assert!(
        err.contains("--device 99") && err.contains(&names[0]),
        "{err}"
    );
}

#[test]
fn split_weights_give_the_same_logits() {
    // A 256 KiB binding cap splits every matrix of SmolLM2 (the embedding into ~80
    // parts); the split kernels must compute exactly what the whole tensors do.
    let (mut whole, tok) = load(&DeviceOptions::default(), 16).unwrap();
    let small = DeviceOptions {
        max_binding: Some(256 << 10),
        ..Default::default()
    };
    let (mut split, _) = load(&small, 16).unwrap();
    let split_parts = split.ctx.max_binding();
    assert_eq!(split_parts, 256 << 10);
    let ids = tok
        .encode("The capital of France is", false, false)
        .unwrap();
    let a = whole.step(&ids, 0, Logits::Last).unwrap();
    let b = split.step(&ids, 0, Logits::Last).unwrap();
    assert_close_logits(&a, &b, "split", 1e-4);
}

/// `a` and `b` within `rel` of the largest logit, with the same greedy token.
fn assert_close_logits(a: &[f32], b: &[f32], what: &str, rel: f32) {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        diff <= rel * scale,
        "{what} logits differ by {diff} (max |logit| {scale})"
    );
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i)
    };
    assert_eq!(argmax(a), argmax(b), "{what} logits: greedy tokens differ");
}

/// Top-k sampling's passes bind four storage buffers at most, so a device with GLES
/// 3.1's four and wgpu's default limits runs them, and picks the host's candidates.
#[test]
fn few_storage_buffers_choose_top_k_on_the_device() {
    let small = DeviceOptions {
        max_storage_buffers: Some(4),
        default_limits: true,
        top_k_on_device: Some(true),
        ..Default::default()
    };
    let (mut m, tok) = load(&small, 16).unwrap();
    let ids = tok
        .encode("The capital of France is", false, false)
        .unwrap();
    let logits = m.step(&ids, 0, Logits::Last).unwrap();
    let listed = [ids[1], 7];
    let got = m
        .step_top_k_io(Input::Tokens(&ids), 0, 40, &listed)
        .unwrap();
    let mut best = got.clone();
    wgllm::sampling::keep_best(&mut best, 42);
    assert_eq!(best, wgllm::sampling::top_k(&logits, 42));
    let want = wgllm::sampling::candidates(&logits, 40, &listed);
    for c in want.iter().filter(|c| listed.contains(&c.0)) {
        assert!(got.contains(c), "{c:?}");
    }
}

#[test]
fn few_storage_buffers_run_the_products_apart() {
    if !common::lavapipe_here("few_storage_buffers_run_the_products_apart") {
        return;
    }
    // GLES 3.1 guarantees 4 storage buffers per stage: too few for the outputs of fused
    // products, so Q/K/V and gate/up run one by one, with the same logits.
    let (mut fused, tok) = load(&DeviceOptions::default(), 16).unwrap();
    let few = DeviceOptions {
        max_storage_buffers: Some(4),
        ..Default::default()
    };
    let (mut apart, _) = load(&few, 16).unwrap();
    assert!(fused.ctx.fused_outputs() && !apart.ctx.fused_outputs());
    // 30 layers: two dispatches more for Q/K/V and one for gate/up per layer. Two
    // kernels bind five storage buffers and are replaced there: RoPE with the cache
    // store (one dispatch more per layer: `rope` and `kv_store`) and the single-token
    // attention (two more: scores, softmax and the weighted sum apart). And the 60 norms
    // before Q/K/V and gate/up run there: the products fold them in only where they
    // bind fused outputs (the output head, of over 16384 rows, keeps its norm in both).
    // And the 30 activations after gate/up, which a fused product of a single token
    // stores itself, and the 30 RoPEs with the cache append, which a fused Q/K/V
    // product of a single token runs at its end.
    assert_eq!(
        apart.dispatches_per_step(),
        fused.dispatches_per_step() + 90 + 30 + 60 + 60 + 30 + 30
    );
    let ids = tok
        .encode("The capital of France is", false, false)
        .unwrap();
    // The norms folded into the products, which sum the squares in another order, and
    // the products' own sums in another order (the folded kernels walk a token's row
    // in contiguous runs per lane, the tiles of eight in a stride): the same logits up
    // to that rounding, carried through 30 layers (measured: 1.1e-4 and 2.0e-4 of the
    // largest logit).
    let a = fused.step(&ids, 0, Logits::Last).unwrap();
    let b = apart.step(&ids, 0, Logits::Last).unwrap();
    assert_close_logits(&a, &b, "batch", 5e-4);
    // A single-token step: one attention dispatch per layer against three as well.
    let next = [ids[0]];
    let a = fused.step(&next, ids.len() as u32, Logits::Last).unwrap();
    let b = apart.step(&next, ids.len() as u32, Logits::Last).unwrap();
    assert_close_logits(&a, &b, "single-token", 5e-4);
}

#[test]
fn limits_too_small_for_a_row_are_an_error() {
    // wgpu's default limits still hold SmolLM2; a binding cap below one row of its
    // embedding (360 bytes of Q4_1) cannot, and must say so.
    let defaults = DeviceOptions {
        default_limits: true,
        ..Default::default()
    };
    let (mut m, tok) = load(&defaults, 8).unwrap();
    assert!(m.ctx.limits.max_storage_buffer_binding_size <= 128 << 20);
    let ids = tok.encode("Hi", false, false).unwrap();
    m.step(&ids, 0, Logits::Last).unwrap();
    let tiny = DeviceOptions {
        default_limits: true,
        max_binding: Some(1),
        ..Default::default()
    };
    let err = load(&tiny, 8)
        .err()
        .expect("a 256-byte binding cannot hold a row");
    let msg = err.to_string();
    assert!(msg.contains("binding limit"), "{msg}");
    assert!(msg.contains("token_embd.weight"), "{msg}");
}

#[test]
fn an_absurd_context_is_a_clear_error() {
    // 10^8 positions: the KV cache alone is 77 GB per layer.
    let m = model_path();
    let out = wgllm(
        &[
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "hi",
            "-c",
            "100000000",
            "-n",
            "1",
            "--quiet",
        ],
        &[],
    );
    let err = one_error(&out);
    // Either the GPU refuses the buffer or, after offloading to the CPU, the CPU cache
    // allocation does: both say what to change.
    assert!(err.contains("GPU") || err.contains("KV cache"), "{err}");
    assert!(err.contains("lower -c"), "{err}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("larger than the model's trained context"),
        "{stderr}"
    );
}

#[test]
fn validation_errors_are_caught_by_error_scopes() {
    let ctx = GpuContext::new(&DeviceOptions::default()).unwrap();
    // A buffer mapped at creation must be a whole number of words: a validation error,
    // not an abort.
    let r = ctx.scoped("an unaligned mapped buffer", || {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bad size"),
            size: 6,
            usage: wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        })
    });
    let msg = r
        .expect_err("an invalid buffer must be reported")
        .to_string();
    assert!(msg.contains("an unaligned mapped buffer"), "{msg}");
    // A buffer past the device's size limit.
    let r = ctx.scoped("a huge buffer", || {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("huge"),
            size: ctx.limits.max_buffer_size + 4,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    });
    assert!(r.is_err());
    // The device is still usable afterwards.
    let ok = wgllm::gpu::upload::storage(&ctx, "after", 1024);
    assert!(ok.is_ok());
    assert!(!ctx.is_lost());
    let err = wgllm::gpu::upload::storage(&ctx, "too big", ctx.limits.max_buffer_size + 4)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("too big") && err.contains("limit"), "{err}");
}

/// The error of a step that must fail, or a test failure naming how it did not.
fn step_error(m: &mut GpuModel, ids: &[u32], pos: u32, what: &str) -> String {
    match catch_unwind(AssertUnwindSafe(|| m.step(ids, pos, Logits::Last))) {
        Err(_) => panic!("{what}: panicked instead of returning an error"),
        Ok(Ok(_)) => panic!("{what}: ran on a destroyed device"),
        Ok(Err(e)) => e.to_string(),
    }
}

#[test]
fn a_lost_device_is_an_error_that_says_what_to_do() {
    // A context of its own: destroying the device ends it for everyone holding it.
    let (mut m, tok) = load(&DeviceOptions::default(), 16).unwrap();
    let ids = tok.encode("Hi there", false, false).unwrap();
    m.step(&ids, 0, Logits::Last).unwrap();
    assert!(!m.ctx.is_lost());

    // What a driver reset or an unplugged GPU does, mid-session.
    m.ctx.device.destroy();
    let pos = ids.len() as u32;
    let err = step_error(&mut m, &ids[..1], pos, "a step after the device was lost");
    assert!(m.ctx.is_lost(), "the lost flag is not set");
    assert!(err.contains("GPU device was lost"), "{err}");
    assert!(err.contains("--gpu-layers 0"), "{err}");
    assert!(!err.contains('\n'), "not one line: {err}");
    // It stays an error (no panic on a second try), and a new model on the lost
    // device is refused the same way.
    let again = step_error(&mut m, &ids[..1], pos, "a second step");
    assert!(again.contains("--gpu-layers 0"), "{again}");
    let file = GgufFile::open(model_path()).unwrap();
    let cfg = Config::from_metadata(file.metadata()).unwrap();
    let lo = LoadOptions {
        n_ctx: 16,
        n_batch: 8,
        ..Default::default()
    };
    let loaded = catch_unwind(AssertUnwindSafe(|| {
        GpuModel::load(m.ctx.clone(), &file, cfg, &lo).map(drop)
    }));
    match loaded {
        Err(_) => panic!("loading on a lost device panicked"),
        Ok(Ok(())) => panic!("loading on a lost device succeeded"),
        Ok(Err(e)) => {
            let e = e.to_string();
            assert!(e.contains("--gpu-layers 0"), "{e}");
        }
    }
}
