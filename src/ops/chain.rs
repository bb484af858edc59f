//! Chains: a run of consecutive single-token kernels of a step's plan recorded as one
//! dispatch, for CPU-hosted drivers (on lavapipe unless turned off: `GpuContext::chains`).
//!
//! lavapipe hands each dispatch's workgroups to worker threads that sleep between
//! dispatches, and waits for them: `wgllm-bench sync` measured 9-41 us a dispatch of a
//! trivial kernel against 2-5 us a phase of one dispatch whose workgroups wait for each
//! other (docs/perf.md). A chain joins its kernels' WGSL into one module
//! (`gpu::wgsl_link`): each kernel's bindings from a base of its own in one group, bound
//! to the resources its dispatch binds, and shaders/common/chain.wgsl runs the kernels in
//! turn, a phase each, with as many workgroups as the driver has threads. The chain's
//! own bindings come first: its counters, its parameters, and the step's values, which
//! every member reads and which it binds once for all ([`STEP_DECL`]). Each distinct
//! chain is a pipeline to compile, so the runs are cut to need few of them ([`Shape`]):
//! on SmolLM2 a layer's attention, products and norms, up to the next layer's Q/K/V
//! product, are one chain, one pipeline for 29 layers (the last runs apart); on Gemma 3
//! a layer's attention, products and norms, its Q/K/V products apart, two pipelines
//! (its layers' two types of FFN down weights).
//!
//! Each member's module is changed on its way in ([`member_source`]):
//! - its read-only storage buffers are declared writable: wgpu allows a buffer one kind of
//!   use per dispatch, and members read what others write (single tokens therefore read
//!   their activations from storage where chains run, not as uniforms);
//! - its uniforms are read through an index the compiler cannot see
//!   (`wgsl_link::index_uniforms`). lavapipe 22.3 searches a pipeline's uniform loads of
//!   constant offset for values to inline, and on joined modules that search corrupted
//!   its heap in about a third of the runs; in storage instead, the kernels' parameters
//!   were loaded lane by lane and the chains ran slower than separate dispatches.
//!
//! Only kernels that say how many loop trips a workgroup of theirs takes join
//! ([`Chainable`]): on llvmpipe a workgroup may take 65535 in all, and a chain's
//! workgroup may take every item of every phase. Attention's trips grow with the cached
//! positions: it only leads a chain, as a phase the chain skips past the positions its
//! budget leaves, the step then running it apart just before ([`KvTrips`]). A step runs
//! the chains only where it runs each member with the grid the chain was built for and
//! nothing between them (single tokens); otherwise, or all chains or none (each chain
//! zeroes the counters of the one before), the members run as before. The pipelines
//! compile on a thread of their own while the first steps run without them.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use super::{Dispatch, Pipe, StepInfo};
use crate::gpu::pipelines::{Binding, Deferred};
use crate::gpu::{wgsl_link, GpuContext};
use crate::{Error, Result};

const CHAIN_WGSL: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/shaders/common/chain.wgsl"
));

/// What a kernel needs to join a chain: the most loop trips one of its workgroups takes,
/// and where they grow with the cached positions (attention), how.
#[derive(Clone, Copy, Debug)]
pub struct Chainable {
    pub trips: u32,
    pub kv: Option<KvTrips>,
}

impl Chainable {
    /// A kernel whose trips do not depend on the step.
    pub fn fixed(trips: u32) -> Chainable {
        Chainable { trips, kv: None }
    }
}

/// The loop trips of a kernel that walks the cached positions, beyond
/// [`Chainable::trips`]: `per_8` more per eight positions. Such a kernel only leads a
/// chain, as an optional first phase: a step whose positions exceed what the chain's
/// trip budget leaves ([`Run::kv_max`]), or `max_kv` (where its built grid stops
/// serving the step), runs it as a dispatch of its own before the chain, which then
/// skips that phase (`chain_items` in shaders/common/chain.wgsl).
#[derive(Clone, Copy, Debug)]
pub struct KvTrips {
    pub per_8: u32,
    pub max_kv: u32,
}

/// Fewest cached positions a chain with an optional first phase must serve, or the
/// kernel does not join it.
const KV_MIN: u32 = 256;

/// Phases a chain may hold (`ChainParams::grid` in shaders/common/chain.wgsl).
const MAX_PHASES: usize = 8;

/// Loop trips a workgroup may take on llvmpipe (its loop limiter).
const TRIP_BUDGET: u64 = 65_535;

/// Trips the chain's own loops may take per item (its claim loop) and per phase.
const TRIPS_PER_ITEM: u64 = 2;
const TRIPS_PER_PHASE: u64 = 8;

/// Count reads per wait: at least the fewest (a run whose work leaves less is cut
/// shorter), at most the most (a thread the system has put aside for longer than that
/// many reads is left to finish the chain alone).
const MIN_SPIN: u64 = 256;
const MAX_SPIN: u64 = 4096;

/// The single-token step the chains are built for (a position past the first, so that
/// the kernels that only a first position runs are not among them).
fn probe_step() -> StepInfo {
    StepInfo::new(1, 1)
}

/// One chain: the plan's dispatches `members` (in `range`, whose others are idle in
/// single-token steps), joined.
struct Chain {
    range: Range<usize>,
    members: Vec<usize>,
    grids: Vec<[u32; 3]>,
    /// The most cached positions at which its first phase runs in it, where that phase
    /// is optional ([`KvTrips`]); past them the step records it apart, before the chain.
    kv_max: Option<u32>,
    /// Its pipeline: an index into [`Chains::builds`].
    build: usize,
    /// The members' resources, bound again as the chain lays them out ([`writable`]),
    /// and the chain's own.
    bind_group: wgpu::BindGroup,
}

