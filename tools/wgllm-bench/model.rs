//! `wgllm-bench model`: prompt processing (pp) and generation (tg) throughput of a
//! whole model, printed as a llama-bench style table.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use wgllm::engine::{load_engine, EngineOptions};
use wgllm::gguf::GgufFile;
use wgllm::gpu::DeviceOptions;
use wgllm::model::gpu_backend::Logits;
use wgllm::model::Config;
use wgllm::{Error, Result};

#[derive(clap::Args)]
pub struct ModelArgs {
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// Prompt tokens of the pp test (0: skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: u32,
    /// Generated tokens of the tg test (0: skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: u32,
    /// Positions already in the context when each test starts (filled once, untimed),
    /// as llama-bench's `-d`: generation and prompts deep into a long context.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    depth: u32,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Layers on the GPU (0: CPU only; default: all).
    #[arg(long = "ngl", visible_alias = "gpu-layers")]
    ngl: Option<u32>,
    /// Batch size for prompt processing.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch: u32,
    #[arg(long)]
    device: Option<String>,
    #[arg(long)]
    json: bool,
}

struct TestResult {
    name: String,
    tps: Vec<f64>,
}

impl TestResult {
    fn mean(&self) -> f64 {
        self.tps.iter().sum::<f64>() / self.tps.len().max(1) as f64
    }
    fn stddev(&self) -> f64 {
        let n = self.tps.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.tps.iter().map(|t| (t - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

pub fn run(a: &ModelArgs) -> Result<()> {
    if a.batch == 0 || a.reps == 0 {
        return Err(Error::invalid("-b and -r must be at least 1"));
    }
    let file = Arc::new(GgufFile::open(&a.model)?);
    let cfg = Config::from_metadata(file.metadata())?;
    let n_ctx = (a.depth + a.n_prompt.max(a.n_gen))
        .max(1)
        .next_multiple_of(256);
    let opts = EngineOptions {
        n_ctx,
        n_batch: a.batch,
        gpu_layers: a.ngl,
        device: DeviceOptions {
            device: a.device.clone(),
            ..Default::default()
        },
        // The prompt test's kernels compile with the upload, as `run`'s do.
        first_batch: Some(a.n_prompt.max(1)),
        ..Default::default()
    };
    let mut engine = load_engine(file.clone(), &cfg, &opts)?;
    let ids = |n: u32, salt: u32| -> Vec<u32> {
        (0..n)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(salt) >> 7) % cfg.n_vocab.max(1))
            .collect()
    };
    let max = engine.max_batch(Logits::Last).min(a.batch).max(1);
    // The context every test starts from: its positions stay as they are, as the tests
    // write only past them.
    let mut pos = 0;
    for chunk in ids(a.depth, 99).chunks(max as usize) {
        engine.step(chunk, pos, Logits::Last)?;
        pos += chunk.len() as u32;
    }
    let at = match a.depth {
        0 => String::new(),
        d => format!(" @ d{d}"),
    };
    let mut results = Vec::new();
    if a.n_prompt > 0 {
        let mut tps = Vec::new();
        // One untimed run first: pipelines and caches warm up.
        for rep in 0..=a.reps {
            let toks = ids(a.n_prompt, rep as u32);
            let t0 = Instant::now();
            let mut pos = a.depth;
            for chunk in toks.chunks(max as usize) {
                engine.step(chunk, pos, Logits::Last)?;
                pos += chunk.len() as u32;
            }
            if rep > 0 {
                tps.push(a.n_prompt as f64 / t0.elapsed().as_secs_f64());
            }
        }
        results.push(TestResult {
            name: format!("pp{}{at}", a.n_prompt),
            tps,
        });
    }
    if a.n_gen > 0 {
        let mut tps = Vec::new();
        for rep in 0..=a.reps {
            let toks = ids(a.n_gen, 7 + rep as u32);
            let t0 = Instant::now();
            for (i, t) in toks.iter().enumerate() {
                engine.step(std::slice::from_ref(t), a.depth + i as u32, Logits::Last)?;
            }
            if rep > 0 {
                tps.push(a.n_gen as f64 / t0.elapsed().as_secs_f64());
            }
        }
        results.push(TestResult {
            name: format!("tg{}{at}", a.n_gen),
            tps,
        });
    }
    let name = a
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let size = std::fs::metadata(&a.model).map(|m| m.len()).unwrap_or(0);
    let params: u64 = file
        .tensors()
        .iter()
        .map(|t| t.dims.iter().product::<u64>())
        .sum();
    let ngl = a.ngl.map(|n| n.to_string()).unwrap_or_else(|| "all".into());
    let backend = if a.ngl == Some(0) { "CPU" } else { "wgpu" };
    if a.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|r| {
                serde_json::json!({
                    "model": name, "size_bytes": size, "params": params, "backend": backend,
                    "ngl": ngl, "n_batch": a.batch, "n_depth": a.depth, "test": r.name,
                    "avg_ts": r.mean(), "stddev_ts": r.stddev(), "samples_ts": r.tps,
                    "mul_mat_variant": std::env::var(wgllm::ops::mul_mat::VARIANT_ENV).ok(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return Ok(());
    }
    println!("| model | size | params | backend | ngl | test | t/s |");
    println!("| --- | ---: | ---: | --- | --: | ---: | ---: |");
    for r in &results {
        println!(
            "| {} | {:.2} MiB | {:.2} M | {} | {} | {} | {:.2} ± {:.2} |",
            name,
            size as f64 / (1 << 20) as f64,
            params as f64 / 1e6,
            backend,
            ngl,
            r.name,
            r.mean(),
            r.stddev()
        );
    }
    Ok(())
}
