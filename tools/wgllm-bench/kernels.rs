//! `wgllm-bench kernels`: every mul_mat variant per weight type over matrix shapes of
//! real models, with the weights in each memory asked for (storage buffers, textures),
//! checked against the CPU reference before it is timed.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;

use wgllm::gguf::TensorInfo;
use wgllm::gpu::upload::{storage, storage_init, WeightMemory};
use wgllm::gpu::{GpuContext, GpuTensor};
use wgllm::ops::mul_mat::{self, Columns, Variant};
use wgllm::ops::StepInfo;
use wgllm::quant::{self, GgmlType};
use wgllm::{Error, Result};

use crate::timing::{Samples, Timer};

/// A weight shape: W is [k, n] in ggml order (rows of k elements, n rows).
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub k: u64,
    pub n: u64,
}

pub fn shapes() -> Vec<Shape> {
    let s = |name, k, n| Shape { name, k, n };
    vec![
        s("smollm2.ffn_up", 576, 1536),
        s("smollm2.ffn_down", 1536, 576),
        s("smollm2.output", 576, 49152),
        s("gemma3.ffn_up", 640, 2048),
        s("gemma3.ffn_down", 2048, 640),
        s("gemma3.output", 640, 262144),
        s("8b.attn_q", 4096, 4096),
        s("8b.ffn_up", 4096, 14336),
        s("8b.ffn_down", 14336, 4096),
        s("8b.output", 4096, 128256),
    ]
}

pub const DEFAULT_TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::F16,
];

/// What runs a product: a mul_mat variant reading its weights from one memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub variant: Variant,
    pub memory: WeightMemory,
}

impl Kernel {
    /// The variant's name, with `@texture` for weights in textures.
    pub fn name(self) -> String {
        match self.memory {
            WeightMemory::Buffer => self.variant.name().to_string(),
            m => format!("{}@{}", self.variant.name(), m.name()),
        }
    }
}

/// One measured (or rejected) case.
#[derive(Clone, Debug)]
pub struct Case {
    pub op: &'static str,
    pub ty: GgmlType,
    pub kernel: Kernel,
    pub shape: String,
    pub k: u64,
    /// Rows actually run (big shapes are sub-sampled in quick mode).
    pub n: u64,
    pub n_full: u64,
    pub batch: u32,
    pub correct: bool,
    pub nmse: f64,
    pub samples: Option<Samples>,
    pub bytes: u64,
    pub flops: u64,
}

impl Case {
    pub fn secs(&self) -> Option<f64> {
        self.samples.as_ref().map(|s| s.median())
    }
    pub fn gbps(&self) -> Option<f64> {
        self.secs().map(|t| self.bytes as f64 / t / 1e9)
    }
    pub fn gflops(&self) -> Option<f64> {
        self.secs().map(|t| self.flops as f64 / t / 1e9)
    }
}

pub struct Plan {
    pub types: Vec<GgmlType>,
    pub variants: Vec<Variant>,
    /// Where the weights are held, each in turn.
    pub memories: Vec<WeightMemory>,
    pub shapes: Vec<Shape>,
    pub batches: Vec<u32>,
    /// Largest weight run per case; bigger shapes keep only as many rows.
    pub max_weight_bytes: u64,
    /// Copies of each weight together at least this large, one per repetition in turn,
    /// so that each reads its weight from memory, as a decode step does (0: one copy).
    pub cold_bytes: u64,
    pub warmup: usize,
    pub reps: usize,
    /// Products per timed pass (`--per-pass`): each repetition's time is its pass's
    /// over this.
    pub per_pass: usize,
}

impl Plan {
    /// Every (variant, memory) to run, memories outermost.
    pub fn kernels(&self) -> Vec<Kernel> {
        let each = |memory| {
            self.variants
                .iter()
                .map(move |&variant| Kernel { variant, memory })
        };
        self.memories.iter().flat_map(|&m| each(m)).collect()
    }
}

