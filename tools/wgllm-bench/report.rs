//! The `kernels` subcommand's options and its table / JSON / CSV / comparison output.

use std::collections::BTreeMap;

use wgllm::gpu::upload::WeightMemory;
use wgllm::ops::mul_mat::Variant;
use wgllm::quant::GgmlType;
use wgllm::{Error, Result};

use crate::kernels::{self, Case, Kernel, Plan};
use crate::peak;
use crate::timing::Timer;

#[derive(clap::Args)]
pub struct KernelArgs {
    /// Only this op (mul_mat).
    #[arg(long)]
    op: Option<String>,
    /// Weight types, comma separated (default: q4_0,q4_1,q8_0,q4_k,q6_k,f16).
    #[arg(long = "type")]
    types: Option<String>,
    /// Shapes: KxN or part of a shape name (smollm2, 8b.ffn_up), comma separated.
    #[arg(long)]
    shape: Option<String>,
    /// Variants, comma separated (default: every one the device runs).
    #[arg(long)]
    variant: Option<String>,
    /// Where the weights are held, comma separated: buffer, texture (each variant runs
    /// in each; the windowed walks run as `row` from textures).
    #[arg(long, default_value = "buffer")]
    weights: String,
    /// Batch sizes, comma separated.
    #[arg(long, default_value = "1,16,64")]
    batch: String,
    /// Adapter index or name substring.
    #[arg(long)]
    device: Option<String>,
    /// Run every shape whole instead of capping the weight at 16 MiB.
    #[arg(long)]
    full: bool,
    /// Time one copy of each weight, which caches hold after the first repetition,
    /// instead of a new copy per repetition (a decode step reads each matrix once).
    #[arg(long)]
    warm: bool,
    /// MiB that the read peak's buffer and each weight's copies add up to; set it to
    /// several times the device's last-level cache (an H200's is 50 MB: 512 there).
    #[arg(long, default_value_t = 64)]
    cold_mib: u64,
    /// Products per timed pass, each on the next cold copy; a case's time is the pass's
    /// over this. Above 1 a case runs as a stream of dispatches, as in a decode step,
    /// rather than paying one pass's fixed cost (its timestamps and the wait before it)
    /// per product.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    per_pass: u32,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    #[arg(long)]
    json: bool,
    #[arg(long)]
    csv: bool,
    /// Variants side by side, as time ratios to the first variant listed.
    #[arg(long)]
    compare: bool,
    /// Time with the host clock even when timestamp queries exist.
    #[arg(long)]
    host_clock: bool,
    /// Record the fastest correct variant per type for this adapter in the tuning file
    /// (see `wgllm::gpu::tuning`), which later loads on this adapter use.
    #[arg(long)]
    save: bool,
}

fn list<T>(s: &Option<String>, parse: impl Fn(&str) -> Result<T>) -> Result<Option<Vec<T>>> {
    s.as_ref()
        .map(|s| s.split(',').filter(|p| !p.is_empty()).map(&parse).collect())
        .transpose()
}

fn parse_type(s: &str) -> Result<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
        .ok_or_else(|| Error::invalid(format!("unknown type {s:?}")))
}

fn parse_memory(s: &str) -> Result<WeightMemory> {
    WeightMemory::parse(s)
        .ok_or_else(|| Error::invalid(format!("--weights {s:?}: expected buffer or texture")))
}

fn parse_variant(s: &str) -> Result<Variant> {
    Variant::parse(s).ok_or_else(|| Error::invalid(format!("unknown variant {s:?}")))
}

