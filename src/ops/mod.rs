//! Compute ops. Each module holds one op: its parameter block (mirroring the WGSL
//! `Params` struct), a builder that binds it to buffers once and returns a [`Dispatch`],
//! and the plain CPU reference the kernel is tested against.
//!
//! Binding convention of every kernel: 0 = [`StepInfo`] uniform (per forward step),
//! 1 = the op's own `Params` uniform (fixed at build time), 2.. = storage buffers.

pub mod add;
pub mod argmax;
pub mod attention;
pub mod chain;
pub mod get_rows;
pub mod glu;
pub mod kv_store;
pub mod mul_mat;
pub mod rms_norm;
pub mod rope;
pub mod top_k;

use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::gpu::GpuContext;

/// Values that change per forward step, shared by every kernel (WGSL `Step`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StepInfo {
    /// Tokens in this batch.
    pub n_tokens: u32,
    /// Position of the batch's first token.
    pub pos: u32,
    /// Positions in the KV cache once this batch is stored (pos + n_tokens).
    pub n_kv: u32,
    pub _pad: u32,
}

impl StepInfo {
    pub fn new(pos: u32, n_tokens: u32) -> StepInfo {
        StepInfo {
            n_tokens,
            pos,
            n_kv: pos + n_tokens,
            _pad: 0,
        }
    }
}

/// What a kernel does with its output: replace it, or add to it (the residual stream,
/// saving a separate add and its dispatch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Store {
    Write,
    Add,
}

type GridFn = Box<dyn Fn(&StepInfo) -> [u32; 3] + Send + Sync>;
type BytesFn = Box<dyn Fn(&StepInfo) -> std::ops::Range<u64> + Send + Sync>;

/// One kernel bound to its buffers; recorded into a compute pass each step with a grid
/// computed from that step's sizes.
pub struct Dispatch {
    pub label: String,
    pipeline: Pipe,
    bind_group: wgpu::BindGroup,
    grid: GridFn,
    /// Buffers copied into the textures the kernel reads, before it runs.
    copies: Vec<TextureCopy>,
    /// Whether its single-token steps may run as a phase of a chain ([`chain`]).
    chainable: Option<chain::Chainable>,
    /// What its bind group holds, binding by binding, for a chain to bind again (with
    /// its storage buffers writable: `chain`). Kept only where the context runs chains,
    /// and empty where a binding is of a kind this does not keep.
    resources: Vec<Held>,
}

/// A binding's resource, held.
#[derive(Clone)]
pub(crate) enum Held {
    Buffer {
        buffer: wgpu::Buffer,
        offset: u64,
        size: Option<wgpu::BufferSize>,
    },
    View(wgpu::TextureView),
}

impl Held {
    /// `r` held, if it is a buffer or a texture view.
    fn of(r: &wgpu::BindingResource<'_>) -> Option<Held> {
        match r {
            wgpu::BindingResource::Buffer(b) => Some(Held::Buffer {
                buffer: b.buffer.clone(),
                offset: b.offset,
                size: b.size,
            }),
            wgpu::BindingResource::TextureView(v) => Some(Held::View((*v).clone())),
            _ => None,
        }
    }

    pub(crate) fn resource(&self) -> wgpu::BindingResource<'_> {
        match self {
            Held::Buffer {
                buffer,
                offset,
                size,
            } => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: *offset,
                size: *size,
            }),
            Held::View(v) => wgpu::BindingResource::TextureView(v),
        }
    }
}

/// A buffer copied into a texture before a kernel reads it there.
pub struct TextureCopy {
    pub src: wgpu::Buffer,
    pub dst: wgpu::Texture,
    /// Bytes `bytes(step)` (whole texels) into the same place of the texture's
    /// row-major texels (`gpu::upload::copy_to_texture`).
    pub bytes: BytesFn,
}

impl TextureCopy {
    /// Whether this step copies nothing: a step whose copies are all empty records
    /// none, and its kernel stays in the compute pass before it.
    fn is_empty(&self, step: &StepInfo) -> bool {
        (self.bytes)(step).is_empty()
    }
}