impl Chain {
    /// Whether `step` skips its optional first phase: more cached positions than the
    /// phase runs in the chain for (`chain_items` in shaders/common/chain.wgsl tells
    /// the same from the step's values).
    fn skips_lead(&self, step: &StepInfo) -> bool {
        self.kv_max.is_some_and(|m| step.n_kv > m)
    }

    /// The part of its range that `step` records apart, before the chain: up to its
    /// second member where it skips the first phase, else none.
    fn lead_apart(&self, step: &StepInfo) -> Range<usize> {
        match (self.skips_lead(step), self.members.get(1)) {
            (true, Some(&second)) => self.range.start..second,
            _ => self.range.start..self.range.start,
        }
    }
}

/// The chains of one plan.
pub struct Chains {
    chains: Vec<Chain>,
    /// Workgroups per chain: the driver's threads.
    workgroups: u32,
    /// The chains' distinct pipelines, compiled on a thread of their own
    /// ([`Chains::start`]): set once all are, or once one fails.
    builds: Arc<OnceLock<std::result::Result<Vec<Arc<wgpu::ComputePipeline>>, String>>>,
    /// What that thread compiles, until it starts.
    pending: Mutex<Option<(wgpu::Device, Vec<Build>)>>,
    /// That thread, once started and until joined ([`Chains::wait`]).
    compiling: Mutex<Option<JoinHandle<()>>>,
    /// Steps recorded with the chains so far.
    steps: std::sync::atomic::AtomicUsize,
    /// Their distinct pipelines' count.
    n_builds: usize,
}

/// What compiles one of a plan's chain pipelines, on the compiling thread.
struct Build {
    label: String,
    source: String,
    constants: Vec<(String, f64)>,
    layout: wgpu::BindGroupLayout,
}

/// `ChainParams` in shaders/common/chain.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct ChainParams {
    base: u32,
    clear: u32,
    clear_n: u32,
    spin: u32,
    kv_max: u32,
    left: u32,
    kv_8: u32,
    phases: u32,
    zero: [u32; 4],
    grid: [[u32; 4]; MAX_PHASES],
}

/// A run of the plan that may become a chain.
#[derive(Clone)]
struct Run {
    range: Range<usize>,
    members: Vec<usize>,
    grids: Vec<[u32; 3]>,
    /// The most loop trips one workgroup could take doing all of it, its first phase's
    /// trips per cached position apart ([`Run::kv`]).
    work: u64,
    /// The bindings of its members and of the chain's own group.
    bindings: Bindings,
    /// Where its first phase walks the cached positions: that phase's items and their
    /// trips ([`KvTrips`]).
    kv: Option<(u64, KvTrips)>,
}

/// Bindings of a stage by kind, to keep a chain within the device's limits per stage.
#[derive(Clone, Copy, Debug, Default)]
struct Bindings {
    uniform: u32,
    storage: u32,
    textures: u32,
}

impl Bindings {
    /// The chain's own group: its counters, its parameters and the members' step.
    const CHAIN: Bindings = Bindings {
        uniform: 1,
        storage: 2,
        textures: 0,
    };

    fn of(layout: &[Binding]) -> Bindings {
        let count = |f: fn(&Binding) -> bool| layout.iter().filter(|b| f(b)).count() as u32;
        Bindings {
            uniform: count(|b| *b == Binding::Uniform),
            storage: count(|b| matches!(b, Binding::Read | Binding::ReadWrite)),
            textures: count(|b| matches!(b, Binding::Texture | Binding::TextureWrite)),
        }
    }

    fn add(self, o: Bindings) -> Bindings {
        Bindings {
            uniform: self.uniform + o.uniform,
            storage: self.storage + o.storage,
            textures: self.textures + o.textures,
        }
    }

    fn fits(self, ctx: &GpuContext) -> bool {
        let l = &ctx.limits;
        self.uniform <= l.max_uniform_buffers_per_shader_stage
            && self.storage <= l.max_storage_buffers_per_shader_stage
            && self.textures <= l.max_storage_textures_per_shader_stage
    }
}

impl Run {
    /// Trips its first phase adds at `n_kv` cached positions, all its items taken by
    /// one workgroup (`chain_spin` in shaders/common/chain.wgsl counts them each step).
    #[cfg(test)]
    fn kv_work(&self, n_kv: u32) -> u64 {
        self.kv.map_or(0, |(items, k)| {
            items * u64::from(k.per_8) * u64::from(n_kv.div_ceil(8))
        })
    }

    /// This run with dispatch `i` (of `grid`, `work` trips and `bindings`) after it.
    fn then(&self, i: usize, grid: [u32; 3], work: u64, bindings: Bindings) -> Run {
        let mut r = self.clone();
        r.range.end = i + 1;
        r.members.push(i);
        r.grids.push(grid);
        r.work += work;
        r.bindings = r.bindings.add(bindings);
        r
    }

    /// Whether it makes a chain within the device's limits and `cap` phases: bindings,
    /// and a trip budget that leaves every wait its fewest reads and an optional first
    /// phase at least [`KV_MIN`] positions.
    fn fits(&self, ctx: &GpuContext, cap: usize) -> bool {
        let phases = self.members.len() as u64;
        self.members.len() <= cap.min(MAX_PHASES)
            && self.bindings.fits(ctx)
            && self.fixed() + phases * MIN_SPIN <= TRIP_BUDGET
            && self.kv_max().is_none_or(|n| n >= KV_MIN)
    }

