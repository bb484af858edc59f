//! wgllm-bench: kernel and model benchmarks, read-bandwidth probes and synthetic models.
//!
//!   wgllm-bench kernels [--op mul_mat] [--type q4_0] [--shape 4096x4096] [--variant v] [--json]
//!   wgllm-bench model -m MODEL [-p 512] [-n 128] [-r 5] [-ngl N] [-b N] [--versus SETTING] [--json]
//!   wgllm-bench peak [--all]
//!   wgllm-bench synth --arch llama --size 1b --type q4_0 [--pure] [--layers N] -o FILE
//!   wgllm-bench upload [--mib 64]
//!   wgllm-bench sync [--phases 150] [--items 16] [--workgroups 2,16]

mod kernels;
mod model;
mod peak;
mod report;
mod sync;
mod synth;
mod timing;
mod upload;

use clap::{Parser, Subcommand};

use wgllm::gpu::{DeviceOptions, GpuContext};

#[derive(Parser)]
#[command(name = "wgllm-bench", about = "wgllm kernel and model benchmarks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Read bandwidth of several access patterns (the peak the kernels are compared with).
    Peak(PeakArgs),
    /// Kernel variants over real model shapes: checked, then timed.
    Kernels(report::KernelArgs),
    /// Whole-model pp / tg throughput (llama-bench style).
    Model(model::ModelArgs),
    /// Write a llama GGUF with random weights in a real size class (1b, 8b).
    Synth(synth::SynthArgs),
    /// Weight upload bandwidth against the device's write bandwidth.
    Upload(upload::UploadArgs),
    /// A chain of dependent steps as dispatches against phases of one dispatch.
    Sync(sync::SyncArgs),
}

#[derive(clap::Args)]
struct PeakArgs {
    /// Adapter index or name substring.
    #[arg(long)]
    device: Option<String>,
    /// Every probe, not just those the peak is taken over.
    #[arg(long)]
    all: bool,
    /// MiB read per probe.
    #[arg(long, default_value_t = 64)]
    mib: u64,
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Time with the host clock even when the device has timestamp queries.
    #[arg(long)]
    host_clock: bool,
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Peak(a) => run_peak(&a),
        Cmd::Kernels(a) => report::run_kernels(&a),
        Cmd::Model(a) => model::run(&a),
        Cmd::Synth(a) => synth::run(&a),
        Cmd::Upload(a) => upload::run(&a),
        Cmd::Sync(a) => sync::run(&a),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

pub(crate) fn context(device: &Option<String>) -> wgllm::Result<GpuContext> {
    GpuContext::new(&DeviceOptions {
        device: device.clone(),
        ..Default::default()
    })
}

fn run_peak(a: &PeakArgs) -> wgllm::Result<()> {
    let ctx = context(&a.device)?;
    let timer = timing::Timer::new(&ctx, !a.host_clock);
    println!("device: {}", ctx.describe());
    let pats = if a.all {
        peak::all_patterns()
    } else {
        peak::peak_patterns()
    };
    println!("| pattern | MiB | median ms | spread | GB/s |");
    println!("|---|---:|---:|---:|---:|");
    for r in peak::measure(&ctx, &timer, a.mib << 20, &pats, a.reps)? {
        println!(
            "| {} | {:.1} | {:.3} | {:.0}% | {:.2} |",
            r.pattern.name(),
            r.bytes as f64 / (1 << 20) as f64,
            r.samples.median() * 1e3,
            r.samples.spread() * 100.0,
            r.gbps()
        );
    }
    Ok(())
}
