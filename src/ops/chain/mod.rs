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
//! Each member's module is changed on its way in (`member_source`, source.rs):
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

mod compile;
mod link;
mod record;
mod runs;
mod shape;
mod source;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use super::{Dispatch, Pipe, StepInfo};
use crate::gpu::pipelines::{Binding, Deferred};
use crate::gpu::{wgsl_link, GpuContext};
use crate::{Error, Result};

use compile::*;
pub use record::*;
use runs::*;
use shape::*;
use source::*;

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

/// How every kernel declares the step's values (common/step.wgsl) at its binding 0. A
/// chain binds them once for all its members, at its binding 2: lavapipe allows a
/// stage 15 uniforms, and Gemma 3's layers run seven products and norms of two or
/// three each.
const STEP_DECL: &str = "@group(0) @binding(0) var<uniform> step: Step;";

/// The same after [`wgsl_link::index_uniforms`], the line a member's source loses.
const STEP_DECL_INDEXED: &str = "@group(0) @binding(0) var<uniform> step: array<Step, 1>;";