    /// Trips it may take before its waits: its work and the chain's own loops.
    fn fixed(&self) -> u64 {
        self.work + self.members.len() as u64 * TRIPS_PER_PHASE + 64
    }

    /// The most cached positions at which its optional first phase runs in it: what the
    /// budget leaves after the rest and the fewest waits, up to the kernel's own
    /// `max_kv`. `None` where it has no such phase.
    fn kv_max(&self) -> Option<u32> {
        let (items, k) = self.kv?;
        let phases = self.members.len() as u64;
        let left = TRIP_BUDGET.saturating_sub(self.fixed() + phases * MIN_SPIN);
        let eighths = left / (items * u64::from(k.per_8)).max(1);
        Some(u32::try_from(eighths * 8).unwrap_or(u32::MAX).min(k.max_kv))
    }

    #[cfg(test)]
    /// Reads a wait may take at `n_kv` cached positions: what the budget leaves after
    /// its work there, shared among its phases (`chain_spin` in
    /// shaders/common/chain.wgsl computes the same each step).
    fn spin(&self, n_kv: u32) -> u64 {
        let phases = self.members.len() as u64;
        let kv = match self.kv_max() {
            Some(m) if n_kv <= m => self.kv_work(n_kv),
            _ => 0,
        };
        let left = TRIP_BUDGET.saturating_sub(self.fixed() + kv);
        (left / phases.max(1)).min(MAX_SPIN)
    }
}

/// How every kernel declares the step's values (common/step.wgsl) at its binding 0. A
/// chain binds them once for all its members, at its binding 2: lavapipe allows a
/// stage 15 uniforms, and Gemma 3's layers run seven products and norms of two or
/// three each.
const STEP_DECL: &str = "@group(0) @binding(0) var<uniform> step: Step;";

/// The same after [`wgsl_link::index_uniforms`], the line a member's source loses.
const STEP_DECL_INDEXED: &str = "@group(0) @binding(0) var<uniform> step: array<Step, 1>;";

/// The pipeline a chain member runs, if it can join one: a chainable kernel that binds
/// every resource this keeps, the step first.
fn deferred(d: &Dispatch) -> Option<&Arc<Deferred>> {
    match (&d.pipeline, d.chainable) {
        (Pipe::Deferred(p), Some(_))
            if d.resources.len() == p.bindings().len()
                && p.bindings().first() == Some(&Binding::Uniform)
                && p.source().contains(STEP_DECL) =>
        {
            Some(p)
        }
        _ => None,
    }
}

/// The buffer a member binds as the step's values (its binding 0, [`STEP_DECL`]).
fn step_of(d: &Dispatch) -> Option<(&wgpu::Buffer, u64, Option<wgpu::BufferSize>)> {
    match d.resources.first() {
        Some(super::Held::Buffer {
            buffer,
            offset,
            size,
        }) => Some((buffer, *offset, *size)),
        _ => None,
    }
}

/// A member's layout in a chain: its storage buffers writable. wgpu allows a buffer
/// one kind of use per dispatch, and a chain's members read buffers that others write.
fn writable(layout: &[Binding]) -> Vec<Binding> {
    layout
        .iter()
        .map(|b| match b {
            Binding::Read => Binding::ReadWrite,
            b => *b,
        })
        .collect()
}

/// A member's source in a chain: its storage buffers declared writable ([`writable`]),
/// its uniforms read through `chain_zero` (see the module's notes), and its step's
/// declaration left to the chain's ([`STEP_DECL`]).
fn member_source(d: &Deferred) -> Result<String> {
    let src = d
        .source()
        .replace("var<storage, read>", "var<storage, read_write>");
    let src = wgsl_link::index_uniforms(&src, "chain_zero");
    if !src.contains(STEP_DECL_INDEXED) {
        return Err(Error::gpu(format!(
            "chain: {} does not declare the step as {STEP_DECL}",
            d.label()
        )));
    }
    Ok(src.replacen(STEP_DECL_INDEXED, "", 1))
}

/// The runs of `plan` that single-token steps could run as chains, each of at most
/// `cap` members.
fn runs(ctx: &GpuContext, plan: &[Dispatch], cap: usize) -> Vec<Run> {
    let step = probe_step();
    let mut out = Vec::new();
    let mut cur: Option<Run> = None;
    let close = |cur: &mut Option<Run>, out: &mut Vec<Run>| {
        if let Some(r) = cur.take().filter(|r| r.members.len() >= 2) {
            out.push(r);
        }
    };
    for (i, d) in plan.iter().enumerate() {
        let grid = d.grid(&step);
        // Idle in single-token steps (a batch's kernel): no break in a run.
        if grid.contains(&0) {
            continue;
        }
        let joins = deferred(d).zip(d.chainable).filter(|_| !d.copies_in(&step));
        let Some((pipe, c)) = joins else {
            close(&mut cur, &mut out);
            continue;
        };
        let items = u64::from(grid[0]) * u64::from(grid[1]) * u64::from(grid[2]);
        let work = items * (u64::from(c.trips) + TRIPS_PER_ITEM);
        // Binding 0, the step, is the chain's ([`STEP_DECL`]).
        let bindings = Bindings::of(&writable(&pipe.bindings()[1..]));
        // A kernel that walks the cached positions only leads a run; a run grows while
        // it fits the budget and the stage's bindings and its members share the step.
        let step_buf = step_of(d);
        let grown = cur
            .as_ref()
            .filter(|r| c.kv.is_none() && step_of(&plan[r.members[0]]) == step_buf)
            .map(|r| r.then(i, grid, work, bindings))
            .filter(|r| r.fits(ctx, cap));
        if grown.is_some() {
            cur = grown;
            continue;
        }
        close(&mut cur, &mut out);
        let lead = Run {
            range: i..i + 1,
            members: vec![i],
            grids: vec![grid],
            work,
            bindings: Bindings::CHAIN.add(bindings),
            kv: c.kv.map(|k| (items, k)),
        };
        cur = Some(lead).filter(|r| r.fits(ctx, cap));
    }
    close(&mut cur, &mut out);
    out
}