/// The pipeline a dispatch runs: compiled when the plan was built, or when a step first
/// runs it ([`crate::gpu::pipelines::Deferred`], see [`prepare`]).
#[derive(Clone)]
pub(crate) enum Pipe {
    Ready(Arc<wgpu::ComputePipeline>),
    Deferred(Arc<crate::gpu::pipelines::Deferred>),
}

impl From<Arc<wgpu::ComputePipeline>> for Pipe {
    fn from(p: Arc<wgpu::ComputePipeline>) -> Pipe {
        Pipe::Ready(p)
    }
}

impl Pipe {
    fn group_layout(&self) -> wgpu::BindGroupLayout {
        match self {
            Pipe::Ready(p) => p.get_bind_group_layout(0),
            Pipe::Deferred(d) => d.layout().clone(),
        }
    }
}

impl Dispatch {
    /// Record the kernel for `step`, if its grid there is not empty; a deferred
    /// pipeline is compiled here if [`prepare`] has not done it.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, step: &StepInfo) -> crate::Result<()> {
        let [x, y, z] = (self.grid)(step);
        if x == 0 || y == 0 || z == 0 {
            return Ok(());
        }
        match &self.pipeline {
            Pipe::Ready(p) => pass.set_pipeline(p),
            Pipe::Deferred(d) => pass.set_pipeline(&*d.get()?),
        }
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(x, y, z);
        Ok(())
    }

    /// Its deferred pipeline, if it has one not yet compiled and `step` runs it.
    fn unmade(&self, step: &StepInfo) -> Option<&Arc<crate::gpu::pipelines::Deferred>> {
        match &self.pipeline {
            // The grid first: a single token's step runs none of the batch kernels.
            Pipe::Deferred(d) if !self.grid(step).contains(&0) && !d.is_made() => Some(d),
            _ => None,
        }
    }

    pub fn grid(&self, step: &StepInfo) -> [u32; 3] {
        (self.grid)(step)
    }

    /// This dispatch with `copies` recorded before it (outside any compute pass).
    pub fn with_copies(mut self, copies: Vec<TextureCopy>) -> Dispatch {
        self.copies = copies;
        self
    }

    /// This dispatch, whose single-token steps may run as a phase of a chain.
    pub(crate) fn chainable(mut self, c: chain::Chainable) -> Dispatch {
        self.chainable = Some(c);
        self
    }

    /// Whether this step records copies before the kernel: it has some, and runs.
    pub fn copies_in(&self, step: &StepInfo) -> bool {
        self.copies.iter().any(|c| !c.is_empty(step)) && !self.grid(step).contains(&0)
    }

    /// Record the copies the kernel needs this step (see [`Self::copies_in`]).
    pub fn record_copies(&self, enc: &mut wgpu::CommandEncoder, step: &StepInfo) {
        if self.copies_in(step) {
            // An empty range records nothing.
            for c in &self.copies {
                crate::gpu::upload::copy_to_texture(enc, &c.src, &c.dst, (c.bytes)(step));
            }
        }
    }
}

/// Whether `plan` runs in `step` a deferred pipeline that is not compiled yet.
pub fn needs_compile<'a>(plan: impl IntoIterator<Item = &'a Dispatch>, step: &StepInfo) -> bool {
    plan.into_iter().any(|d| d.unmade(step).is_some())
}

/// Compile the deferred pipelines that `plan` runs in `step` and that no step has run
/// yet, on one thread per core (a model's first long batch: `ops::mul_mat`'s tiles of
/// eight).
pub fn prepare<'a>(
    plan: impl IntoIterator<Item = &'a Dispatch>,
    step: &StepInfo,
) -> crate::Result<()> {
    let mut todo: Vec<&Arc<crate::gpu::pipelines::Deferred>> = Vec::new();
    for d in plan.into_iter().filter_map(|d| d.unmade(step)) {
        if !todo.iter().any(|t| Arc::ptr_eq(t, d)) {
            todo.push(d);
        }
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(todo.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || -> crate::Result<()> {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(d) = todo.get(i) else {
                return Ok(());
            };
            d.get()?;
        }
    };
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mine = work();
        helpers.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| crate::Error::gpu("a pipeline's compilation thread panicked"))?
        })?;
        mine
    })
}

