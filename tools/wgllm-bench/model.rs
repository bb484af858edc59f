//! `wgllm-bench model`: prompt processing (pp) and generation (tg) throughput of a
//! whole model, printed as a llama-bench style table.
//!
//! With `--versus SETTING` it loads the model twice, the second engine with one GPU
//! setting changed, and interleaves the two engines' steps (each prompt, each generated
//! token), the order flipped every time. A machine whose speed drifts between runs (a
//! VM's lavapipe decoding read 23 to 34 t/s in runs minutes apart, docs/perf.md) then
//! slows both alike, and their ratio holds where two separate runs could not tell 5%
//! apart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use wgllm::engine::{load_engine, EngineOptions};
use wgllm::gguf::GgufFile;
use wgllm::gpu::upload::WeightMemory;
use wgllm::gpu::DeviceOptions;
use wgllm::model::gpu_backend::Logits;
use wgllm::model::Config;
use wgllm::ops::mul_mat::Variant;
use wgllm::session::Engine;
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
    /// A second engine beside the first with one GPU setting changed, their steps
    /// interleaved in this process: `mul-mat=VARIANT` (as `WGLLM_MUL_MAT`),
    /// `weights=buffer|texture`, `no-f16`, `no-subgroups`, `workgroup-reductions`,
    /// `one-row-at-a-time`, `ks1-groups=N`, `ks1-max-rows=N`, `chains=on|off`,
    /// `field-runs=on|off`, `split-rows=on|off`, `sliced-batches=on|off` or
    /// `sliced-tokens=on|off`.
    #[arg(long, value_name = "SETTING")]
    versus: Option<String>,
    #[arg(long)]
    json: bool,
}

/// One test's throughput on one engine, a value per repetition.
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

/// `opts` with `setting` (see `ModelArgs::versus`) applied.
fn versus_options(setting: &str, opts: &DeviceOptions) -> Result<DeviceOptions> {
    let mut o = opts.clone();
    let (key, value) = match setting.split_once('=') {
        Some((k, v)) => (k.trim(), Some(v.trim())),
        None => (setting.trim(), None),
    };
    match (key, value) {
        ("mul-mat", Some(v)) => {
            let variant = Variant::parse(v).ok_or_else(|| {
                Error::invalid(format!("--versus mul-mat={v}: no such mul_mat variant"))
            })?;
            o.mul_mat = Some(variant.name().to_string());
        }
        ("weights", Some(v)) => {
            o.weights = Some(WeightMemory::parse(v).ok_or_else(|| {
                Error::invalid(format!("--versus weights={v}: expected buffer or texture"))
            })?);
        }
        ("no-f16", None) => o.disable_f16 = true,
        ("no-subgroups", None) => o.disable_subgroups = true,
        ("workgroup-reductions", None) => o.workgroup_reductions = true,
        ("one-row-at-a-time", None) => o.one_row_at_a_time = true,
        ("ks1-groups", Some(v)) => o.ks1_groups = Some(count(key, v)?),
        ("ks1-max-rows", Some(v)) => o.ks1_max_rows = Some(count(key, v)?),
        ("chains", Some(v)) => o.chains = Some(on_off(key, v)?),
        ("field-runs", Some(v)) => o.field_runs = Some(on_off(key, v)?),
        ("split-rows", Some(v)) => o.split_rows = Some(on_off(key, v)?),
        ("sliced-batches", Some(v)) => o.sliced_batches = Some(on_off(key, v)?),
        ("sliced-tokens", Some(v)) => o.sliced_tokens = Some(on_off(key, v)?),
        _ => {
            return Err(Error::invalid(format!(
                "--versus {setting}: expected mul-mat=VARIANT, weights=buffer|texture, \
                 no-f16, no-subgroups, workgroup-reductions, one-row-at-a-time, \
                 ks1-groups=N, ks1-max-rows=N, chains=on|off, field-runs=on|off, \
                 split-rows=on|off, sliced-batches=on|off or sliced-tokens=on|off"
            )))
        }
    }
    Ok(o)
}