/// What tells two runs' pipelines apart: their members' kernels and constants.
fn build_key(members: &[&Arc<Deferred>]) -> String {
    let key: Vec<String> = members
        .iter()
        .map(|d| format!("{}{:?}", d.label(), d.constants()))
        .collect();
    key.join("|")
}

/// The members of `run` that join a chain.
fn run_members<'a>(plan: &'a [Dispatch], run: &Run) -> Vec<&'a Arc<Deferred>> {
    run.members
        .iter()
        .filter_map(|&m| deferred(&plan[m]))
        .collect()
}

/// A way to cut a plan into chains: its runs, once a cap on their length has cut them
/// and the builds that do not repay their compilation are left out ([`Shape::of`]),
/// the dispatches they spare a single token, and the WGSL their distinct builds
/// compile.
///
/// Each distinct build is a pipeline to compile, and lavapipe takes 0.2-0.4 s of a
/// core for one of Gemma 3's, about twice what its members take apart; meanwhile the
/// first single tokens run without chains, on the cores the compiler shares
/// (docs/perf.md). Gemma 3's mix of weight types made the longest runs six builds (2.1
/// s) where runs of six members need two that repay (0.5 s), and spare 90 dispatches a
/// token against 108.
struct Shape {
    /// The runs, each with its build's key ([`build_key`]).
    runs: Vec<(Run, String)>,
    saved: usize,
    source_bytes: usize,
}

/// WGSL a build may compile per dispatch it spares a single token, its members'
/// sources counted: it must repay its compilation within a few hundred tokens. On
/// lavapipe a chain takes about 2 us of a core per byte of its members' WGSL (twice
/// what they take apart: 0.23 s for Gemma 3's layer of 115 KB) and a dispatch it spares
/// saves about 30 us a token (Gemma 3's chains sparing 108 dispatches saved 4.7 ms a
/// token), so 4 KiB a dispatch repays within about 270 tokens. It leaves out
/// SmolLM2's last layer (3 dispatches, 110 KB) and Gemma 3's Q/K/V pairs (9 dispatches,
/// 76 KB, 1% of a token).
const SOURCE_PER_SPARED: usize = 4096;

/// For each of the runs whose builds are `keys` and which spare `spared` dispatches
/// each, whether its build repays its compilation ([`SOURCE_PER_SPARED`]): all the
/// dispatches its runs spare against its members' `source` bytes.
fn repaid(keys: &[String], spared: &[usize], source: &[usize]) -> Vec<bool> {
    let mut by_build: HashMap<&str, (usize, usize)> = HashMap::new();
    for ((k, &n), &bytes) in keys.iter().zip(spared).zip(source) {
        let e = by_build.entry(k.as_str()).or_insert((0, bytes));
        e.0 += n;
    }
    keys.iter()
        .map(|k| {
            let (n, bytes) = by_build[k.as_str()];
            n * SOURCE_PER_SPARED >= bytes
        })
        .collect()
}

/// Of the caps, the one whose builds compile the least WGSL among those that spare at
/// least this share of the most dispatches any cap spares.
const SAVED_SHARE: (usize, usize) = (9, 10);

impl Shape {
    /// The runs of `plan` with at most `cap` members, less those whose builds do not
    /// repay their compilation ([`SOURCE_PER_SPARED`]); none where fewer than two are
    /// left.
    fn of(ctx: &GpuContext, plan: &[Dispatch], cap: usize) -> Shape {
        let all = runs(ctx, plan, cap);
        let members: Vec<Vec<&Arc<Deferred>>> = all.iter().map(|r| run_members(plan, r)).collect();
        let keys: Vec<String> = members.iter().map(|m| build_key(m)).collect();
        let spared: Vec<usize> = all.iter().map(|r| r.members.len() - 1).collect();
        let source: Vec<usize> = members
            .iter()
            .map(|m| m.iter().map(|d| d.source().len()).sum())
            .collect();
        let repays = repaid(&keys, &spared, &source);
        let mut shape = Shape::none();
        let mut counted = std::collections::HashSet::new();
        for (i, r) in all.into_iter().enumerate().filter(|&(i, _)| repays[i]) {
            if counted.insert(keys[i].as_str()) {
                shape.source_bytes += source[i];
            }
            shape.saved += spared[i];
            shape.runs.push((r, keys[i].clone()));
        }
        match shape.runs.len() {
            0 | 1 => Shape::none(),
            _ => shape,
        }
    }

    /// No chains.
    fn none() -> Shape {
        Shape {
            runs: Vec::new(),
            saved: 0,
            source_bytes: 0,
        }
    }

    /// The runs to build chains from: of every cap's shape, among those that spare at
    /// least [`SAVED_SHARE`] of the most dispatches, the one with the least WGSL to
    /// compile (the one sparing more where two tie); each run with its build's key.
    fn choose(ctx: &GpuContext, plan: &[Dispatch]) -> Vec<(Run, String)> {
        let shapes: Vec<Shape> = (2..=MAX_PHASES)
            .map(|cap| Shape::of(ctx, plan, cap))
            .collect();
        Shape::pick(shapes).runs
    }