/// Record `plan` for `step`: its kernels in compute passes, each pass ended where a
/// kernel's texture copies have to come first.
pub fn record_plan<'a>(
    enc: &mut wgpu::CommandEncoder,
    plan: impl IntoIterator<Item = &'a Dispatch>,
    step: &StepInfo,
) -> crate::Result<()> {
    let mut passes = StepPasses::begin(enc);
    for d in plan {
        passes.record(enc, d, step)?;
    }
    Ok(())
}

/// A step's compute pass, ended and begun again where a kernel's texture copies have to
/// come first (copies are recorded outside any pass).
pub(crate) struct StepPasses {
    /// Always `Some` between calls; `None` only while copies are recorded.
    pass: Option<wgpu::ComputePass<'static>>,
}

impl StepPasses {
    const DESC: wgpu::ComputePassDescriptor<'static> = wgpu::ComputePassDescriptor {
        label: Some("forward"),
        timestamp_writes: None,
    };

    pub(crate) fn begin(enc: &mut wgpu::CommandEncoder) -> StepPasses {
        StepPasses {
            pass: Some(enc.begin_compute_pass(&Self::DESC).forget_lifetime()),
        }
    }

    /// The pass being recorded.
    pub(crate) fn pass(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
    ) -> &mut wgpu::ComputePass<'static> {
        self.pass
            .get_or_insert_with(|| enc.begin_compute_pass(&Self::DESC).forget_lifetime())
    }

    /// Record `d` for `step`, after its copies where it has some.
    pub(crate) fn record(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        d: &Dispatch,
        step: &StepInfo,
    ) -> crate::Result<()> {
        if d.copies_in(step) {
            // The pass ends before the copies; a new one follows them.
            self.pass = None;
            d.record_copies(enc, step);
        }
        d.record(self.pass(enc), step)
    }
}

/// A uniform buffer holding `value`.
pub(crate) fn uniform<T: bytemuck::Pod>(ctx: &GpuContext, label: &str, value: &T) -> wgpu::Buffer {
    ctx.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytemuck::bytes_of(value),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
}

/// Bind `step`, `params` and `buffers` (bindings 0, 1, 2..) to `pipeline` and wrap it with
/// its grid function.
pub(crate) fn dispatch<P: bytemuck::Pod>(
    ctx: &GpuContext,
    label: &str,
    pipeline: impl Into<Pipe>,
    step: &wgpu::Buffer,
    params: &P,
    buffers: &[&wgpu::Buffer],
    grid: impl Fn(&StepInfo) -> [u32; 3] + Send + Sync + 'static,
) -> crate::Result<Dispatch> {
    let resources: Vec<_> = buffers.iter().map(|b| b.as_entire_binding()).collect();
    dispatch_bound(ctx, label, pipeline, step, params, resources, grid)
}

/// [`dispatch`] with bindings 2.. given as resources (weights held in textures).
pub(crate) fn dispatch_bound<P: bytemuck::Pod>(
    ctx: &GpuContext,
    label: &str,
    pipeline: impl Into<Pipe>,
    step: &wgpu::Buffer,
    params: &P,
    resources: Vec<wgpu::BindingResource<'_>>,
    grid: impl Fn(&StepInfo) -> [u32; 3] + Send + Sync + 'static,
) -> crate::Result<Dispatch> {
    let params = uniform(ctx, label, params);
    let mut entries = vec![
        wgpu::BindGroupEntry {
            binding: 0,
            resource: step.as_entire_binding(),
        },
        wgpu::BindGroupEntry {
            binding: 1,
            resource: params.as_entire_binding(),
        },
    ];
    for (i, resource) in resources.into_iter().enumerate() {
        entries.push(wgpu::BindGroupEntry {
            binding: 2 + i as u32,
            resource,
        });
    }
    let held: Option<Vec<Held>> = match ctx.chains() {
        true => entries.iter().map(|e| Held::of(&e.resource)).collect(),
        false => None,
    };
    let pipeline = pipeline.into();
    let layout = pipeline.group_layout();
    let bind_group = ctx.scoped(&format!("binding {label}"), || {
        ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &layout,
            entries: &entries,
        })
    })?;
    Ok(Dispatch {
        label: label.to_string(),
        pipeline,
        bind_group,
        grid: Box::new(grid),
        copies: Vec::new(),
        chainable: None,
        resources: held.unwrap_or_default(),
    })
}