/// A `--versus` switch's value: `on` or `off`.
fn on_off(key: &str, v: &str) -> Result<bool> {
    match v {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(Error::invalid(format!(
            "--versus {key}={v}: expected on or off"
        ))),
    }
}

/// A `--versus` setting's count, above 0.
fn count(key: &str, v: &str) -> Result<u32> {
    v.parse()
        .ok()
        .filter(|&n: &u32| n > 0)
        .ok_or_else(|| Error::invalid(format!("--versus {key}={v}: expected a count above 0")))
}

pub fn run(a: &ModelArgs) -> Result<()> {
    if a.batch == 0 || a.reps == 0 {
        return Err(Error::invalid("-b and -r must be at least 1"));
    }
    if a.versus.is_some() && a.ngl == Some(0) {
        return Err(Error::invalid(
            "--versus changes a GPU setting: it needs layers on the GPU (not --ngl 0)",
        ));
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
    // The second engine's options, checked before either engine loads.
    let versus = match &a.versus {
        Some(setting) => Some(EngineOptions {
            device: versus_options(setting, &opts.device)?,
            ..opts.clone()
        }),
        None => None,
    };
    let mut engines = vec![load_engine(file.clone(), &cfg, &opts)?];
    if let Some(other) = &versus {
        engines.push(load_engine(file.clone(), &cfg, other)?);
    }
    let results = time_tests(a, &cfg, &mut engines)?;
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
    let report = Report {
        name,
        size,
        params,
        ngl: a.ngl.map(|n| n.to_string()).unwrap_or_else(|| "all".into()),
        backend: if a.ngl == Some(0) { "CPU" } else { "wgpu" },
    };
    match (&a.versus, a.json) {
        (_, true) => report.json(a, &results),
        (Some(setting), false) => report.versus_table(setting, &results),
        (None, false) => report.table(&results[0]),
    }
    Ok(())
}

/// The pp and tg tests on every engine, their steps interleaved: `[engine][test]`.
fn time_tests(
    a: &ModelArgs,
    cfg: &Config,
    engines: &mut [Box<dyn Engine>],
) -> Result<Vec<Vec<TestResult>>> {
    let ids = |n: u32, salt: u32| -> Vec<u32> {
        (0..n)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(salt) >> 7) % cfg.n_vocab.max(1))
            .collect()
    };
    let max = engines
        .iter()
        .map(|e| e.max_batch(Logits::Last))
        .min()
        .unwrap_or(1)
        .min(a.batch)
        .max(1) as usize;
    // The context every test starts from: its positions stay as they are, as the tests
    // write only past them.
    let depth = ids(a.depth, 99);
    for e in engines.iter_mut() {
        prompt(e.as_mut(), &depth, 0, max)?;
    }
    let at = match a.depth {
        0 => String::new(),
        d => format!(" @ d{d}"),
    };
    let n = engines.len();
    let mut results: Vec<Vec<TestResult>> = (0..n).map(|_| Vec::new()).collect();
    // Engine order for round `i`: flipped every round, so that neither always runs
    // first after the other.
    let order = |i: usize| -> Vec<usize> {
        let mut o: Vec<usize> = (0..n).collect();
        if i % 2 == 1 {
            o.reverse();
        }
        o
    };
    if a.n_prompt > 0 {
        let mut tps = vec![Vec::new(); n];
        // One untimed repetition first: pipelines and caches warm up.
        for rep in 0..=a.reps {
            let toks = ids(a.n_prompt, rep as u32);
            for k in order(rep) {
                let t0 = Instant::now();
                prompt(engines[k].as_mut(), &toks, a.depth, max)?;
                if rep > 0 {
                    tps[k].push(a.n_prompt as f64 / t0.elapsed().as_secs_f64());
                }
            }
        }
        for (r, tps) in results.iter_mut().zip(tps) {
            let name = format!("pp{}{at}", a.n_prompt);
            r.push(TestResult { name, tps });
        }
    }
    if a.n_gen > 0 {
        let mut tps = vec![Vec::new(); n];
        for rep in 0..=a.reps {
            // After the untimed repetition, whatever the engines still build for single
            // tokens (lavapipe's chains) is ready: the timed ones measure the steady
            // state, as llama-bench's do after its warm-up run.
            if rep == 1 {
                for e in engines.iter() {
                    e.settle()?;
                }
            }
            let toks = ids(a.n_gen, 7 + rep as u32);
            let mut secs = vec![0f64; n];
            for (i, t) in toks.iter().enumerate() {
                for k in order(i + rep) {
                    let t0 = Instant::now();
                    let pos = a.depth + i as u32;
                    engines[k].step(std::slice::from_ref(t), pos, Logits::Last)?;
                    secs[k] += t0.elapsed().as_secs_f64();
                }
            }
            if rep > 0 {
                for (tps, s) in tps.iter_mut().zip(&secs) {
                    tps.push(a.n_gen as f64 / s);
                }
            }
        }
        for (r, tps) in results.iter_mut().zip(tps) {
            let name = format!("tg{}{at}", a.n_gen);
            r.push(TestResult { name, tps });
        }
    }
    Ok(results)
}