    /// [`Shape::choose`]'s pick among `shapes`.
    fn pick(shapes: Vec<Shape>) -> Shape {
        let most = shapes.iter().map(|s| s.saved).max().unwrap_or(0);
        let (num, den) = SAVED_SHARE;
        shapes
            .into_iter()
            .filter(|s| s.saved > 0 && s.saved * den >= most * num)
            .min_by_key(|s| (s.source_bytes, std::cmp::Reverse(s.saved)))
            .unwrap_or_else(Shape::none)
    }
}

impl Chains {
    /// The chains of `plan`, where the context runs chains and the plan has at least
    /// two runs to join (each chain zeroes the counters of the one before, the first
    /// those of the last).
    pub fn link(ctx: &GpuContext, plan: &[Dispatch]) -> Result<Option<Chains>> {
        if !ctx.chains() {
            return Ok(None);
        }
        let (runs, keys): (Vec<Run>, Vec<String>) = Shape::choose(ctx, plan).into_iter().unzip();
        if runs.len() < 2 {
            return Ok(None);
        }
        let counters: u64 = runs.iter().map(|r| 2 * r.members.len() as u64).sum();
        let counts = crate::gpu::upload::storage(ctx, "chain counters", 4 * counters.max(1))?;
        // Builds and their layouts by members: every layer's chain shares one.
        let mut made: HashMap<String, (usize, wgpu::BindGroupLayout)> = HashMap::new();
        let mut builds: Vec<Build> = Vec::new();
        let mut bases = Vec::with_capacity(runs.len());
        let mut at = 0u32;
        for r in &runs {
            bases.push(at);
            at += 2 * r.members.len() as u32;
        }
        let mut chains = Vec::with_capacity(runs.len());
        for (c, r) in runs.iter().enumerate() {
            let members = run_members(plan, r);
            let (build, layout) = match made.get(&keys[c]) {
                Some(m) => m.clone(),
                None => {
                    let b = build(ctx, &members)?;
                    let m = (builds.len(), b.layout.clone());
                    builds.push(b);
                    made.insert(keys[c].clone(), m.clone());
                    m
                }
            };
            let prev = (c + runs.len() - 1) % runs.len();
            let mut params = ChainParams {
                base: bases[c],
                clear: bases[prev],
                clear_n: 2 * runs[prev].members.len() as u32,
                spin: MAX_SPIN as u32,
                kv_max: r.kv_max().unwrap_or(u32::MAX),
                left: u32::try_from(TRIP_BUDGET.saturating_sub(r.fixed())).unwrap_or(0),
                kv_8: r.kv.map_or(0, |(items, k)| items as u32 * k.per_8),
                phases: r.members.len() as u32,
                zero: [0; 4],
                grid: [[0; 4]; MAX_PHASES],
            };
            for (k, g) in r.grids.iter().enumerate() {
                params.grid[k] = [g[0], g[1], g[2], g[0] * g[1] * g[2]];
            }
            let params_buf = crate::gpu::upload::storage_init(
                ctx,
                "chain params",
                std::slice::from_ref(&params),
            );
            let mut entries = Vec::new();
            let member_at = member_bases(&members);
            for (k, &m) in r.members.iter().enumerate() {
                for (b, h) in (0u32..).zip(&plan[m].resources).skip(1) {
                    entries.push(wgpu::BindGroupEntry {
                        binding: member_at[k] + b,
                        resource: h.resource(),
                    });
                }
            }
            // Every member binds the same step (`runs`): the first's, once.
            let step = plan[r.members[0]].resources.first();
            let step = step.ok_or_else(|| Error::gpu("chain: a member binds no step"))?;
            entries.push(wgpu::BindGroupEntry {
                binding: 2,
                resource: step.resource(),
            });
            entries.push(wgpu::BindGroupEntry {
                binding: 0,
                resource: counts.as_entire_binding(),
            });
            entries.push(wgpu::BindGroupEntry {
                binding: 1,
                resource: params_buf.as_entire_binding(),
            });
            let bind_group = ctx.scoped("binding a chain", || {
                ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("chain"),
                    layout: &layout,
                    entries: &entries,
                })
            })?;
            chains.push(Chain {
                range: r.range.clone(),
                members: r.members.clone(),
                grids: r.grids.clone(),
                kv_max: r.kv_max(),
                build,
                bind_group,
            });
        }
        Ok(Some(Chains {
            chains,
            n_builds: builds.len(),
            workgroups: crate::gpu::context::driver_threads(),
            builds: Arc::new(OnceLock::new()),
            pending: Mutex::new(Some((ctx.device.clone(), builds))),
            compiling: Mutex::new(None),
            steps: Default::default(),
        }))
    }

    /// Starts compiling the chains' pipelines on a thread of their own, if not yet
    /// started. Single-token steps start it: on lavapipe it takes about 0.5 s of a core
    /// for SmolLM2's pipeline or Gemma 3's two ([`Shape`], docs/perf.md), which a
    /// prompt's batch, run first, would share its cores with.
    fn start(&self) -> Result<()> {
        let poisoned = || Error::gpu("chains: their compilation's state poisoned");
        let Some((device, builds)) = self.pending.lock().map_err(|_| poisoned())?.take() else {
            return Ok(());
        };
        let handle = compile_apart(device, builds, self.builds.clone())?;
        *self.compiling.lock().map_err(|_| poisoned())? = Some(handle);
        Ok(())
    }

    /// The chains' pipelines, once compiled; `None` while they are being compiled.
    fn pipelines(&self) -> Result<Option<&[Arc<wgpu::ComputePipeline>]>> {
        match self.builds.get() {
            None => Ok(None),
            Some(Ok(p)) => Ok(Some(p)),
            Some(Err(e)) => Err(Error::gpu(format!("chains: {e}"))),
        }
    }

    /// The fewest and the most cached positions up to which a chain runs its optional
    /// first phase (attention, [`KvTrips`]); `None` where no chain has one.
    pub fn kv_limits(&self) -> Option<(u32, u32)> {
        let limits = self.chains.iter().filter_map(|c| c.kv_max);
        Some((limits.clone().min()?, limits.max()?))
    }

    /// Steps recorded with the chains so far (the others ran each member apart).
    pub fn steps(&self) -> usize {
        self.steps.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until the chains' pipelines are compiled (starting their compilation if no
    /// single token has), and says whether they were (their compilation's error if
    /// not). Steps before then run without chains.
    pub fn wait(&self) -> Result<()> {
        self.start()?;
        let handle = self
            .compiling
            .lock()
            .map_err(|_| Error::gpu("chains: compiling thread's handle poisoned"))?
            .take();
        if let Some(h) = handle {
            h.join()
                .map_err(|_| Error::gpu("chains: the compiling thread panicked"))?;
        }
        match self.pipelines()? {
            Some(_) => Ok(()),
            None => Err(Error::gpu(
                "chains: compiling thread ended without a result",
            )),
        }
    }

    /// The chains' distinct pipelines, each compiled once ([`Shape`]).
    pub fn builds(&self) -> usize {
        self.n_builds
    }

    /// Dispatches the chains spare a single-token step (their members less one each).
    pub fn saved(&self) -> usize {
        self.chains.iter().map(|c| c.members.len() - 1).sum()
    }

    /// Whether `step` runs the chains: every member with the grid its chain was built
    /// for, and nothing else in a chain's range; but where a chain's optional first
    /// phase is skipped ([`Chain::skips_lead`]), whatever its range holds before the
    /// second member, recorded apart.
    fn run_in(&self, plan: &[Dispatch], step: &StepInfo) -> bool {
        step.n_tokens == 1
            && self.chains.iter().all(|c| {
                let apart = c.lead_apart(step);
                c.range.clone().all(|i| {
                    let d = &plan[i];
                    let member = c.members.iter().position(|&m| m == i);
                    let grid = d.grid(step);
                    apart.contains(&i)
                        || !d.copies_in(step)
                            && match member {
                                Some(k) => grid == c.grids[k],
                                None => grid.contains(&0),
                            }
                })
            })
    }
}

