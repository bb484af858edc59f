//! Quantized matrix times activations, dequantizing inside the kernel
//! (`shaders/ops/mul_mat.wgsl` with the weight type's decoder).

use super::{dispatch, groups, Dispatch, WG};
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
    pub x_stride: u32,
    pub y_stride: u32,
    pub last_only: u32,
    pub _pad: u32,
}

/// Which activation columns to multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Columns {
    /// Every token of the batch: y is [n_rows, n_tokens].
    All,
    /// Only the batch's last token: y is [n_rows] (logits for sampling).
    Last,
}

pub(crate) fn pipeline(
    ctx: &GpuContext,
    ty: GgmlType,
) -> Result<std::sync::Arc<wgpu::ComputePipeline>> {
    let label = format!("mul_mat_{ty}");
    ctx.pipelines
        .get(&ctx.device, &label, &[("WG", WG as f64)], || {
            crate::gpu::shaders::quant_source("mul_mat", ty)
        })
}

/// y = W x; W: [n_cols, n_rows] (any part layout), x: [n_cols, n_tokens], y: [n_rows, ..].
/// One dispatch per part of W.
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    cols: Columns,
) -> Result<Vec<Dispatch>> {
    if w.n_cols() % 32 != 0 {
        return Err(Error::Unsupported(format!(
            "{}: rows of {} elements (the GPU matmul needs a multiple of 32)",
            w.name,
            w.n_cols()
        )));
    }
    let pipe = pipeline(ctx, w.ty)?;
    let mut out = Vec::new();
    for part in &w.parts {
        let p = Params {
            n_rows: part.n_rows,
            n_cols: w.n_cols() as u32,
            row_bytes: w.row_bytes as u32,
            row0: part.row0,
            x_stride: (w.n_cols() / 4) as u32,
            y_stride: w.n_rows() as u32,
            last_only: (cols == Columns::Last) as u32,
            _pad: 0,
        };
        let n_rows = part.n_rows;
        let label = format!("mul_mat {}", w.name);
        out.push(dispatch(
            ctx,
            &label,
            pipe.clone(),
            step,
            &p,
            &[&part.buffer, x, y],
            move |_| [groups(n_rows, WG), 1, 1],
        )?);
    }
    Ok(out)
}

/// CPU reference: y[t * n_rows + r] = dequant(W row r) . x[t * n_cols ..].
pub fn reference(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    let row_bytes = ty
        .row_bytes(n_cols as u64)
        .ok_or_else(|| Error::invalid("row is not whole blocks"))? as usize;
    let mut row = vec![0f32; n_cols];
    for r in 0..n_rows {
        crate::quant::dequantize(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut row)?;
        for t in 0..n_tokens {
            let xs = &x[t * n_cols..(t + 1) * n_cols];
            let s: f64 = row.iter().zip(xs).map(|(a, b)| *a as f64 * *b as f64).sum();
            y[t * n_rows + r] = s as f32;
        }
    }
    Ok(())
}
