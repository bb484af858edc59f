//! Compute pipelines, made once and cached by (label, override constants).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

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
    /// The same written with `textureStore` (a layer's kept KV cache textures).
    TextureWrite,
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
            Binding::Texture | Binding::TextureWrite => wgpu::BindingType::StorageTexture {
                access: match self {
                    Binding::TextureWrite => wgpu::StorageTextureAccess::WriteOnly,
                    _ => wgpu::StorageTextureAccess::ReadOnly,
                },
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
    /// Pipelines laid out as their shaders' bindings.
    map: Mutex<HashMap<String, Slot>>,
    /// Pipelines laid out as the caller says, compiled when asked for or on first use.
    deferred: Mutex<HashMap<String, Arc<Deferred>>>,
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
    /// buffers binds every specialisation of a kernel. Laid-out pipelines are the
    /// entries of [`deferred`](Self::deferred), compiled here: one entry per key,
    /// whether it is asked for now or on first use.
    pub fn get_laid_out(
        &self,
        device: &wgpu::Device,
        label: &str,
        constants: &[(&str, f64)],
        bindings: Option<&[Binding]>,
        source: impl FnOnce() -> Result<String>,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(b) = bindings {
            return self.deferred(device, label, constants, b, source)?.get();
        }
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
        let p = Arc::new(compile(device, label, constants, None, &source()?)?);
        *slot = Some(p.clone());
        Ok(p)
    }

    /// The pipeline for `label` with `constants`, laid out as `bindings` (as
    /// [`get_laid_out`](Self::get_laid_out)), compiled only when a step first runs it
    /// ([`Deferred::get`]): for builds that only some workloads run, which would
    /// otherwise add their compilation to every start.
    pub fn deferred(
        &self,
        device: &wgpu::Device,
        label: &str,
        constants: &[(&str, f64)],
        bindings: &[Binding],
        source: impl FnOnce() -> Result<String>,
    ) -> Result<Arc<Deferred>> {
        let key = format!("{label}{constants:?}");
        let mut map = self.deferred.lock().map_err(|_| poisoned())?;
        if let Some(d) = map.get(&key) {
            return Ok(d.clone());
        }
        let d = Arc::new(Deferred {
            device: device.clone(),
            label: label.to_string(),
            constants: constants.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
            layout: group_layout(device, label, bindings),
            bindings: bindings.to_vec(),
            source: source()?,
            made: OnceLock::new(),
            compiling: Mutex::new(()),
        });
        map.insert(key, d.clone());
        Ok(d)
    }

    /// Pipelines compiled so far.
    pub fn len(&self) -> usize {
        let Ok(map) = self.map.lock() else {
            return 0;
        };
        let deferred = match self.deferred.lock() {
            Ok(d) => d.values().filter(|d| d.is_made()).count(),
            Err(_) => 0,
        };
        map.values()
            .filter(|s| s.lock().map(|p| p.is_some()).unwrap_or(false))
            .count()
            + deferred
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A pipeline compiled on first need ([`PipelineCache::deferred`]). Its bind group
/// layout exists from the start, so that dispatches can be bound before it is compiled.
pub struct Deferred {
    device: wgpu::Device,
    label: String,
    constants: Vec<(String, f64)>,
    layout: wgpu::BindGroupLayout,
    /// What `layout` holds, binding by binding.
    bindings: Vec<Binding>,
    source: String,
    made: OnceLock<Arc<wgpu::ComputePipeline>>,
    /// Held while compiling: a second caller waits instead of compiling it again.
    compiling: Mutex<()>,
}

impl Deferred {
    pub fn layout(&self) -> &wgpu::BindGroupLayout {
        &self.layout
    }

    /// What its group 0 holds, binding by binding.
    pub fn bindings(&self) -> &[Binding] {
        &self.bindings
    }

    /// Its WGSL source, as compiled.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Its override constants.
    pub fn constants(&self) -> &[(String, f64)] {
        &self.constants
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// The pipeline, compiled by the first caller (others wait for it).
    pub fn get(&self) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.made.get() {
            return Ok(p.clone());
        }
        let _compiling = self.compiling.lock().map_err(|_| poisoned())?;
        if let Some(p) = self.made.get() {
            return Ok(p.clone());
        }
        let constants: Vec<(&str, f64)> = self
            .constants
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        let p = Arc::new(compile(
            &self.device,
            &self.label,
            &constants,
            Some(&self.layout),
            &self.source,
        )?);
        Ok(self.made.get_or_init(|| p).clone())
    }

    /// Whether it has been compiled.
    pub fn is_made(&self) -> bool {
        self.made.get().is_some()
    }
}

/// Group 0 laid out as `bindings` (binding i holds `bindings[i]`).
fn group_layout(device: &wgpu::Device, label: &str, bindings: &[Binding]) -> wgpu::BindGroupLayout {
    let entries: Vec<_> = (0u32..).zip(bindings).map(|(i, k)| k.entry(i)).collect();
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(label),
        entries: &entries,
    })
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

/// Compile `src` into a compute pipeline with group 0 laid out as `group`, or as the
/// shader's bindings without (see [`PipelineCache::get_laid_out`]).
pub(crate) fn compile(
    device: &wgpu::Device,
    label: &str,
    constants: &[(&str, f64)],
    group: Option<&wgpu::BindGroupLayout>,
    src: &str,
) -> Result<wgpu::ComputePipeline> {
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
    let layout = group.map(|group| {
        device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(label),
            bind_group_layouts: &[Some(group)],
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
