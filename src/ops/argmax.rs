//! Greedy sampling on the device (`shaders/ops/argmax.wgsl`): the index of the largest
//! logit, found per span of the vocabulary by one workgroup each. A step then reads
//! back two words per span (64 spans for a 262144-token vocabulary: 512 bytes) instead
//! of every logit (1 MiB), and the host picks the best span.

use super::{dispatch, op_pipeline, Dispatch};
use crate::gpu::GpuContext;
use crate::{Error, Result};

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub n: u32,
    pub span: u32,
    pub _pad: [u32; 2],
}

/// Logits per workgroup: enough that the host's share of the work stays a few hundred
/// words, few enough that a large vocabulary still spreads over many workgroups.
pub const SPAN: u32 = 4096;

/// Workgroups (and result pairs) for `n` logits.
pub fn groups(n: u32) -> u32 {
    n.div_ceil(SPAN)
}

/// Compile (or find) the pipeline, on any thread.
pub fn warm(ctx: &GpuContext) -> Result<()> {
    op_pipeline(ctx, "argmax").map(drop)
}

/// `out[g]` = (key, index) of the largest of `logits[g * SPAN .. (g + 1) * SPAN]`;
/// `out` holds [`groups`]`(n)` pairs. [`pick`] reduces them.
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    logits: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: u32,
) -> Result<Dispatch> {
    let n_groups = groups(n);
    let limit = ctx.device.limits().max_compute_workgroups_per_dimension;
    if n == 0 || n_groups > limit {
        return Err(Error::Unsupported(format!(
            "greedy sampling on the device over {n} logits ({n_groups} workgroups, at most {limit})"
        )));
    }
    let pipe = op_pipeline(ctx, "argmax")?;
    let p = Params {
        n,
        span: SPAN,
        _pad: [0; 2],
    };
    dispatch(ctx, "argmax", pipe, step, &p, &[logits, out], move |_| {
        [n_groups, 1, 1]
    })
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
