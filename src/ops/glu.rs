//! Gated activations: SwiGLU and GeGLU (`shaders/ops/glu.wgsl`).

use super::{dispatch, groups, op_pipeline, Dispatch, WG};
use crate::gpu::GpuContext;
use crate::Result;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu = 0,
    GeluTanh = 1,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub n: u32,
    pub act: u32,
    pub _pad: [u32; 2],
}

/// out = act(gate) * up; all [n, n_tokens].
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: u32,
    act: Activation,
) -> Result<Dispatch> {
    gpu_in(ctx, step, [gate, up, out], n, act, false)
}

/// [`gpu`], run only in steps of several tokens with `batches_only` (those of one store
/// act(gate) * up from their gate/up product: `mul_mat::gpu_gate_up`).
pub fn gpu_in(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    [gate, up, out]: [&wgpu::Buffer; 3],
    n: u32,
    act: Activation,
    batches_only: bool,
) -> Result<Dispatch> {
    let pipe = op_pipeline(ctx, "glu")?;
    let p = Params {
        n,
        act: act as u32,
        _pad: [0; 2],
    };
    dispatch(ctx, "glu", pipe, step, &p, &[gate, up, out], move |s| {
        let runs = !batches_only || s.n_tokens > 1;
        [if runs { groups(n, WG) } else { 0 }, s.n_tokens, 1]
    })
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU with the tanh approximation, as ggml computes it.
pub fn gelu_tanh(x: f32) -> f32 {
    let u = 0.797_884_6 * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

pub fn reference(gate: &[f32], up: &[f32], out: &mut [f32], act: Activation) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        let a = match act {
            Activation::Silu => silu(*g),
            Activation::GeluTanh => gelu_tanh(*g),
        };
        *o = a * u;
    }
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::wgsl_mirror;

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::Params, "ops/glu.wgsl", "Params", { n, act });
    }
}