/// The module of a chain of `members`: each joined, then the driver and its entry point.
fn chain_source(members: &[&Arc<Deferred>]) -> Result<(String, Vec<(String, f64)>)> {
    let bases = member_bases(members);
    let mut directives: Vec<String> = Vec::new();
    let mut bodies = String::new();
    let mut constants = Vec::new();
    let mut calls = String::new();
    let mut lanes: Option<f64> = None;
    let mut ws0 = String::new();
    for (k, d) in members.iter().enumerate() {
        let linked = wgsl_link::link(&member_source(d)?, k, bases[k])?;
        for dir in &linked.directives {
            if !directives.contains(dir) {
                directives.push(dir.clone());
            }
        }
        bodies.push_str(&linked.body);
        bodies.push('\n');
        for (name, v) in d.constants() {
            let Some((_, renamed)) = linked.overrides.iter().find(|(o, _)| o == name) else {
                return Err(Error::gpu(format!(
                    "chain: {} sets {name}, which it does not declare",
                    d.label()
                )));
            };
            constants.push((renamed.clone(), *v));
        }
        // Every phase runs on the chain's workgroups: their sizes must agree.
        let size = constants
            .iter()
            .find(|(c, _)| *c == linked.workgroup_size)
            .map(|(_, v)| *v)
            .or_else(|| {
                linked
                    .workgroup_size
                    .trim_end_matches('u')
                    .parse::<f64>()
                    .ok()
            });
        match (size, lanes) {
            (None, _) => {
                return Err(Error::gpu(format!(
                    "chain: {}'s workgroup size {} is not a constant",
                    d.label(),
                    linked.workgroup_size
                )))
            }
            (Some(s), Some(l)) if s != l => {
                return Err(Error::gpu(format!(
                    "chain: {} has {s} lanes a workgroup, the chain {l}",
                    d.label()
                )))
            }
            (Some(s), _) => lanes = Some(s),
        }
        if k == 0 {
            ws0 = linked.workgroup_size.clone();
        }
        calls.push_str(&phase_call(k, &linked)?);
    }
    let mut src = directives.join("\n");
    src.push('\n');
    src.push_str(&bodies);
    src.push_str(CHAIN_WGSL);
    // The subgroup builtins only where a phase takes them (they need the feature).
    let mut params = vec![
        "@builtin(local_invocation_index) chain_l: u32",
        "@builtin(local_invocation_id) chain_lid: vec3<u32>",
    ];
    if calls.contains("chain_sid") {
        params.push("@builtin(subgroup_invocation_id) chain_sid: u32");
    }
    if calls.contains("chain_ssz") {
        params.push("@builtin(subgroup_size) chain_ssz: u32");
    }
    src.push_str(&format!(
        "\n@compute @workgroup_size({ws0})\nfn main({}) {{\n    chain_zero = subgroupBroadcastFirst(chain.zero.x);\n{calls}}}\n",
        params.join(", ")
    ));
    Ok((src, constants))
}

