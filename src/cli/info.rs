//! `wgllm info`: a model's metadata and tensor table.

use std::path::PathBuf;

use clap::Args;
use wgllm::gguf::Value;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Path to a GGUF model file.
    pub model: PathBuf,
    /// Omit the tensor table.
    #[arg(long)]
    pub no_tensors: bool,
}

pub fn run(args: InfoArgs) -> wgllm::Result<()> {
    let file = super::common::open(&args.model)?;
    println!("file: {} (GGUF v{})", args.model.display(), file.version());
    println!(
        "tensor data at byte {}, alignment {}",
        file.data_offset(),
        file.alignment()
    );
    println!("metadata ({} keys):", file.metadata().len());
    for (k, v) in file.metadata().iter() {
        println!("  {k:<44} {}", short(v));
    }
    if let Ok(cfg) = wgllm::model::Config::from_metadata(file.metadata()) {
        println!("model: {cfg:?}");
    }
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    println!(
        "tensors: {} ({:.1} MiB)",
        file.tensors().len(),
        total as f64 / (1 << 20) as f64
    );
    if !args.no_tensors {
        for t in file.tensors() {
            println!(
                "  {:<36} {:<6} {:?} ({} bytes at {})",
                t.name,
                t.ty.name(),
                t.dims,
                t.n_bytes,
                t.offset
            );
        }
    }
    Ok(())
}

/// A value on one line: long strings and arrays shortened.
fn short(v: &Value) -> String {
    let s = v.to_string();
    let s = s.replace('\n', "\\n");
    if s.chars().count() > 100 {
        let head: String = s.chars().take(97).collect();
        format!("{head}...")
    } else {
        s
    }
}
