//! RMS normalisation times a weight (`shaders/ops/rms_norm.wgsl`).

use super::chain::Chainable;
use super::{dispatch, Dispatch, StepInfo, Store};
use crate::gpu::pipelines::Binding;
use crate::gpu::GpuContext;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub n: u32,
    pub rows_per_token: u32,
    pub eps: f32,
    pub _pad: u32,
}

/// y = rms_norm(x) * w (or y += that) over rows of `n`; x, y: [n, rows_per_token,
/// n_tokens], w: [n].
#[allow(clippy::too_many_arguments)]
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: u32,
    rows_per_token: u32,
    eps: f32,
    store: Store,
) -> Result<Dispatch> {
    let p = Params {
        n,
        rows_per_token,
        eps,
        _pad: 0,
    };
    let acc = [("ACC", (store == Store::Add) as u8 as f64)];
    let grid = move |s: &StepInfo| [rows_per_token, s.n_tokens, 1];
    // Where chains run, the one-subgroup build may join one: Gemma 3's post-norms sit
    // between a layer's products, and would otherwise break their runs.
    let chained = super::reduce_pipeline_chained(ctx, "rms_norm", &acc, n, &BINDINGS)?;
    if let Some((pipe, wg)) = chained {
        let d = dispatch(ctx, "rms_norm", pipe, step, &p, &[x, w, y], grid)?;
        return Ok(d.chainable(Chainable::fixed(chain_trips(n, wg))));
    }
    let pipe = super::reduce_pipeline(ctx, "rms_norm", &acc, n)?;
    dispatch(ctx, "rms_norm", pipe, step, &p, &[x, w, y], grid)
}

/// shaders/ops/rms_norm.wgsl's bindings: the step, its parameters, x, the weight, y.
const BINDINGS: [Binding; 5] = [
    Binding::Uniform,
    Binding::Uniform,
    Binding::Read,
    Binding::Read,
    Binding::ReadWrite,
];

/// The most loop trips a workgroup of `wg` lanes takes on a row of `n`: its two walks
/// over the row, four elements a lane a trip.
fn chain_trips(n: u32, wg: u32) -> u32 {
    2 * n.div_ceil(4 * wg) + 2
}

/// CPU reference: each row of `n` in `x` normalised into `y`.
pub fn reference(x: &[f32], w: &[f32], y: &mut [f32], n: usize, eps: f32) {
    for (xr, yr) in x.chunks(n).zip(y.chunks_mut(n)) {
        let ss: f64 = xr.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let inv = 1.0 / ((ss / n as f64) as f32 + eps).sqrt();
        for i in 0..n {
            yr[i] = xr[i] * inv * w[i];
        }
    }
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::wgsl_mirror;

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::Params, "ops/rms_norm.wgsl", "Params", { n, rows_per_token, eps });
    }
}
