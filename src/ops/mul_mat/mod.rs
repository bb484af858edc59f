//! Quantized matrix times activations, dequantizing inside the kernel
//! (`shaders/ops/mul_mat*.wgsl` with the weight type's decoder).
//!
//! - `variants`: the kernel families and which one a device and a product run;
//! - `shape`: each family's workgroups, rows and token tiles, sized per device;
//! - `build`: one build of a kernel as a pipeline, and the bindings the kernels share;
//! - `steps`: which builds a product runs in which steps;
//! - `params`: the parameters every kernel reads;
//! - `plan`: a product's dispatches;
//! - `fused`: gate/up with their GLU, the norm folded in, RoPE after the Q/K/V product;
//! - `cpu_reference`: the CPU references the kernels are tested against.

mod build;
mod cpu_reference;
mod fused;
mod params;
mod plan;
mod shape;
mod steps;
mod variants;

pub(crate) use build::*;
pub use cpu_reference::*;
pub use fused::*;
pub use params::*;
use plan::*;
pub use shape::*;
pub use steps::*;
pub use variants::*;

use super::glu::Activation;
use super::kv_store::{CacheAppend, CacheViews};
use super::{dispatch, dispatch_bound, groups, Dispatch, Pipe, StepInfo, WG};
use crate::gpu::pipelines::Binding;
use crate::gpu::shaders::Form;
use crate::gpu::upload::{is_vector_uniform, Part, WeightMemory, VECTOR_UNIFORM_BYTES};
use crate::gpu::{GpuContext, GpuTensor};
use crate::quant::GgmlType;
use crate::{Error, Result};

pub use super::Store;

/// The shape part of every mul_mat variant's parameters (`WinParams` adds the rest of
/// `common/mul_mat_params.wgsl`).
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
    /// 1: the product is added to the output instead of replacing it ([`Store::Add`]).
    pub acc: u32,
}

/// Which activation columns to multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Columns {
    /// Every token of the batch: y is [n_rows, n_tokens].
    All,
    /// Only the batch's last token: y is [n_rows] (logits for sampling).
    Last,
}

/// y = W x (or y += W x); W: [n_cols, n_rows] (any part layout), x: [n_cols, n_tokens],
/// y: [n_rows, ..]. One dispatch per part of W, with the variant [`variant`] picks for
/// `ctx`.
#[allow(clippy::too_many_arguments)]
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    cols: Columns,
    store: Store,
) -> Result<Vec<Dispatch>> {
    gpu_variant(ctx, variant(ctx, w.ty)?, step, w, x, y, cols, store)
}

/// [`gpu`] with an explicit variant (tests, benchmarks).
#[allow(clippy::too_many_arguments)]
pub fn gpu_variant(
    ctx: &GpuContext,
    v: Variant,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    cols: Columns,
    store: Store,
) -> Result<Vec<Dispatch>> {
    let out = Outputs::plain(ctx, y, w.n_rows(), store);
    Ok(gpu_out(ctx, v, step, w, x, (&out, None), cols, None)?.0)
}

/// ys[i] = rows `rows[i]` of W x, for a W holding several products' rows one after
/// another ([`crate::model::graph::Proj::Fused`]): one dispatch for all of them.
pub fn gpu_rows(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    ys: &[&wgpu::Buffer],
    rows: &[u32],
) -> Result<Vec<Dispatch>> {
    gpu_rows_variant(ctx, variant(ctx, w.ty)?, step, w, x, ys, rows)
}

/// [`gpu_rows`] with an explicit variant (tests).
pub fn gpu_rows_variant(
    ctx: &GpuContext,
    v: Variant,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    ys: &[&wgpu::Buffer],
    rows: &[u32],
) -> Result<Vec<Dispatch>> {
    let out = fused_outputs(ctx, w, ys, rows)?;
    Ok(gpu_out(ctx, v, step, w, x, (&out, None), Columns::All, None)?.0)
}

/// The outputs of a fused product, checked against its rows.
fn fused_outputs<'a>(
    ctx: &'a GpuContext,
    w: &GpuTensor,
    ys: &[&'a wgpu::Buffer],
    rows: &[u32],
) -> Result<Outputs<'a>> {
    if rows.iter().map(|&r| r as u64).sum::<u64>() != w.n_rows() || ys.len() != rows.len() {
        return Err(Error::invalid(format!(
            "{}: {} rows cannot be split as {rows:?} into {} outputs",
            w.name,
            w.n_rows(),
            ys.len()
        )));
    }
    if !ctx.fused_outputs() {
        return Err(Error::Unsupported(format!(
            "{}: fused products on {}, which binds too few storage buffers per stage",
            w.name, ctx.info.name
        )));
    }
    Outputs::fused(ctx, ys, rows)
}
