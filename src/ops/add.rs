//! Residual add in place (`shaders/ops/add.wgsl`).

use super::{dispatch, groups, op_pipeline, Dispatch, WG};
use crate::gpu::GpuContext;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub n: u32,
    pub _pad: [u32; 3],
}

/// x += y; x, y: [n, n_tokens].
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: u32,
) -> Result<Dispatch> {
    let pipe = op_pipeline(ctx, "add")?;
    let p = Params { n, _pad: [0; 3] };
    dispatch(ctx, "add", pipe, step, &p, &[x, y], move |s| {
        [groups(n, WG), s.n_tokens, 1]
    })
}

pub fn reference(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::wgsl_mirror;

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::Params, "ops/add.wgsl", "Params", { n });
    }
}