pub fn run_kernels(a: &KernelArgs) -> Result<()> {
    if let Some(op) = &a.op {
        if op != "mul_mat" {
            return Err(Error::invalid(format!(
                "--op {op}: only mul_mat is benchmarked"
            )));
        }
    }
    let ctx = crate::context(&a.device)?;
    let timer = Timer::new(&ctx, !a.host_clock);
    let shapes = match &a.shape {
        None => kernels::shapes(),
        Some(f) => pick_shapes(f)?,
    };
    let plan = Plan {
        types: list(&a.types, parse_type)?.unwrap_or(kernels::DEFAULT_TYPES.to_vec()),
        variants: list(&a.variant, parse_variant)?.unwrap_or(Variant::ALL.to_vec()),
        memories: list(&Some(a.weights.clone()), parse_memory)?.unwrap_or_default(),
        shapes,
        batches: a
            .batch
            .split(',')
            .map(|b| {
                b.trim()
                    .parse::<u32>()
                    .map_err(|_| Error::invalid(format!("--batch {b}")))
            })
            .collect::<Result<_>>()?,
        max_weight_bytes: if a.full { u64::MAX } else { 16 << 20 },
        cold_bytes: if a.warm { 0 } else { a.cold_mib << 20 },
        warmup: 1,
        reps: a.reps,
        per_pass: a.per_pass as usize,
    };
    // The peak reads as many bytes as each weight's copies add up to, so that both
    // read memory rather than caches (capped at the device's binding limit).
    let peaks = Peaks::measure(&ctx, &timer, &plan.memories, a.cold_mib << 20)?;
    let pk = &peaks.buffer;
    let quiet = a.json || a.csv || a.compare;
    if !quiet {
        println!("device: {}", ctx.describe());
        println!(
            "peak read: {:.2} GB/s ({}), clock: {}, {} product(s) per timed pass",
            pk.gbps(),
            pk.pattern.name(),
            if pk.samples.gpu_clock {
                "GPU timestamps"
            } else {
                "host"
            },
            a.per_pass
        );
        if let Some(t) = &peaks.texture {
            println!(
                "peak texture read: {:.2} GB/s ({}; % peak of weights in textures)",
                t.gbps(),
                t.pattern.name()
            );
        }
        println!("| op | type | variant | shape | rows run | batch | ms | spread | GB/s | GFLOP/s | % peak |");
        println!("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    }
    let cases = kernels::run(&ctx, &timer, &plan, |c| {
        if !quiet {
            println!("{}", row(c, &peaks));
        }
    })?;
    if a.json {
        println!("{}", json(&ctx, &peaks, a.per_pass, &cases));
    } else if a.csv {
        print!("{}", csv(&cases, &peaks));
    } else if a.compare {
        print!("{}", compare(&cases, &plan.kernels()));
    }
    if a.save {
        save(&ctx, &kernels::fastest(&cases))?;
    }
    Ok(())
}

/// Merges this adapter's choices into the tuning file and says what it recorded.
fn save(ctx: &wgllm::gpu::GpuContext, best: &BTreeMap<GgmlType, (Kernel, f64)>) -> Result<()> {
    use wgllm::gpu::tuning::{adapter_key, Tuning};
    let mut t = Tuning::load().unwrap_or_else(|e| {
        eprintln!("warning: replacing an unreadable tuning file: {e}");
        Tuning::default()
    });
    let entry = t.adapters.entry(adapter_key(&ctx.info)).or_default();
    for (ty, (k, _)) in best {
        let ty = ty.name().to_string();
        entry
            .mul_mat
            .insert(ty.clone(), k.variant.name().to_string());
        entry.weights.insert(ty, k.memory.name().to_string());
    }
    let path = t.save()?;
    eprintln!("saved to {} for {}:", path.display(), ctx.info.name);
    for (ty, (v, slow)) in best {
        eprintln!("  {ty}: {} (others {slow:.2}x slower or more)", v.name());
    }
    Ok(())
}

/// The read peaks "% peak" is relative to: storage reads, and texture reads when some
/// weights are held in textures (each case against the peak of its weights' memory).
struct Peaks {
    buffer: peak::PeakResult,
    texture: Option<peak::PeakResult>,
}

impl Peaks {
    fn measure(
        ctx: &wgllm::gpu::GpuContext,
        timer: &Timer,
        memories: &[WeightMemory],
        bytes: u64,
    ) -> Result<Self> {
        let buffer = peak::peak(ctx, timer, bytes, &peak::peak_patterns(), 3)?;
        let texture = match memories.contains(&WeightMemory::Texture) {
            true => Some(peak::peak(ctx, timer, bytes, &peak::texture_patterns(), 3)?),
            false => None,
        };
        Ok(Peaks { buffer, texture })
    }

    /// The peak of `memory`, in GB/s.
    fn of(&self, memory: WeightMemory) -> f64 {
        match (memory, &self.texture) {
            (WeightMemory::Texture, Some(t)) => t.gbps(),
            _ => self.buffer.gbps(),
        }
    }

    fn pct(&self, c: &Case) -> Option<f64> {
        c.gbps().map(|g| g / self.of(c.kernel.memory) * 100.0)
    }
}

fn row(c: &Case, peaks: &Peaks) -> String {
    match (&c.samples, c.correct) {
        (Some(s), true) => format!(
            "| {} | {} | {} | {} | {} | {} | {:.3} | {:.0}% | {:.2} | {:.2} | {:.1}% |",
            c.op,
            c.ty,
            c.kernel.name(),
            c.shape,
            c.n,
            c.batch,
            s.median() * 1e3,
            s.spread() * 100.0,
            c.gbps().unwrap_or(0.0),
            c.gflops().unwrap_or(0.0),
            peaks.pct(c).unwrap_or(0.0)
        ),
        _ => format!(
            "| {} | {} | {} | {} | {} | {} | WRONG (nmse {:.1e}) | | | | |",
            c.op,
            c.ty,
            c.kernel.name(),
            c.shape,
            c.n,
            c.batch,
            c.nmse
        ),
    }
}

fn json(ctx: &wgllm::gpu::GpuContext, peaks: &Peaks, per_pass: u32, cases: &[Case]) -> String {
    let pk = &peaks.buffer;
    let rows: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| {
            serde_json::json!({
                "op": c.op,
                "type": c.ty.name(),
                "variant": c.kernel.variant.name(),
                "weights": c.kernel.memory.name(),
                "shape": c.shape,
                "k": c.k,
                "n": c.n_full,
                "rows_run": c.n,
                "batch": c.batch,
                "status": if c.correct { "ok" } else { "WRONG" },
                "nmse": c.nmse,
                "median_ms": c.secs().map(|t| t * 1e3),
                "min_ms": c.samples.as_ref().map(|s| s.min() * 1e3),
                "max_ms": c.samples.as_ref().map(|s| s.max() * 1e3),
                "reps": c.samples.as_ref().map(|s| s.secs.len()),
                "bytes": c.bytes,
                "flops": c.flops,
                "gb_s": c.gbps(),
                "gflop_s": c.gflops(),
                "pct_peak": peaks.pct(c),
            })
        })
        .collect();
    let doc = serde_json::json!({
        "device": ctx.info.name,
        "backend": format!("{:?}", ctx.info.backend),
        "driver": format!("{} {}", ctx.info.driver, ctx.info.driver_info),
        "clock": if pk.samples.gpu_clock { "gpu_timestamp" } else { "host" },
        "peak": { "pattern": pk.pattern.name(), "gb_s": pk.gbps() },
        "per_pass": per_pass,
        "texture_peak": peaks.texture.as_ref().map(|t| {
            serde_json::json!({ "pattern": t.pattern.name(), "gb_s": t.gbps() })
        }),
        "results": rows,
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

fn csv(cases: &[Case], peaks: &Peaks) -> String {
    let mut s = String::from(
        "op,type,variant,shape,rows_run,batch,status,median_ms,gb_s,gflop_s,pct_peak\n",
    );
    for c in cases {
        let f = |v: Option<f64>| v.map(|v| format!("{v:.4}")).unwrap_or_default();
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{}\n",
            c.op,
            c.ty,
            c.kernel.name(),
            c.shape,
            c.n,
            c.batch,
            if c.correct { "ok" } else { "WRONG" },
            f(c.secs().map(|t| t * 1e3)),
            f(c.gbps()),
            f(c.gflops()),
            f(peaks.pct(c)),
        ));
    }
    s
}

/// One line per (type, shape, batch); one column per variant: ms, and the ratio of the
/// first variant's time to this one's (above 1: faster).
fn compare(cases: &[Case], variants: &[Kernel]) -> String {
    let mut by: BTreeMap<(String, String, u32), Vec<&Case>> = BTreeMap::new();
    for c in cases {
        by.entry((c.ty.to_string(), c.shape.clone(), c.batch))
            .or_default()
            .push(c);
    }
    let mut s = String::from("| type | shape | batch |");
    for v in variants {
        s.push_str(&format!(" {} |", v.name()));
    }
    s.push_str("\n|---|---|---:|");
    s.push_str(&"---:|".repeat(variants.len()));
    s.push('\n');
    for ((ty, shape, batch), cs) in by {
        let base = variants
            .first()
            .and_then(|v| cs.iter().find(|c| c.kernel == *v))
            .and_then(|c| c.secs());
        s.push_str(&format!("| {ty} | {shape} | {batch} |"));
        for v in variants {
            let cell = match cs.iter().find(|c| c.kernel == *v) {
                Some(c) if !c.correct => "WRONG".to_string(),
                Some(c) => match (c.secs(), base) {
                    (Some(t), Some(b)) => format!("{:.3} ms ({:.2}x)", t * 1e3, b / t),
                    (Some(t), None) => format!("{:.3} ms", t * 1e3),
                    _ => String::new(),
                },
                None => "-".to_string(),
            };
            s.push_str(&format!(" {cell} |"));
        }
        s.push('\n');
    }
    s
}

/// The shapes `--shape` names: each comma-separated part is `KxN` (a known shape of that
/// size, or a new one) or part of known shapes' names, which must match one at least.
fn pick_shapes(list: &str) -> Result<Vec<kernels::Shape>> {
    let known = kernels::shapes();
    let mut out: Vec<kernels::Shape> = Vec::new();
    for part in list.split(',').map(str::trim) {
        let size = part
            .split_once('x')
            .and_then(|(k, n)| Some((k.parse::<u64>().ok()?, n.parse::<u64>().ok()?)));
        let found: Vec<kernels::Shape> = match size {
            Some((k, n)) => {
                let same: Vec<_> = known
                    .iter()
                    .filter(|s| s.k == k && s.n == n)
                    .cloned()
                    .collect();
                if same.is_empty() && k > 0 && n > 0 {
                    vec![kernels::Shape {
                        name: "custom",
                        k,
                        n,
                    }]
                } else {
                    same
                }
            }
            None => known
                .iter()
                .filter(|s| s.name.contains(part))
                .cloned()
                .collect(),
        };
        if found.is_empty() {
            let names: Vec<&str> = known.iter().map(|s| s.name).collect();
            return Err(Error::invalid(format!(
                "--shape {part}: not KxN (both above 0) and no shape is named like it; shapes: {}",
                names.join(", ")
            )));
        }
        for s in found {
            if !out.iter().any(|o| o.k == s.k && o.n == s.n) {
                out.push(s);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::Samples;

    fn result(gbps: f64) -> peak::PeakResult {
        peak::PeakResult {
            pattern: peak::texture_patterns()[0],
            bytes: (gbps * 1e9) as u64,
            samples: Samples {
                secs: vec![1.0],
                gpu_clock: false,
            },
        }
    }

    #[test]
    fn each_memory_is_measured_against_its_own_peak() {
        let both = Peaks {
            buffer: result(10.0),
            texture: Some(result(20.0)),
        };
        assert_eq!(both.of(WeightMemory::Buffer), 10.0);
        assert_eq!(both.of(WeightMemory::Texture), 20.0);
        let buffers = Peaks {
            buffer: result(10.0),
            texture: None,
        };
        assert_eq!(buffers.of(WeightMemory::Texture), 10.0);
    }
}
