//! Compute pipelines, made once and cached by (label, override constants).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::{Error, Result};

/// What a kernel's binding i holds, for kernels given an explicit bind group layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    Uniform,
    Read,
    ReadWrite,
    /// A 2D rgba32uint texture bound as a read-only storage texture, read with
    /// `textureLoad` (weights held in textures: `gpu::upload::WeightMemory`).
    Texture,
}

impl Binding {
    /// The layout entry of a compute buffer binding of this kind at `binding`.
    pub fn entry(self, binding: u32) -> wgpu::BindGroupLayoutEntry {
        let buffer = |ty| wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: None,
        };
        let ty = match self {
            Binding::Uniform => buffer(wgpu::BufferBindingType::Uniform),
            Binding::Read => buffer(wgpu::BufferBindingType::Storage { read_only: true }),
            Binding::ReadWrite => buffer(wgpu::BufferBindingType::Storage { read_only: false }),
            Binding::Texture => wgpu::BindingType::StorageTexture {
                access: wgpu::StorageTextureAccess::ReadOnly,
                format: wgpu::TextureFormat::Rgba32Uint,
                view_dimension: wgpu::TextureViewDimension::D2,
            },
        };
        wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty,
            count: None,
        }
    }
}

/// One cache entry: filled by whichever thread asks first; others asking meanwhile
/// wait on its lock instead of compiling the same pipeline again.
type Slot = Arc<Mutex<Option<Arc<wgpu::ComputePipeline>>>>;

/// Safe to share between threads: pipelines of different keys compile concurrently
/// (a model's weight-dependent kernels are warmed while its weights upload).
#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<String, Slot>>,
}

impl PipelineCache {
    /// The pipeline for `label` with `constants`, compiling `source()` on first use; its
    /// layout is derived from the bindings the shader uses.
    pub fn get(
        &self,
        device: &wgpu::Device,
        label: &str,
        constants: &[(&str, f64)],
        source: impl FnOnce() -> Result<String>,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        self.get_laid_out(device, label, constants, None, source)
    }

    /// As [`get`](Self::get), with group 0 laid out as `bindings` (binding i holds
    /// `bindings[i]`) whether or not the shader uses each one, so that one set of
    /// buffers binds every specialisation of a kernel.
    pub fn get_laid_out(
        &self,
        device: &wgpu::Device,
        label: &str,
        constants: &[(&str, f64)],
        bindings: Option<&[Binding]>,
        source: impl FnOnce() -> Result<String>,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let key = format!("{label}{constants:?}");
        let slot = {
            let mut map = self.map.lock().map_err(|_| poisoned())?;
            map.entry(key).or_default().clone()
        };
        // Held while compiling: a second request for this key waits for the first.
        let mut slot = slot.lock().map_err(|_| poisoned())?;
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        let p = Arc::new(compile(device, label, constants, bindings, source)?);
        *slot = Some(p.clone());
        Ok(p)
    }

    /// Pipelines compiled so far.
    pub fn len(&self) -> usize {
        let Ok(map) = self.map.lock() else {
            return 0;
        };
        map.values()
            .filter(|s| s.lock().map(|p| p.is_some()).unwrap_or(false))
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn poisoned() -> Error {
    Error::gpu("pipeline cache poisoned")
}

/// The checks naga builds into every kernel: all of wgpu's, less the counter it adds to
/// every loop to stop infinite ones (`force_loop_bounding`). That counter hides the trip
/// count from the driver's compiler, which then unrolls nothing and keeps the decoders'
/// small arrays in memory rather than registers (wgpu issue 7698 reports 100x on one
/// kernel; docs/perf.md has the H200 figures).
fn runtime_checks() -> wgpu::ShaderRuntimeChecks {
    wgpu::ShaderRuntimeChecks {
        force_loop_bounding: false,
        ..wgpu::ShaderRuntimeChecks::checked()
    }
}

/// Compile `source()` into a compute pipeline (see [`PipelineCache::get_laid_out`]).
fn compile(
    device: &wgpu::Device,
    label: &str,
    constants: &[(&str, f64)],
    bindings: Option<&[Binding]>,
    source: impl FnOnce() -> Result<String>,
) -> Result<wgpu::ComputePipeline> {
    let src = source()?;
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    };
    // SAFETY: `force_loop_bounding` is off, which requires that no loop of the shader
    // runs forever; every other check stays on. Every loop in shaders/ is counted: its
    // counter moves monotonically toward a bound that is a constant, an override or a
    // uniform field sized from a tensor (under 2^27 chunks, far from wrapping a u32).
    let module = unsafe { device.create_shader_module_trusted(desc, runtime_checks()) };
    let layout = bindings.map(|b| {
        let entries: Vec<_> = (0u32..).zip(b).map(|(i, k)| k.entry(i)).collect();
        let group = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(label),
            entries: &entries,
        });
        device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(label),
            bind_group_layouts: &[Some(&group)],
            immediate_size: 0,
        })
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: layout.as_ref(),
        module: &module,
        entry_point: Some("main"),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants,
            zero_initialize_workgroup_memory: false,
        },
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::gpu(format!("shader {label}: {e}")));
    }
    Ok(pipeline)
}
