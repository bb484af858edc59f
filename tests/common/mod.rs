//! Shared helpers of the GPU tests: one context per adapter the machine offers (made
//! once), random data, running recorded kernels, and error measures.
#![allow(dead_code)]

use std::sync::OnceLock;

use wgllm::gguf::TensorInfo;
use wgllm::gpu::context::enumerate;
use wgllm::gpu::readback::read_buffer;
use wgllm::gpu::upload::{storage_init, WeightMemory};
use wgllm::gpu::{DeviceOptions, GpuContext, GpuTensor};
use wgllm::ops::{Dispatch, StepInfo};
use wgllm::quant::{self, GgmlType};

/// Every adapter on this machine (Vulkan and GL on lavapipe/llvmpipe here). A machine
/// without any adapter fails the GPU tests: they must not silently skip.
pub fn contexts() -> &'static [GpuContext] {
    static CTX: OnceLock<Vec<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| contexts_with(&DeviceOptions::default()))
}

/// One context per adapter, as [`contexts`], holding every weight matrix in textures.
pub fn texture_contexts() -> &'static [GpuContext] {
    memory_contexts(WeightMemory::Texture)
}

/// Every adapter with its weight matrices in storage buffers, whatever its default
/// (CPU-hosted Vulkan drivers hold them in textures by default).
pub fn buffer_contexts() -> &'static [GpuContext] {
    memory_contexts(WeightMemory::Buffer)
}

/// Every adapter with its reductions forced through workgroup memory
/// (`DeviceOptions::workgroup_reductions`): the GPUs' paths of the reducing kernels, run
/// on a CPU-hosted driver too.
#[allow(dead_code)]
pub fn tree_contexts() -> &'static [GpuContext] {
    static CTX: OnceLock<Vec<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| {
        contexts_with(&DeviceOptions {
            workgroup_reductions: true,
            ..Default::default()
        })
    })
}

/// Every adapter with every weight matrix held in `memory`, made once per memory.
fn memory_contexts(memory: WeightMemory) -> &'static [GpuContext] {
    static CTX: [OnceLock<Vec<GpuContext>>; 2] = [OnceLock::new(), OnceLock::new()];
    CTX[memory as usize].get_or_init(|| {
        contexts_with(&DeviceOptions {
            weights: Some(memory),
            ..Default::default()
        })
    })
}

/// Whether lavapipe (Vulkan on the CPU: 8-lane subgroups, f16, chains, huge pages) is
/// here for the tests written for it, or for a path only adapters with subgroups run.
/// Where it is missing the test fails, as every GPU test does without its adapter;
/// except where `WGPU_BACKEND` names backends that leave Vulkan out (a run on GL alone,
/// to test its fallbacks): then `test` says so and gets false, and has nothing to run.
pub fn lavapipe_here(test: &str) -> bool {
    let found = enumerate().iter().any(|a| {
        let info = a.get_info();
        info.device_type == wgpu::DeviceType::Cpu && info.backend == wgpu::Backend::Vulkan
    });
    if found {
        return true;
    }
    match std::env::var("WGPU_BACKEND") {
        Ok(b) if !b.to_ascii_lowercase().contains("vulkan") => {
            eprintln!("{test}: WGPU_BACKEND={b} leaves out lavapipe, which this test runs on");
            false
        }
        _ => panic!(
            "{test}: lavapipe not found: install mesa-vulkan-drivers — GPU tests fail rather than skip"
        ),
    }
}

fn contexts_with(opts: &DeviceOptions) -> Vec<GpuContext> {
    {
        let adapters = enumerate();
        assert!(
            !adapters.is_empty(),
            "no GPU adapter found: install mesa-vulkan-drivers (lavapipe) — GPU tests fail rather than skip"
        );
        adapters
            .into_iter()
            .filter_map(|a| {
                let name = a.get_info().name;
                match GpuContext::from_adapter(a, opts) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        eprintln!("skipping adapter {name}: {e}");
                        None
                    }
                }
            })
            .collect()
    }
}

/// Deterministic pseudo-random floats in [-scale, scale).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