/// Workgroups needed to cover `n` items with `wg` per group.
pub(crate) fn groups(n: u32, wg: u32) -> u32 {
    n.div_ceil(wg)
}

/// The default workgroup size of element-wise kernels.
pub(crate) const WG: u32 = 64;

/// Building one pipeline into the context's cache ahead of recording, on any thread
/// (`model::gpu_warm`).
pub type WarmJob<'a> = Box<dyn FnOnce() -> crate::Result<()> + Send + 'a>;

/// The pipeline of a type-independent kernel.
pub(crate) fn op_pipeline(
    ctx: &GpuContext,
    name: &str,
) -> crate::Result<Arc<wgpu::ComputePipeline>> {
    ctx.pipelines.get(&ctx.device, name, &[], || {
        crate::gpu::shaders::op_source(name)
    })
}

/// [`op_pipeline`] laid out as `bindings`, compiled when a step first runs it (a
/// kernel only batches run: [`crate::gpu::pipelines::Deferred`]).
pub(crate) fn op_pipeline_later(
    ctx: &GpuContext,
    name: &str,
    bindings: &[crate::gpu::pipelines::Binding],
) -> crate::Result<Pipe> {
    let d = ctx
        .pipelines
        .deferred(&ctx.device, name, &[], bindings, || {
            crate::gpu::shaders::op_source(name)
        })?;
    Ok(Pipe::Deferred(d))
}

/// The pipeline of a kernel that reduces rows of `span` elements over its workgroup
/// (`rms_norm`, `softmax`, `rope_store_norm`), with `constants`.
///
/// - The `_sg` form, one subgroup per workgroup, where the device has a fixed subgroup
///   size and is CPU-hosted (measured on lavapipe: a 64-lane tree of barriers took most
///   of these kernels' time) or the row is at most four elements a lane.
/// - Else a tree in workgroup memory over [`reduce_lanes`] lanes. On a GPU a norm's
///   time is its lanes' chains of loads, each waiting on memory: one 32-lane subgroup
///   walking a row of 4096 took 67 us on an H200 (docs/perf.md).
///
/// [`GpuContext::workgroup_reductions`] forces the tree, so that tests run it anywhere.
pub(crate) fn reduce_pipeline(
    ctx: &GpuContext,
    name: &str,
    constants: &[(&str, f64)],
    span: u32,
) -> crate::Result<Arc<wgpu::ComputePipeline>> {
    reduce_pipeline_with(ctx, name, constants, span, None)
}

/// [`reduce_pipeline`] with the source's region `region` (`// @begin NAME` .. `// @end
/// NAME`) kept where given with true and dropped where given with false (a build
/// labelled with the region's name apart).
pub(crate) fn reduce_pipeline_with(
    ctx: &GpuContext,
    name: &str,
    constants: &[(&str, f64)],
    span: u32,
    region: Option<(&str, bool)>,
) -> crate::Result<Arc<wgpu::ComputePipeline>> {
    let (name, wg) = reduce_build(ctx, name, span);
    let mut consts = constants.to_vec();
    consts.push(("WG", wg as f64));
    ctx.pipelines
        .get(&ctx.device, &region_label(&name, region), &consts, || {
            region_source(&name, region)
        })
}

/// The lanes of a workgroup of one subgroup, where the reducing kernels may take their
/// `_sg` builds (and `argmax` its own): a fixed subgroup size of at most [`WG`], and
/// reductions not forced through workgroup memory
/// ([`GpuContext::workgroup_reductions`]).
pub(crate) fn one_subgroup_lanes(ctx: &GpuContext) -> Option<u32> {
    ctx.fixed_subgroup()
        .filter(|&sg| sg <= WG && !ctx.workgroup_reductions)
}

