//! A model's weights on a CPU-hosted device (lavapipe) sit in huge pages, while the
//! memory a step touches after the load (caches, activations) does not grow them
//! (`wgllm::gpu::huge_pages`). One test in its own binary: the counts are the process's.
#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;

use wgllm::gguf::GgufFile;
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::model::config::Config;
use wgllm::model::gpu_backend::{GpuModel, LoadOptions, Logits};

/// KiB of the process's anonymous memory mapped as huge pages.
fn huge_kib() -> u64 {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("an AnonHugePages line")
}

#[test]
fn lavapipe_holds_the_weights_in_huge_pages() {
    if !common::lavapipe_here("lavapipe_holds_the_weights_in_huge_pages") {
        return;
    }
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[never]") {
        eprintln!("transparent huge pages are off on this machine: nothing to check");
        return;
    }
    let opts = DeviceOptions {
        device: Some("llvmpipe".into()),
        ..Default::default()
    };
    let ctx = GpuContext::new(&opts).expect("lavapipe, which the GPU tests need");
    assert_eq!(
        ctx.info.device_type,
        wgpu::DeviceType::Cpu,
        "{:?}",
        ctx.info
    );
    let file = GgufFile::open(common::model_path("SmolLM2-135M-Instruct.Q4_1.gguf"))
        .expect("open SmolLM2");
    let cfg = Config::from_metadata(file.metadata()).expect("config");
    let weights_kib: u64 = file.tensors().iter().map(|t| t.n_bytes).sum::<u64>() >> 10;
    let lo = LoadOptions {
        n_ctx: 4096,
        n_batch: 8,
        ..Default::default()
    };
    let before = huge_kib();
    let mut model = GpuModel::load(Arc::new(ctx), &file, cfg, &lo).expect("load");
    let loaded = huge_kib();
    // Most of the weights: each device memory block's last partial 2 MiB and the
    // pages touched before the advice (a block's header) stay small.
    assert!(
        loaded - before >= weights_kib / 2,
        "{} KiB of huge pages after loading {weights_kib} KiB of weights ({thp})",
        loaded - before
    );
    let logits = model.step(&[1, 2, 3, 4], 0, Logits::Last).expect("step");
    assert!(logits.iter().all(|v| v.is_finite()));
    // The caches of a 4096-token context, touched at four positions, stay small pages
    // (where the kernel gives huge pages only to regions that ask: with `always`, any
    // new allocation of the step may get them).
    let stepped = huge_kib();
    assert!(
        !thp.contains("[madvise]") || stepped <= loaded + 4096,
        "a step grew huge pages from {loaded} to {stepped} KiB"
    );
}