/// The entry point's part for phase `k`: wait for the phase before, then take items
/// until none is left, each a call of the kernel's lifted entry point.
fn phase_call(k: usize, linked: &wgsl_link::Linked) -> Result<String> {
    let args: Vec<String> = linked
        .builtins
        .iter()
        .map(|b| {
            Ok(match b.as_str() {
                "workgroup_id" => format!("chain_wid({k}u, i)"),
                "num_workgroups" => format!("chain.grid[{k}].xyz"),
                "local_invocation_index" => "chain_l".to_string(),
                "local_invocation_id" => "chain_lid".to_string(),
                "global_invocation_id" => format!(
                    "chain_wid({k}u, i) * vec3<u32>(u32({}), 1u, 1u) + chain_lid",
                    linked.workgroup_size
                ),
                "subgroup_invocation_id" => "chain_sid".to_string(),
                "subgroup_size" => "chain_ssz".to_string(),
                other => {
                    return Err(Error::gpu(format!(
                        "chain: a kernel takes the builtin {other}"
                    )))
                }
            })
        })
        .collect::<Result<_>>()?;
    let wait = if k == 0 {
        String::new()
    } else {
        format!("    if (!chain_ready({k}u, chain_l)) {{\n        return;\n    }}\n")
    };
    // The first phase that has items zeroes the chain before's counters: the first, or
    // the second where the first is skipped.
    let clear = if k <= 1 {
        format!("        if (i == 0u && chain_first() == {k}u) {{\n            chain_clear(chain_l);\n        }}\n")
    } else {
        String::new()
    };
    Ok(format!(
        "{wait}    loop {{\n        let i = chain_claim({k}u, chain_l);\n        if (i >= chain_items({k}u)) {{\n            break;\n        }}\n{clear}        {}({});\n        chain_done({k}u, chain_l);\n    }}\n",
        linked.entry,
        args.join(", ")
    ))
}

/// What compiles the pipeline of a chain of `members`, and its one group's layout: the
/// chain's counters and parameters at 0 and 1, then each member's bindings
/// ([`member_bases`]).
fn build(ctx: &GpuContext, members: &[&Arc<Deferred>]) -> Result<Build> {
    let (source, constants) = chain_source(members)?;
    let mut entries = Vec::new();
    let bases = member_bases(members);
    for (k, d) in members.iter().enumerate() {
        for (b, kind) in (0u32..).zip(writable(d.bindings())).skip(1) {
            entries.push(kind.entry(bases[k] + b));
        }
    }
    entries.push(Binding::ReadWrite.entry(0));
    entries.push(Binding::ReadWrite.entry(1));
    entries.push(Binding::Uniform.entry(2));
    let labels: Vec<&str> = members.iter().map(|d| d.label()).collect();
    let label = format!("chain {}", labels.join(" + "));
    let layout = ctx
        .device
        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(&label),
            entries: &entries,
        });
    Ok(Build {
        label,
        source,
        constants,
        layout,
    })
}

/// Compiles `builds` on a thread of its own and sets `made` when done. The load once
/// waited for it; now the first single tokens run meanwhile, without chains.
fn compile_apart(
    device: wgpu::Device,
    builds: Vec<Build>,
    made: Arc<OnceLock<std::result::Result<Vec<Arc<wgpu::ComputePipeline>>, String>>>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("chain pipelines".into())
        .spawn(move || {
            let compiled = builds
                .iter()
                .map(|b| {
                    let constants: Vec<(&str, f64)> =
                        b.constants.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                    let p = crate::gpu::pipelines::compile(
                        &device,
                        &b.label,
                        &constants,
                        Some(&b.layout),
                        &b.source,
                    );
                    p.map(Arc::new).map_err(|e| e.to_string())
                })
                .collect();
            let _ = made.set(compiled);
            release_compiler_memory();
        })
        .map_err(|e| {
            Error::gpu(format!(
                "chains: cannot start a thread to compile them: {e}"
            ))
        })
}

