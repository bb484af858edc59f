//! Appending a batch's keys and values to the KV cache (`shaders/ops/kv_store.wgsl`).

use super::{dispatch, groups, op_pipeline, Dispatch, WG};
use crate::gpu::GpuContext;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub kv_dim: u32,
    pub n_ctx: u32,
    pub _pad: [u32; 2],
}

/// k_new, v_new: [kv_dim, n_tokens]; k_cache: [kv_dim, n_ctx]; v_cache: [n_ctx, kv_dim].
#[allow(clippy::too_many_arguments)]
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    k_new: &wgpu::Buffer,
    v_new: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    kv_dim: u32,
    n_ctx: u32,
) -> Result<Dispatch> {
    let pipe = op_pipeline(ctx, "kv_store")?;
    let p = Params {
        kv_dim,
        n_ctx,
        _pad: [0; 2],
    };
    dispatch(
        ctx,
        "kv_store",
        pipe,
        step,
        &p,
        &[k_new, v_new, k_cache, v_cache],
        move |s| [groups(kv_dim, WG), s.n_tokens, 1],
    )
}
