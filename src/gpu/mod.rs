//! The wgpu runtime: device selection, the shader table, pipeline cache, weight upload
//! and readback. Kernels themselves live in `crate::ops`.

pub mod context;
pub mod pipelines;
pub mod profile;
pub mod readback;
pub mod shaders;
pub mod upload;

pub use context::{AdapterSummary, DeviceOptions, GpuContext};
pub use upload::GpuTensor;
