//! Compute pipelines, made once and cached by (label, override constants).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::{Error, Result};

#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    /// The pipeline for `label` with `constants`, compiling `source()` on first use.
    pub fn get(
        &self,
        device: &wgpu::Device,
        label: &str,
        constants: &[(&str, f64)],
        source: impl FnOnce() -> Result<String>,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let key = format!("{label}{constants:?}");
        let mut map = self
            .map
            .lock()
            .map_err(|_| Error::gpu("pipeline cache poisoned"))?;
        if let Some(p) = map.get(&key) {
            return Ok(p.clone());
        }
        let src = source()?;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
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
        let p = Arc::new(pipeline);
        map.insert(key, p.clone());
        Ok(p)
    }

    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