/// Normalised mean squared error of `got` against `want`.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut num = 0f64;
    let mut den = 0f64;
    for (g, w) in got.iter().zip(want) {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        num += (*g as f64 - *w as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    num / den.max(1e-30)
}

/// Value written into guard regions; a kernel writing out of bounds changes it.
pub const GUARD: f32 = 1234.5;

/// Packed words (f16 caches) seen as f32s, to upload through [`buffer_with_guard`].
pub fn words(w: &[u32]) -> Vec<f32> {
    w.iter().map(|&x| f32::from_bits(x)).collect()
}

/// A storage buffer holding `data` followed by `guard` guard values.
pub fn buffer_with_guard(ctx: &GpuContext, data: &[f32], guard: usize) -> wgpu::Buffer {
    let mut v = data.to_vec();
    v.extend(std::iter::repeat_n(GUARD, guard));
    storage_init(ctx, "test", &v)
}

/// Read `n` values and check the `guard` values after them are intact.
pub fn read_checked(ctx: &GpuContext, b: &wgpu::Buffer, n: usize, guard: usize) -> Vec<f32> {
    let mut v: Vec<f32> = read_buffer(ctx, b, n + guard).expect("readback");
    let tail = v.split_off(n);
    assert!(
        tail.iter().all(|g| *g == GUARD),
        "kernel wrote past its output on {}",
        ctx.info.name
    );
    v
}

pub fn step_buffer(ctx: &GpuContext, s: &StepInfo) -> wgpu::Buffer {
    wgllm::ops::uniform_for_tests(ctx, s)
}

/// Run `dispatches` for `step` and wait.
pub fn run(ctx: &GpuContext, dispatches: &[Dispatch], step: &StepInfo) {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    wgllm::ops::record_plan(&mut enc, dispatches, step).expect("record");
    ctx.queue.submit([enc.finish()]);
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
}

pub fn label(ctx: &GpuContext) -> String {
    let tex = match ctx.matrix_memory(wgllm::quant::GgmlType::Q4_0) {
        WeightMemory::Texture => ", weights in textures",
        WeightMemory::Buffer => "",
    };
    format!("{} ({:?}{tex})", ctx.info.name, ctx.info.backend)
}

/// The CPU reference of a product of W (`n_rows` rows of `n_cols` elements of `ty`) with
/// `n_tokens` tokens of `x`: every token's rows, or for `Columns::Last` the last one's.
/// `q8`: the product quantizes its activations in steps of several tokens
/// (`mul_mat::quantizes_batches`), so a batch's reference is `mul_mat::reference_q8`.
pub fn mul_mat_want(
    ty: wgllm::quant::GgmlType,
    w: &[u8],
    (n_rows, n_cols): (usize, usize),
    x: &[f32],
    n_tokens: usize,
    cols: wgllm::ops::mul_mat::Columns,
    q8: bool,
) -> Vec<f32> {
    use wgllm::ops::mul_mat;
    let mut want = vec![0f32; n_rows * n_tokens];
    let reference = if q8 && n_tokens > 1 && cols == mul_mat::Columns::All {
        mul_mat::reference_q8
    } else {
        mul_mat::reference
    };
    reference(ty, w, n_rows, n_cols, x, n_tokens, &mut want).expect("reference");
    if cols == mul_mat::Columns::Last {
        want.drain(..(n_tokens - 1) * n_rows);
    }
    want
}

/// A real model under `models/`, which must be there (`tools/fetch-models` puts it
/// there).
pub fn model_path(file: &str) -> std::path::PathBuf {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(file);
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-models",
        p.display()
    );
    p
}

/// Gives a child process a runtime folder where the environment has none: the Vulkan
/// loader's Wayland probe prints its own "error:" lines when XDG_RUNTIME_DIR is unset.
/// `wgllm-bench` run with `args` (on the default adapter).
pub fn bench(args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_wgllm-bench"));
    cmd.args(args);
    with_runtime_dir(&mut cmd);
    cmd.output().unwrap()
}

/// The JSON report of `wgllm-bench` run with `args` (which ask for one), which must
/// succeed.
pub fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = bench(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn with_runtime_dir(cmd: &mut std::process::Command) {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("wgllm-xdg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        cmd.env("XDG_RUNTIME_DIR", dir);
    }
}

/// A random `n_rows` x `n_cols` matrix quantized to `ty`.
pub fn weight(ty: GgmlType, n_rows: usize, n_cols: usize, seed: u64) -> Vec<u8> {
    let x = Rng::new(seed).vec(n_rows * n_cols, 1.0);
    let mut out = Vec::new();
    quant::quantize(ty, &x, &mut out).expect("quantize");
    out
}

/// Matrices `ws` of `rows[i]` rows each, uploaded one after another as one
/// (`GpuTensor::upload_fused`, as Q/K/V and gate/up are).
pub fn upload_fused(
    ctx: &GpuContext,
    ty: GgmlType,
    rows: &[usize],
    n_cols: usize,
    ws: &[Vec<u8>],
) -> GpuTensor {
    let infos: Vec<TensorInfo> = (0..rows.len())
        .map(|i| TensorInfo {
            name: format!("w{i}"),
            dims: vec![n_cols as u64, rows[i] as u64],
            ty,
            offset: 0,
            n_bytes: ws[i].len() as u64,
        })
        .collect();
    let parts: Vec<(&TensorInfo, &[u8])> = infos.iter().zip(ws).map(|(i, w)| (i, &w[..])).collect();
    GpuTensor::upload_fused(ctx, "fused", &parts, &mut |_| {}).expect("upload")
}