/// `toks` from position `pos`, in steps of at most `max` tokens.
fn prompt(e: &mut dyn Engine, toks: &[u32], mut pos: u32, max: usize) -> Result<()> {
    for chunk in toks.chunks(max) {
        e.step(chunk, pos, Logits::Last)?;
        pos += chunk.len() as u32;
    }
    Ok(())
}

/// What the report says of the model and where it ran.
struct Report {
    name: String,
    size: u64,
    params: u64,
    ngl: String,
    backend: &'static str,
}

impl Report {
    fn json(&self, a: &ModelArgs, results: &[Vec<TestResult>]) {
        let mut rows = Vec::new();
        for (k, tests) in results.iter().enumerate() {
            for r in tests {
                rows.push(serde_json::json!({
                    "model": self.name, "size_bytes": self.size, "params": self.params,
                    "backend": self.backend, "ngl": self.ngl, "n_batch": a.batch,
                    "n_depth": a.depth, "test": r.name,
                    "avg_ts": r.mean(), "stddev_ts": r.stddev(), "samples_ts": r.tps,
                    "mul_mat_variant": std::env::var(wgllm::ops::mul_mat::VARIANT_ENV).ok(),
                    "versus": if k > 0 { a.versus.clone() } else { None },
                }));
            }
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
    }

    fn table(&self, results: &[TestResult]) {
        println!("| model | size | params | backend | ngl | test | t/s |");
        println!("| --- | ---: | ---: | --- | --: | ---: | ---: |");
        for r in results {
            println!(
                "| {} | {:.2} MiB | {:.2} M | {} | {} | {} | {:.2} ± {:.2} |",
                self.name,
                self.size as f64 / (1 << 20) as f64,
                self.params as f64 / 1e6,
                self.backend,
                self.ngl,
                r.name,
                r.mean(),
                r.stddev()
            );
        }
    }

    /// The two engines side by side, and the second's speed over the first's.
    fn versus_table(&self, setting: &str, results: &[Vec<TestResult>]) {
        println!("| model | ngl | test | t/s | t/s with {setting} | ratio | each repetition's |");
        println!("| --- | --: | ---: | ---: | ---: | ---: | ---: |");
        for (base, other) in results[0].iter().zip(&results[1]) {
            // Each repetition's ratio: the pairs of runs side by side in time.
            let pairs: Vec<f64> = base
                .tps
                .iter()
                .zip(&other.tps)
                .map(|(a, b)| b / a)
                .collect();
            let lo = pairs.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = pairs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            println!(
                "| {} | {} | {} | {:.2} ± {:.2} | {:.2} ± {:.2} | {:.3}x | {lo:.3}-{hi:.3}x |",
                self.name,
                self.ngl,
                base.name,
                base.mean(),
                base.stddev(),
                other.mean(),
                other.stddev(),
                other.mean() / base.mean()
            );
        }
    }
}
