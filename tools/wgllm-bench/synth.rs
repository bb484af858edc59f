//! `wgllm-bench synth`: writes a llama GGUF with random weights in a real model's
//! shape (1B, 8B) and quantization, for benchmarks without downloading a checkpoint.

use std::path::PathBuf;
use std::time::Instant;

use wgllm::gguf::synth::{LlamaShape, SynthQuant, SynthSpec};
use wgllm::{Error, Result};

#[derive(clap::Args)]
pub struct SynthArgs {
    /// Architecture (only llama).
    #[arg(long, default_value = "llama")]
    arch: String,
    /// Size class: tiny, 1b, 8b.
    #[arg(long, default_value = "1b")]
    size: String,
    /// Weight types: q4_0, q8_0, q4_k_m, f16, f32.
    #[arg(long = "type", default_value = "q4_k_m")]
    ty: String,
    /// One type for every matrix (no Q6_K output or layers), like llama-quantize --pure.
    #[arg(long)]
    pure: bool,
    /// Override the number of layers (a quicker file of the same width).
    #[arg(long)]
    layers: Option<u64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output file.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

pub fn run(a: &SynthArgs) -> Result<()> {
    if a.arch != "llama" {
        return Err(Error::invalid(format!(
            "--arch {}: only llama is generated",
            a.arch
        )));
    }
    let mut shape = LlamaShape::by_name(&a.size)
        .ok_or_else(|| Error::invalid(format!("--size {}: expected tiny, 1b or 8b", a.size)))?;
    if let Some(n) = a.layers {
        shape.n_layer = n;
    }
    let quant = SynthQuant::by_name(&a.ty).ok_or_else(|| {
        Error::invalid(format!(
            "--type {}: expected one of q4_0, q8_0, q4_k_m, f16, f32",
            a.ty
        ))
    })?;
    let spec = SynthSpec {
        pure: a.pure,
        seed: a.seed,
        ..SynthSpec::new(shape, quant)
    };
    spec.validate()?;
    let total = spec.data_bytes()?;
    eprintln!(
        "writing {}: llama {} layers, n_embd {}, {:.1}M parameters, {}{}, {:.2} GiB of weights",
        a.output.display(),
        shape.n_layer,
        shape.n_embd,
        shape.n_params() as f64 / 1e6,
        quant.name(),
        if a.pure { " (pure)" } else { "" },
        total as f64 / (1u64 << 30) as f64
    );
    let t0 = Instant::now();
    let mut last_tenth = None;
    spec.write(&a.output, |done, total| {
        // A line per tenth: readable in logs, where a progress bar is not.
        let tenth = done * 10 / total.max(1);
        if last_tenth != Some(tenth) {
            last_tenth = Some(tenth);
            eprintln!("  {:3}%  {:.1} s", tenth * 10, t0.elapsed().as_secs_f64());
        }
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let size = std::fs::metadata(&a.output)
        .map(|m| m.len())
        .map_err(|source| Error::Io {
            path: a.output.clone(),
            source,
        })?;
    println!(
        "{}: {} bytes ({:.2} GiB) in {:.1} s ({:.0} MiB/s)",
        a.output.display(),
        size,
        size as f64 / (1u64 << 30) as f64,
        secs,
        size as f64 / (1u64 << 20) as f64 / secs.max(1e-9)
    );
    Ok(())
}
