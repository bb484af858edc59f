//! Choosing where a model runs: all layers on the GPU, all on the CPU, or split with
//! `--gpu-layers N` as llama.cpp splits: the last N repeating layers on the GPU (all of
//! them when N is their number), the token embedding on the CPU, and the output layer
//! on the GPU only when N exceeds the number of repeating layers. Each layer's KV cache
//! lives where the layer runs, and the residual stream crosses the boundary once per
//! direction per step.

use std::sync::Arc;

use crate::cpu::backend::CpuModel;
use crate::gguf::GgufFile;
use crate::gpu::{DeviceOptions, GpuContext};
use crate::model::gpu_backend::{GpuModel, Input, LoadOptions, Logits, Output};
use crate::model::Config;
use crate::session::Engine;
use crate::{Error, Result};

#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub n_ctx: u32,
    pub n_batch: u32,
    /// Layers on the GPU (`None`: all, with the output layer). 0 needs no GPU at all.
    pub gpu_layers: Option<u32>,
    /// CPU threads (0: one per core).
    pub threads: usize,
    pub device: DeviceOptions,
    /// With no adapter named: run on the CPU backend when the machine has no hardware
    /// GPU, instead of on a software adapter (lavapipe, llvmpipe), as llama.cpp does.
    /// The CPU backend is the faster of the two on the same cores.
    pub prefer_hardware: bool,
    pub progress: bool,
    pub capture_attention: bool,
    /// Tokens in the first step, where known ([`LoadOptions::first_batch`]).
    pub first_batch: Option<u32>,
    /// The GPU to run on, where the caller opened it ahead ([`open_gpu`]).
    pub gpu: Gpu,
}

/// The GPU a load runs on.
#[derive(Clone, Default)]
pub enum Gpu {
    /// The load opens the one [`EngineOptions::device`] and
    /// [`EngineOptions::prefer_hardware`] ask for.
    #[default]
    ToOpen,
    /// Opened ahead by [`open_gpu`] with the same options, while the caller did other
    /// work (a tokenizer's build): a context, or `None` where no hardware GPU was found.
    Opened(Option<Arc<GpuContext>>),
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gpu::ToOpen => write!(f, "ToOpen"),
            Gpu::Opened(None) => write!(f, "Opened(none)"),
            Gpu::Opened(Some(c)) => write!(f, "Opened({})", c.info.name),
        }
    }
}

/// Opens the GPU named in `device`, else with `prefer_hardware` a hardware GPU (`None`
/// where there is none: the model runs on the CPU), else the best adapter.
pub fn open_gpu(device: &DeviceOptions, prefer_hardware: bool) -> Result<Option<Arc<GpuContext>>> {
    let adapter = if prefer_hardware && device.device.is_none() {
        match crate::gpu::context::hardware_adapter() {
            Some(a) => a,
            None => return Ok(None),
        }
    } else {
        crate::gpu::context::pick_adapter(device)?
    };
    Ok(Some(Arc::new(GpuContext::from_adapter(adapter, device)?)))
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_ctx: 4096,
            n_batch: 512,
            gpu_layers: None,
            threads: 0,
            device: DeviceOptions::default(),
            prefer_hardware: false,
            progress: false,
            capture_attention: false,
            first_batch: None,
            gpu: Gpu::ToOpen,
        }
    }
}

/// Where the layers go for `gpu_layers` on a model of `n_layer` layers:
/// (first GPU layer, whether the output layer runs on the GPU).
pub fn split(n_layer: u32, gpu_layers: Option<u32>) -> (u32, bool) {
    let ngl = gpu_layers.unwrap_or(u32::MAX);
    let on_gpu = ngl.min(n_layer);
    (n_layer - on_gpu, ngl > n_layer)
}

/// Load `file` onto the devices `opts` asks for.
pub fn load_engine(
    file: Arc<GgufFile>,
    cfg: &Config,
    opts: &EngineOptions,
) -> Result<Box<dyn Engine>> {
    let (first_gpu, head_gpu) = split(cfg.n_layer, opts.gpu_layers);
    let cpu = |layers: std::ops::Range<u32>| {
        CpuModel::load_layers(
            file.clone(),
            cfg.clone(),
            layers,
            opts.n_ctx,
            opts.n_batch,
            opts.threads,
        )
    };
    if first_gpu == cfg.n_layer && !head_gpu {
        return Ok(Box::new(cpu(0..cfg.n_layer)?));
    }
    let ctx = match &opts.gpu {
        Gpu::Opened(ctx) => ctx.clone(),
        Gpu::ToOpen => open_gpu(&opts.device, opts.prefer_hardware)?,
    };
    let Some(ctx) = ctx else {
        return Ok(Box::new(cpu(0..cfg.n_layer)?));
    };
    let gpu_opts = |layers: std::ops::Range<u32>, head: bool| LoadOptions {
        // A GPU part without the first layer, or without the output layer, takes the
        // residual stream from the CPU, which embeds the tokens from the file's map:
        // the GPU then needs no copy of the embedding unless it runs a tied head.
        hidden_in: !(layers.start == 0 && head),
        layers: Some(layers),
        head,
        n_ctx: opts.n_ctx,
        n_batch: opts.n_batch,
        progress: opts.progress,
        capture_attention: opts.capture_attention,
        first_batch: opts.first_batch,
    };
    if first_gpu == 0 && head_gpu {
        let m = GpuModel::load(ctx, &file, cfg.clone(), &gpu_opts(0..cfg.n_layer, true))?;
        return Ok(Box::new(m));
    }
    // The GPU part starts after the CPU layers. With every layer on the GPU and the
    // output layer on the CPU (N equal to the layer count), the CPU part is the
    // embedding and the output layer alone.
    let gpu = GpuModel::load(
        ctx,
        &file,
        cfg.clone(),
        &gpu_opts(first_gpu..cfg.n_layer, head_gpu),
    )?;
    let cpu = cpu(0..first_gpu)?;
    Ok(Box::new(Hybrid { cpu, gpu, head_gpu }))
}

/// The embedding and the first layers (none when N is the layer count) on the CPU, the
/// rest on the GPU, and the output layer on either.
pub struct Hybrid {
    cpu: CpuModel,
    gpu: GpuModel,
    head_gpu: bool,
}

impl Engine for Hybrid {
    fn config(&self) -> &Config {
        &self.cpu.cfg
    }

    fn settle(&self) -> Result<()> {
        self.gpu.settle()
    }

    fn device(&self) -> String {
        self.gpu.device()
    }

    fn n_ctx(&self) -> u32 {
        self.cpu.n_ctx.min(self.gpu.n_ctx)
    }

    fn max_batch(&self, mode: Logits) -> u32 {
        let gpu = match (mode, self.head_gpu) {
            (Logits::All, true) => self.gpu.max_batch_all_logits(),
            _ => self.gpu.max_batch,
        };
        gpu.min(self.cpu.max_batch)
    }

    fn compiles_for(&self, n: u32, pos: u32) -> bool {
        self.gpu.compiles_for(n, pos)
    }

    fn step(&mut self, tokens: &[u32], pos: u32, mode: Logits) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::invalid("a step needs at least one token"));
        }
        let hidden = self.cpu.step_to_hidden(tokens, pos)?;
        if self.head_gpu {
            return self
                .gpu
                .step_io(Input::Hidden(&hidden), pos, Output::Logits(mode));
        }
        let out = self
            .gpu
            .step_io(Input::Hidden(&hidden), pos, Output::Hidden)?;
        self.cpu.head_from_hidden(&out, pos, mode)
    }
}