/// Per weight type, the kernel to run: among those correct in every case measured for
/// the type, the one with the least geometric-mean time relative to the fastest of each
/// (shape, batch); with it, how much slower the runner-up is (1.0 when alone). Kernels
/// missing a case of their type, or wrong in any, are not chosen.
pub fn fastest(cases: &[Case]) -> BTreeMap<GgmlType, (Kernel, f64)> {
    let mut by_ty: BTreeMap<GgmlType, Vec<&Case>> = BTreeMap::new();
    for c in cases {
        by_ty.entry(c.ty).or_default().push(c);
    }
    let mut out = BTreeMap::new();
    for (ty, cs) in by_ty {
        let mut groups: BTreeMap<(String, u32), Vec<&Case>> = BTreeMap::new();
        for c in &cs {
            groups
                .entry((c.shape.clone(), c.batch))
                .or_default()
                .push(c);
        }
        let mut kernels: Vec<Kernel> = cs.iter().map(|c| c.kernel).collect();
        kernels.sort_by_key(|k| k.name());
        kernels.dedup();
        let mut scored: Vec<(f64, Kernel)> = kernels
            .into_iter()
            .filter_map(|v| {
                let mut log_sum = 0.0;
                for g in groups.values() {
                    let best = g
                        .iter()
                        .filter(|c| c.correct)
                        .filter_map(|c| c.secs())
                        .fold(f64::INFINITY, f64::min);
                    let mine = g.iter().find(|c| c.kernel == v)?;
                    let t = mine.secs().filter(|_| mine.correct)?;
                    log_sum += (t / best).ln();
                }
                Some(((log_sum / groups.len().max(1) as f64).exp(), v))
            })
            .collect();
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        if let Some(&(s0, v)) = scored.first() {
            let next = scored.get(1).map_or(1.0, |&(s1, _)| s1 / s0);
            out.insert(ty, (v, next));
        }
    }
    out
}

/// How many copies of a weight of `bytes` add up to `cold_bytes` (at least one).
fn copies(cold_bytes: u64, bytes: u64) -> usize {
    match bytes {
        0 => 1,
        _ => cold_bytes.div_ceil(bytes).max(1) as usize,
    }
}

/// Distinct random rows; the matrix repeats them (quantizing a 4 GB matrix would take
/// longer than the benchmark, and the kernels cannot tell).
const DISTINCT_ROWS: u64 = 64;

