//! The wgpu runtime: device selection, the shader table, pipeline cache, weight upload,
//! readback and the kernel choices measured per device ([`tuning`]). Kernels themselves live in `crate::ops`.

pub mod context;
pub mod huge_pages;
pub mod layout;
pub mod pin;
pub mod pipelines;
pub mod profile;
pub mod readback;
pub mod shaders;
pub mod staging;
pub mod tuning;
pub mod upload;
#[cfg(test)]
pub(crate) mod wgsl_layout;
pub mod wgsl_link;

pub use context::{AdapterSummary, DeviceOptions, GpuContext};
pub use upload::GpuTensor;