/// Hands the heap's free memory back to the system. llvmpipe's compiler leaves about
/// 46 MiB free in this thread's malloc arena after SmolLM2's chains, which would
/// otherwise stay resident for the whole run (docs/perf.md).
fn release_compiler_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: glibc's `malloc_trim` only returns free heap pages; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Each member's binding base: its binding b (b >= 1; its step, binding 0, is the
/// chain's) lands at base + b. The chain's own three come first (counters, parameters,
/// step), then one member after another.
fn member_bases(members: &[&Arc<Deferred>]) -> Vec<u32> {
    let mut at = 3;
    members
        .iter()
        .map(|d| {
            let base = at - 1;
            at += d.bindings().len().saturating_sub(1) as u32;
            base
        })
        .collect()
}

/// [`super::record_plan`], with the chains of `plan` in one dispatch each where `step`
/// runs them ([`Chains::run_in`]).
pub fn record_plan(
    enc: &mut wgpu::CommandEncoder,
    plan: &[Dispatch],
    chains: &Chains,
    step: &StepInfo,
) -> Result<()> {
    if step.n_tokens == 1 {
        chains.start()?;
    }
    let pipelines = match chains.pipelines()? {
        Some(p) if chains.run_in(plan, step) => p,
        _ => return super::record_plan(enc, plan, step),
    };
    chains
        .steps
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut passes = super::StepPasses::begin(enc);
    let mut next = chains.chains.iter().peekable();
    let mut i = 0;
    while i < plan.len() {
        // A chain dispatches after what its range records apart (`Chain::lead_apart`),
        // which the loop records as any other dispatch.
        if let Some(c) = next.next_if(|c| c.lead_apart(step).end == i) {
            let pass = passes.pass(enc);
            pass.set_pipeline(&pipelines[c.build]);
            pass.set_bind_group(0, &c.bind_group, &[]);
            pass.dispatch_workgroups(chains.workgroups, 1, 1);
            i = c.range.end;
            continue;
        }
        passes.record(enc, &plan[i], step)?;
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_leaves_its_waits_the_trips_its_work_does_not_take() {
        let run = |work, phases: usize| Run {
            range: 0..phases,
            members: (0..phases).collect(),
            grids: vec![[1, 1, 1]; phases],
            work,
            bindings: Bindings::CHAIN,
            kv: None,
        };
        assert_eq!(run(1000, 4).spin(0), MAX_SPIN);
        let tight = run(60_000, 4);
        assert_eq!(
            tight.spin(0),
            (TRIP_BUDGET - 60_000 - 4 * TRIPS_PER_PHASE - 64) / 4
        );
        assert!(tight.spin(0) >= MIN_SPIN);
        assert_eq!(run(70_000, 2).spin(0), 0);
    }

    #[test]
    fn builds_that_spare_too_little_for_their_source_are_left_out() {
        let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        // SmolLM2: 29 layers alike (4 dispatches each, 152 KB) and a last one apart (3,
        // 110 KB).
        let mut smollm2 = vec!["layer"; 29];
        smollm2.push("last");
        let mut spared = vec![4; 29];
        spared.push(3);
        let mut source = vec![152_000; 29];
        source.push(110_000);
        let kept = repaid(&keys(&smollm2), &spared, &source);
        assert!(kept[..29].iter().all(|&k| k));
        assert!(!kept[29]);
        // Gemma 3: two layer builds of 9 runs (5 dispatches each, 115 KB) kept, the
        // Q/K/V pairs (9 runs of 1, 76 KB) not.
        let gemma = [vec!["q4"; 9], vec!["q6"; 9], vec!["qkv"; 9]].concat();
        let spared = [vec![5; 18], vec![1; 9]].concat();
        let source = [vec![115_000; 18], vec![76_000; 9]].concat();
        let kept = repaid(&keys(&gemma), &spared, &source);
        assert!(kept[..18].iter().all(|&k| k));
        assert!(kept[18..].iter().all(|&k| !k));
        // At the bound, kept.
        assert_eq!(
            repaid(&keys(&["a", "a"]), &[2, 2], &[4 * SOURCE_PER_SPARED; 2]),
            [true, true]
        );
        assert_eq!(
            repaid(&keys(&["a", "a"]), &[2, 2], &[4 * SOURCE_PER_SPARED + 1; 2]),
            [false, false]
        );
    }

    #[test]
    fn the_shape_compiling_least_among_those_sparing_nearly_the_most_is_chosen() {
        let shape = |saved, source_bytes| Shape {
            runs: Vec::new(),
            saved,
            source_bytes,
        };
        // Three caps as Gemma 3's: the longest spares fewer once the builds that do
        // not repay are left out; the shortest compiles less but spares under nine
        // tenths of the middle one's.
        let picked = Shape::pick(vec![
            shape(81, 267_697),
            shape(99, 304_695),
            shape(60, 304_695),
        ]);
        assert_eq!((picked.saved, picked.source_bytes), (99, 304_695));
        // Within the share, less to compile wins; where that ties, more spared.
        let picked = Shape::pick(vec![shape(100, 300), shape(91, 200), shape(95, 200)]);
        assert_eq!((picked.saved, picked.source_bytes), (95, 200));
        // Nothing spared: no chains.
        assert_eq!(Shape::pick(vec![shape(0, 0), shape(0, 0)]).saved, 0);
    }

    #[test]
    fn a_run_led_by_attention_keeps_its_waits_within_the_budget_up_to_its_limit() {
        let run = |max_kv| Run {
            range: 0..5,
            members: (0..5).collect(),
            grids: vec![[3, 1, 1]; 5],
            work: 30_000,
            bindings: Bindings::CHAIN,
            kv: Some((3, KvTrips { per_8: 37, max_kv })),
        };
        let r = run(4096);
        let limit = r.kv_max().unwrap();
        assert!((KV_MIN..4096).contains(&limit));
        // At the limit every wait still gets its fewest reads, and the work and the
        // waits stay within the budget; one position past it, the phase runs apart.
        assert!(r.spin(limit) >= MIN_SPIN);
        assert!(r.fixed() + r.kv_work(limit) + 5 * r.spin(limit) <= TRIP_BUDGET);
        assert!(r.kv_work(limit + 8) + r.fixed() + 5 * MIN_SPIN > TRIP_BUDGET);
        assert!(r.spin(limit + 1) > r.spin(limit));
        // The kernel's own limit caps it.
        assert_eq!(run(1000).kv_max(), Some(1000));
    }
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::wgsl_mirror;

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::ChainParams, "common/chain.wgsl", "ChainParams", {
            base, clear, clear_n, spin, kv_max, left, kv_8, phases, zero, grid
        });
        wgsl_mirror!(super::super::StepInfo, "common/chain.wgsl", "ChainStep", {
            n_tokens,
            pos,
            n_kv,
        });
    }
}
