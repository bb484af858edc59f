//! A CPU-hosted driver's worker threads pinned one per core (`gpu::pin`): after a
//! model's first single-token steps with chains on lavapipe, as many threads as llvmpipe has workers are each
//! kept on one core, on distinct cores, and they are the threads that do the steps'
//! work.
//!
//! Uses SmolLM2 in `models/` and the first adapter (lavapipe here). One test in this
//! file: no other test's threads run beside it.

#![cfg(target_os = "linux")]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use wgllm::gguf::GgufFile;
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::model::gpu_backend::{GpuModel, LoadOptions, Logits};
use wgllm::model::Config;

/// Run time so far of each thread of this process, in nanoseconds.
fn run_times() -> HashMap<i32, u64> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| {
            let tid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
            Some((tid, stat.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

/// The cores thread `tid` may run on (`Cpus_allowed_list` in its status).
fn allowed(tid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap();
    line.split(':').nth(1).unwrap().trim().to_string()
}

#[test]
fn lavapipe_workers_are_pinned_one_per_core() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let file = GgufFile::open(path).unwrap();
    let cfg = Config::from_metadata(file.metadata()).unwrap();
    let ctx = Arc::new(GpuContext::new(&DeviceOptions::default()).unwrap());
    assert_eq!(
        ctx.info.device_type,
        wgpu::DeviceType::Cpu,
        "expects lavapipe"
    );
    let lo = LoadOptions {
        n_ctx: 128,
        n_batch: 16,
        ..Default::default()
    };
    let mut m = GpuModel::load(ctx, &file, cfg, &lo).unwrap();
    // A prompt, a token (whose step starts the chains' compilation), the chains, then
    // single tokens until the model has looked for the workers.
    m.step(&[1, 2, 3, 4], 0, Logits::Last).unwrap();
    m.step(&[5], 4, Logits::Last).unwrap();
    assert!(
        m.pinned_workers().is_empty(),
        "pinned before the chains ran"
    );
    m.wait_for_chains().unwrap();
    for pos in 5..12 {
        m.step(&[6], pos, Logits::Last).unwrap();
    }
    let workers = std::env::var("LP_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pins = m.pinned_workers().to_vec();
    if workers < 2 {
        assert!(pins.is_empty(), "one worker pinned: {pins:?}");
        return;
    }
    assert_eq!(pins.len(), workers, "pinned {pins:?}");
    let n_cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut cores: Vec<usize> = pins.iter().map(|&(_, c)| c).collect();
    cores.sort_unstable();
    cores.dedup();
    assert_eq!(cores.len(), workers.min(n_cores), "cores shared: {pins:?}");
    for &(tid, core) in &pins {
        assert_eq!(allowed(tid), core.to_string(), "thread {tid}'s cores");
    }
    // The pinned threads are the ones that do the next steps' work.
    let before = run_times();
    for pos in 12..20 {
        m.step(&[5], pos, Logits::Last).unwrap();
    }
    let after = run_times();
    let mut ran: Vec<(u64, i32)> = after
        .iter()
        .map(|(&t, &ns)| (ns.saturating_sub(*before.get(&t).unwrap_or(&0)), t))
        .collect();
    ran.sort_unstable_by(|a, b| b.cmp(a));
    // SAFETY: gettid takes no arguments and cannot fail.
    let me = unsafe { libc::gettid() };
    let busiest: Vec<i32> = ran
        .iter()
        .map(|&(_, t)| t)
        .filter(|&t| t != me)
        .take(workers)
        .collect();
    for &(tid, _) in &pins {
        assert!(
            busiest.contains(&tid),
            "pinned {tid} is not among the busiest {ran:?}"
        );
    }
}
