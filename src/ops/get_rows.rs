//! Embedding lookup with in-kernel dequantization (`shaders/ops/get_rows.wgsl`).

use std::sync::Arc;

use super::{dispatch_bound, groups, Dispatch, WG};
use crate::gpu::shaders::Form;
use crate::gpu::upload::WeightMemory;
use crate::gpu::{GpuContext, GpuTensor};
use crate::quant::GgmlType;
use crate::{Error, Result};

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub n_rows: u32,
    pub n_cols: u32,
    pub row_bytes: u32,
    pub row0: u32,
    pub scale: f32,
    pub _pad: [u32; 3],
}

/// The pipeline for weights of type `ty` held in `memory`.
fn pipeline(
    ctx: &GpuContext,
    ty: GgmlType,
    memory: WeightMemory,
) -> Result<Arc<wgpu::ComputePipeline>> {
    let layout = super::mul_mat::weight_layout(false, memory);
    let form = Form::new(false, memory);
    ctx.pipelines.get_laid_out(
        &ctx.device,
        &format!("get_rows_{ty}{}", form.suffix()),
        &[("WG", WG as f64)],
        Some(&layout),
        || crate::gpu::shaders::quant_source_as("get_rows", ty, form),
    )
}

/// Compile (or find) the pipeline [`gpu`] uses for weights of type `ty`, on any thread.
/// Embedding tables are matrices, held where the context keeps the type's.
pub fn warm(ctx: &GpuContext, ty: GgmlType) -> Result<()> {
    pipeline(ctx, ty, ctx.matrix_memory(ty)).map(drop)
}

/// out[:, t] = W[:, ids[t]] * scale; out: [n_cols, n_tokens]. One dispatch per part of W.
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    ids: &wgpu::Buffer,
    out: &wgpu::Buffer,
    scale: f32,
) -> Result<Vec<Dispatch>> {
    if w.n_cols() % 32 != 0 {
        return Err(Error::Unsupported(format!(
            "{}: rows of {} elements (GPU get_rows needs a multiple of 32)",
            w.name,
            w.n_cols()
        )));
    }
    let label = format!("get_rows_{}", w.ty);
    let pipe = pipeline(ctx, w.ty, w.memory)?;
    let chunks = (w.n_cols() / 32) as u32;
    let mut v = Vec::new();
    for part in &w.parts {
        let p = Params {
            n_rows: part.n_rows,
            n_cols: w.n_cols() as u32,
            row_bytes: w.row_bytes as u32,
            row0: part.row0,
            scale,
            _pad: [0; 3],
        };
        v.push(dispatch_bound(
            ctx,
            &label,
            pipe.clone(),
            step,
            &p,
            super::mul_mat::weight_bindings(part, ids, out),
            move |s| [groups(chunks, WG), s.n_tokens, 1],
        )?);
    }
    Ok(v)
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::wgsl_mirror;

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::Params, "ops/get_rows.wgsl", "Params", {
            n_rows, n_cols, row_bytes, row0, scale
        });
    }
}
