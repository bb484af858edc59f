//! Greedy sampling on the device (`shaders/ops/argmax.wgsl`): the index of the largest
//! logit, found per span of the vocabulary by one workgroup each. A step then reads
//! back two words per span instead of every logit (1 MiB for a 262144-token
//! vocabulary), and the host picks the best span.
//!
//! Two builds ([`Split`]). On GPUs, `argmax`: spans of [`SPAN`] logits read from their
//! buffer, each workgroup's 64 lanes meeting in a tree in workgroup memory (64 spans,
//! 512 bytes, for 262144 logits). On CPU-hosted drivers with a fixed subgroup size,
//! `argmax_sg`: a span per worker thread, each a workgroup of one subgroup meeting in
//! two subgroup operations, reading the logits from a texture they are copied into
//! first. There every workgroup and barrier costs a hand-off or a switch between
//! coroutines, and a storage buffer's loads go lane by lane: on lavapipe Gemma 3's
//! 262144 logits took 1.6-1.8 ms a step the first way (docs/perf.md).

use super::{dispatch, dispatch_bound, one_subgroup_lanes, Dispatch, TextureCopy};
use crate::gpu::context::driver_threads;
use crate::gpu::upload::{scratch_fits, scratch_texture};
use crate::gpu::GpuContext;
use crate::{Error, Result};

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub n: u32,
    pub span: u32,
    pub _pad: [u32; 2],
}

/// Logits per workgroup of the `argmax` build: enough that the host's share of the
/// work stays a few hundred words, few enough that a large vocabulary still spreads
/// over many workgroups.
pub const SPAN: u32 = 4096;

/// How greedy sampling splits its logits on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// The kernel's build: `argmax` (reading the buffer) or `argmax_sg` (a texture).
    pub build: &'static str,
    /// Lanes per workgroup (`WG`).
    pub lanes: u32,
    /// Logits per workgroup, a multiple of four (the kernel walks quads of them).
    pub span: u32,
    /// Workgroups, and so result pairs.
    pub groups: u32,
}

impl Split {
    fn texture(&self) -> bool {
        self.build == "argmax_sg"
    }
}

/// The split of `n` logits on `ctx` (see the module's comment).
pub fn split(ctx: &GpuContext, n: u32) -> Split {
    let cpu_hosted = ctx.info.device_type == wgpu::DeviceType::Cpu;
    match one_subgroup_lanes(ctx) {
        Some(sg) if cpu_hosted && scratch_fits(ctx, quad_bytes(n)) => {
            let span = n.div_ceil(driver_threads()).next_multiple_of(4).max(4);
            Split {
                build: "argmax_sg",
                lanes: sg,
                span,
                groups: n.div_ceil(span),
            }
        }
        _ => Split {
            build: "argmax",
            lanes: 64,
            span: SPAN,
            groups: n.div_ceil(SPAN),
        },
    }
}

/// Bytes of `n` logits in whole quads: what `argmax_sg` copies into its texture, and
/// so what the logits' buffer must hold there.
pub fn quad_bytes(n: u32) -> u64 {
    (n as u64).div_ceil(4) * 16
}

/// Compile (or find) the pipeline for `n` logits, on any thread.
pub fn warm(ctx: &GpuContext, n: u32) -> Result<()> {
    pipeline(ctx, split(ctx, n)).map(drop)
}

fn pipeline(ctx: &GpuContext, s: Split) -> Result<std::sync::Arc<wgpu::ComputePipeline>> {
    ctx.pipelines
        .get(&ctx.device, s.build, &[("WG", s.lanes as f64)], || {
            crate::gpu::shaders::op_source(s.build)
        })
}

/// `out[g]` = (key, index) of the largest of `logits[g * span .. (g + 1) * span]`;
/// `out` holds `split(ctx, n).groups` pairs, and `logits` at least [`quad_bytes`]`(n)`
/// bytes. [`pick`] reduces the pairs.
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    logits: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: u32,
) -> Result<Dispatch> {
    let s = split(ctx, n);
    let limit = ctx.device.limits().max_compute_workgroups_per_dimension;
    if n == 0 || s.groups > limit {
        return Err(Error::Unsupported(format!(
            "greedy sampling on the device over {n} logits ({} workgroups, at most {limit})",
            s.groups
        )));
    }
    let bytes = quad_bytes(n);
    if logits.size() < bytes {
        return Err(Error::gpu(format!(
            "greedy sampling over {n} logits needs a buffer of {bytes} bytes, got {}",
            logits.size()
        )));
    }
    let pipe = pipeline(ctx, s)?;
    let p = Params {
        n,
        span: s.span,
        _pad: [0; 2],
    };
    let groups = s.groups;
    let grid = move |_: &super::StepInfo| [groups, 1, 1];
    if !s.texture() {
        return dispatch(ctx, s.build, pipe, step, &p, &[logits, out], grid);
    }
    let tex = scratch_texture(ctx, "argmax logits", bytes)?;
    let view = tex.create_view(&Default::default());
    let resources = vec![
        wgpu::BindingResource::TextureView(&view),
        out.as_entire_binding(),
    ];
    let d = dispatch_bound(ctx, s.build, pipe, step, &p, resources, grid)?;
    Ok(d.with_copies(vec![TextureCopy {
        src: logits.clone(),
        dst: tex,
        bytes: Box::new(move |_| 0..bytes),
    }]))
}

/// The token of the best (key, index) pair: the larger key, then the lower index.
pub fn pick(pairs: &[[u32; 2]]) -> Result<u32> {
    pairs
        .iter()
        .max_by(|a, b| a[0].cmp(&b[0]).then(b[1].cmp(&a[1])))
        .map(|p| p[1])
        .ok_or_else(|| Error::gpu("greedy sampling returned no candidates"))
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::wgsl_mirror;

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::Params, "ops/argmax.wgsl", "Params", { n, span });
    }
}