pub fn run(
    ctx: &GpuContext,
    timer: &Timer,
    plan: &Plan,
    mut each: impl FnMut(&Case),
) -> Result<Vec<Case>> {
    let mut out = Vec::new();
    for shape in &plan.shapes {
        for &ty in &plan.types {
            if shape.k % (ty.block_size() as u64).max(32) != 0 {
                continue;
            }
            let row_bytes = ty
                .row_bytes(shape.k)
                .ok_or_else(|| Error::invalid(format!("{ty}: {} columns", shape.k)))?;
            let n = (plan.max_weight_bytes / row_bytes)
                .clamp(DISTINCT_ROWS, shape.n.max(DISTINCT_ROWS))
                .min(shape.n);
            let w = weight(ty, shape.k, n)?;
            let n_copies = copies(plan.cold_bytes, w.len() as u64);
            let gws = plan
                .memories
                .iter()
                .map(|&m| {
                    (0..n_copies)
                        .map(|_| upload(ctx, ty, shape.k, n, &w, m))
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            for &batch in &plan.batches {
                // The cases reading one memory's copies take them in turn from one
                // counter, so that a copy is read again only after all the others,
                // whichever case reads it.
                let counters: Vec<_> = gws.iter().map(|_| Rc::new(Cell::new(0))).collect();
                let mut group = Vec::new();
                for k in plan.kernels() {
                    if !k.variant.available(ctx) {
                        continue;
                    }
                    let Some(m) = gws.iter().position(|g| g[0].memory == k.memory) else {
                        continue;
                    };
                    let next = counters[m].clone();
                    group.push(prepare(
                        ctx, timer, shape, ty, k, &w, &gws[m], next, n, batch,
                    )?);
                }
                for c in time_interleaved(ctx, timer, plan, group)? {
                    each(&c);
                    out.push(c);
                }
            }
        }
    }
    Ok(out)
}

fn weight(ty: GgmlType, k: u64, n: u64) -> Result<Vec<u8>> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let vals: Vec<f32> = (0..k * DISTINCT_ROWS.min(n))
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    let mut rows = Vec::new();
    quant::quantize(ty, &vals, &mut rows)?;
    let mut out = Vec::with_capacity(rows.len() * (n / DISTINCT_ROWS.min(n)) as usize + rows.len());
    while (out.len() as u64) < rows.len() as u64 * n / DISTINCT_ROWS.min(n) {
        out.extend_from_slice(&rows);
    }
    let rb = ty.row_bytes(k).unwrap_or(0) as usize;
    out.truncate(rb * n as usize);
    Ok(out)
}

fn upload(
    ctx: &GpuContext,
    ty: GgmlType,
    k: u64,
    n: u64,
    bytes: &[u8],
    memory: WeightMemory,
) -> Result<GpuTensor> {
    let info = TensorInfo {
        name: format!("bench.{ty}"),
        dims: vec![k, n],
        ty,
        offset: 0,
        n_bytes: bytes.len() as u64,
    };
    GpuTensor::upload_in(ctx, &info, bytes, memory)
}

/// The runs of an interleaved timing of `n` cases, in order: (case, whether its time is
/// kept), the warm-up rounds first, each round running every case once.
fn schedule(n: usize, warmup: usize, reps: usize) -> impl Iterator<Item = (usize, bool)> {
    (0..warmup + reps).flat_map(move |round| (0..n).map(move |i| (i, round >= warmup)))
}

/// A case ready to time: its dispatches, one product per copy of the weight, and the
/// case as checked (no samples yet).
struct Prepared {
    ds: Vec<Vec<wgllm::ops::Dispatch>>,
    step: StepInfo,
    /// The copy the next run of any case on these copies reads.
    next: Rc<Cell<usize>>,
    case: Case,
}

impl Prepared {
    /// Records one product, on the next copy of the weight.
    fn record(&self, pass: &mut wgpu::ComputePass<'_>) -> Result<()> {
        let i = self.next.get();
        self.next.set((i + 1) % self.ds.len());
        for d in &self.ds[i] {
            d.record(pass, &self.step)?;
        }
        Ok(())
    }
}

/// Builds a case's products and checks the first copy's distinct rows against the CPU
/// reference.
#[allow(clippy::too_many_arguments)]
fn prepare(
    ctx: &GpuContext,
    timer: &Timer,
    shape: &Shape,
    ty: GgmlType,
    kernel: Kernel,
    w: &[u8],
    gws: &[GpuTensor],
    next: Rc<Cell<usize>>,
    n: u64,
    batch: u32,
) -> Result<Prepared> {
    let k = shape.k as usize;
    let x: Vec<f32> = (0..k * batch as usize)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let step = StepInfo::new(0, batch);
    let sb = wgllm::ops::uniform_for_tests(ctx, &step);
    let xb = storage_init(ctx, "bench x", &x);
    let yb = storage(ctx, "bench y", n * batch as u64 * 4)?;
    let ds = gws
        .iter()
        .map(|gw| {
            mul_mat::gpu_variant(
                ctx,
                kernel.variant,
                &sb,
                gw,
                &xb,
                &yb,
                Columns::All,
                mul_mat::Store::Write,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    // Pipelines the product compiles on first use, compiled before any timing.
    wgllm::ops::prepare(ds.iter().flatten(), &step)?;
    let mut p = Prepared {
        ds,
        step,
        next,
        case: Case {
            op: "mul_mat",
            ty,
            kernel,
            shape: format!("{}x{}", shape.k, shape.n),
            k: shape.k,
            n,
            n_full: shape.n,
            batch,
            correct: false,
            nmse: f64::INFINITY,
            samples: None,
            bytes: gws[0].n_bytes() + (shape.k + n) * batch as u64 * 4,
            flops: 2 * shape.k * n * batch as u64,
        },
    };
    // Correctness first (on whichever copy is next: they hold the same weight): the
    // distinct rows against the reference.
    timer.once(ctx, &|pass| p.record(pass))?;
    let got: Vec<f32> = wgllm::gpu::readback::read_buffer(ctx, &yb, (n * batch as u64) as usize)?;
    let rows = DISTINCT_ROWS.min(n) as usize;
    let rb = ty.row_bytes(shape.k).unwrap_or(0) as usize;
    let mut want = vec![0f32; rows * batch as usize];
    // Batches that quantize their activations (`mul_mat_ks1i`) are checked against the
    // reference that does the same, as tightly as the others.
    let q8 = batch > 1 && mul_mat::quantizes_batches(ctx, kernel.variant, &gws[0], Columns::All);
    let reference = if q8 {
        mul_mat::reference_q8
    } else {
        mul_mat::reference
    };
    reference(ty, &w[..rb * rows], rows, k, &x, batch as usize, &mut want)?;
    let mut num = 0f64;
    let mut den = 0f64;
    for t in 0..batch as usize {
        for r in 0..rows {
            let g = got[t * n as usize + r] as f64;
            let e = want[t * rows + r] as f64;
            num += if g.is_finite() {
                (g - e).powi(2)
            } else {
                f64::INFINITY
            };
            den += e * e;
        }
    }
    p.case.nmse = num / den.max(1e-30);
    p.case.correct = p.case.nmse < 1e-8;
    Ok(p)
}

/// Times the correct cases of one (shape, type, batch) in rounds: every repetition
/// runs each case once, in turn, so a machine whose speed drifts (CPU-hosted drivers
/// share the cores with everything else) slows them alike and their ratios hold.
fn time_interleaved(
    ctx: &GpuContext,
    timer: &Timer,
    plan: &Plan,
    group: Vec<Prepared>,
) -> Result<Vec<Case>> {
    let timed: Vec<&Prepared> = group.iter().filter(|p| p.case.correct).collect();
    let mut secs = vec![Vec::with_capacity(plan.reps); timed.len()];
    let per_pass = plan.per_pass.max(1);
    for (i, kept) in schedule(timed.len(), plan.warmup, plan.reps) {
        let t = timer.once(ctx, &|pass| {
            for _ in 0..per_pass {
                timed[i].record(pass)?;
            }
            Ok(())
        })?;
        if kept {
            secs[i].push(t / per_pass as f64);
        }
    }
    let gpu_clock = timer.gpu_clock();
    let mut secs = secs.into_iter();
    Ok(group
        .into_iter()
        .map(|p| {
            let samples = if p.case.correct {
                secs.next().map(|secs| Samples { secs, gpu_clock })
            } else {
                None
            };
            Case { samples, ..p.case }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(ty: GgmlType, kernel: Kernel, shape: &str, batch: u32, ms: f64, ok: bool) -> Case {
        Case {
            op: "mul_mat",
            ty,
            kernel,
            shape: shape.into(),
            k: 32,
            n: 1,
            n_full: 1,
            batch,
            correct: ok,
            nmse: 0.0,
            samples: Some(Samples {
                secs: vec![ms / 1e3],
                gpu_clock: false,
            }),
            bytes: 1,
            flops: 1,
        }
    }

    #[test]
    fn cases_are_timed_in_turn() {
        let runs: Vec<_> = schedule(3, 1, 2).collect();
        let mut want = vec![(0, false), (1, false), (2, false)];
        want.extend([(0, true), (1, true), (2, true)].repeat(2));
        assert_eq!(runs, want);
        assert_eq!(schedule(0, 1, 5).count(), 0);
    }

    #[test]
    fn copies_add_up_to_the_cold_size() {
        assert_eq!(copies(64 << 20, 553 << 10), 119);
        assert_eq!(copies(64 << 20, 16 << 20), 4);
        assert_eq!(copies(64 << 20, (16 << 20) + 1), 4);
        assert_eq!(copies(64 << 20, 558 << 20), 1);
        assert_eq!(copies(0, 1 << 20), 1);
        assert_eq!(copies(64 << 20, 0), 1);
    }

    /// The fastest overall wins, a variant wrong anywhere never does, and each type is
    /// chosen on its own cases.
    #[test]
    fn fastest_correct_variant_per_type() {
        use GgmlType::{Q4_0, Q8_0};
        let k = |variant, memory| Kernel { variant, memory };
        let row = k(Variant::Row, WeightMemory::Buffer);
        let wg = k(Variant::Wg, WeightMemory::Buffer);
        // The same variant with textures is a kernel of its own.
        let ks = k(Variant::Ks, WeightMemory::Buffer);
        let ks_tex = k(Variant::Ks, WeightMemory::Texture);
        let cases = [
            case(Q4_0, ks, "a", 1, 9.0, true),
            case(Q4_0, ks, "a", 16, 9.0, true),
            case(Q4_0, row, "a", 1, 2.0, true),
            case(Q4_0, wg, "a", 1, 1.0, true),
            case(Q4_0, ks_tex, "a", 1, 0.5, false),
            case(Q4_0, row, "a", 16, 2.0, true),
            case(Q4_0, wg, "a", 16, 3.0, true),
            case(Q4_0, ks_tex, "a", 16, 0.5, true),
            case(Q8_0, row, "a", 1, 1.0, true),
            case(Q8_0, wg, "a", 1, 4.0, true),
        ];
        let best = fastest(&cases);
        // Q4_0: wg 1.0 / 3.0 against row 2.0 / 2.0 relative to the best correct
        // (1.0, 0.5): wg sqrt(1 * 6) = 2.45, row sqrt(2 * 4) = 2.83.
        assert_eq!(best[&Q4_0].0, wg);
        assert!((best[&Q4_0].1 - (8f64 / 6.0).sqrt()).abs() < 1e-9);
        assert_eq!(best[&Q8_0], (row, 4.0));
        assert_eq!(ks_tex.name(), "ks@texture");
        assert_eq!(ks.name(), "ks");
    }
}