/// The build [`reduce_pipeline`] takes for rows of `span`, and its lanes.
fn reduce_build(ctx: &GpuContext, name: &str, span: u32) -> (String, u32) {
    let cpu_hosted = ctx.info.device_type == wgpu::DeviceType::Cpu;
    match one_subgroup_lanes(ctx) {
        Some(sg) if cpu_hosted || span <= 4 * sg => (format!("{name}_sg"), sg),
        _ => (name.to_string(), reduce_lanes(ctx, span)),
    }
}

/// [`reduce_pipeline`]'s one-subgroup build of `name`, laid out as `bindings` (a
/// deferred pipeline, compiled all the same), where the context runs chains: a chain's phases
/// run on workgroups of one subgroup (`chain`). With its lanes; `None` where chains do
/// not run or the device takes the other build.
pub(crate) fn reduce_pipeline_chained(
    ctx: &GpuContext,
    name: &str,
    constants: &[(&str, f64)],
    span: u32,
    bindings: &[crate::gpu::pipelines::Binding],
) -> crate::Result<Option<(Pipe, u32)>> {
    let (build, wg) = reduce_build(ctx, name, span);
    if !ctx.chains() || build == name {
        return Ok(None);
    }
    let mut consts = constants.to_vec();
    consts.push(("WG", wg as f64));
    let d = ctx
        .pipelines
        .deferred(&ctx.device, &build, &consts, bindings, || {
            crate::gpu::shaders::op_source(&build)
        })?;
    // Compiled now, as [`reduce_pipeline`]'s are: single tokens compile nothing.
    d.get()?;
    Ok(Some((Pipe::Deferred(d), wg)))
}

/// [`op_pipeline`] with the source's region `region` kept (`keep`) or dropped, as
/// [`reduce_pipeline_with`].
pub(crate) fn op_pipeline_with_region(
    ctx: &GpuContext,
    name: &str,
    region: (&str, bool),
) -> crate::Result<Arc<wgpu::ComputePipeline>> {
    let region = Some(region);
    ctx.pipelines
        .get(&ctx.device, &region_label(name, region), &[], || {
            region_source(name, region)
        })
}

/// The pipeline label of op `name` with `region` (see [`region_source`]): a build that
/// keeps the region is cached apart, under the region's name.
fn region_label(name: &str, region: Option<(&str, bool)>) -> String {
    match region {
        Some((r, true)) => format!("{name}_{r}"),
        _ => name.to_string(),
    }
}

/// Op `name`'s source with its region `(r, keep)` (`// @begin r` .. `// @end r`) kept
/// or dropped; as it is where no region is given.
fn region_source(name: &str, region: Option<(&str, bool)>) -> crate::Result<String> {
    let src = crate::gpu::shaders::op_source(name)?;
    Ok(match region {
        Some((r, keep)) => crate::gpu::shaders::keep_regions(&src, r, keep),
        None => src,
    })
}

/// Lanes of a tree reduction over rows of `span` (`REDUCE_MAX_WG` in
/// common/reduce.wgsl): about four elements a lane, 64 to 256 of them, within the
/// device's workgroup limits.
pub(crate) fn reduce_lanes(ctx: &GpuContext, span: u32) -> u32 {
    let cap = REDUCE_MAX_WG
        .min(ctx.limits.max_compute_invocations_per_workgroup)
        .min(ctx.limits.max_compute_workgroup_size_x);
    (span.div_ceil(4).next_power_of_two()).clamp(WG, cap.max(WG))
}

/// The most lanes of a tree reduction (`REDUCE_MAX_WG` in common/reduce.wgsl).
const REDUCE_MAX_WG: u32 = 256;

/// A step uniform for tests and tools that run kernels outside a model.
pub fn uniform_for_tests(ctx: &GpuContext, step: &StepInfo) -> wgpu::Buffer {
    uniform(ctx, "step", step)
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::{check_const, wgsl_mirror};

    #[test]
    fn step_info_mirrors_the_shader() {
        wgsl_mirror!(super::StepInfo, "common/step.wgsl", "Step", { n_tokens, pos, n_kv });
        for file in ["common/reduce.wgsl", "common/reduce_sg.wgsl"] {
            check_const(file, "REDUCE_MAX_WG", super::REDUCE_MAX_WG.into());
        }
    }
}
