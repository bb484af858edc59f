//! Options shared by the subcommands that load a model.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use wgllm::engine::{load_engine, open_gpu, EngineOptions, Gpu};
use wgllm::gguf::GgufFile;
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::model::Config;
use wgllm::session::Session;
use wgllm::session::{Engine, CPU_DEVICE};
use wgllm::tokenizer::Tokenizer;
use wgllm::{Error, Result};

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Path to a GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Context size in tokens (default: 4096, at most the model's trained context; `run -n N`
    /// sizes it to the prompt plus N, rounded up to 256).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx: Option<u32>,
    /// Batch size for prompt processing.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: u32,
    /// GPU adapter: index from `wgllm devices` or part of its name (software adapters
    /// such as lavapipe's llvmpipe run only when named or given --gpu-layers).
    #[arg(long)]
    pub device: Option<String>,
    /// Layers to run on the GPU (the last N; N above the layer count also moves the
    /// output layer). 0 runs on the CPU only and needs no GPU. Default: all, on a
    /// hardware GPU; on the CPU when the machine has none.
    #[arg(long = "gpu-layers", visible_alias = "ngl", alias = "n-gpu-layers")]
    pub gpu_layers: Option<u32>,
    /// CPU threads (default: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 means greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: u32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (default: from the clock).
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> wgllm::sampling::SamplingParams {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        wgllm::sampling::SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        }
    }
}

/// A loaded model ready to run.
pub struct Loaded {
    pub session: Session,
    pub tokenizer: Tokenizer,
    pub config: Config,
    pub load_ms: f64,
    pub device: String,
}

pub fn open(path: &std::path::Path) -> Result<GgufFile> {
    GgufFile::open(path)
}

/// Open the file, build the tokenizer and upload the model.
pub fn load(args: &ModelArgs, progress: bool) -> Result<Loaded> {
    Opened::new(args)?.load(args, progress, (None, None))
}

/// A model file opened and its tokenizer built, before the weights are uploaded: what a
/// command needs to size the context from its prompt.
pub struct Opened {
    file: GgufFile,
    pub config: Config,
    pub tokenizer: Tokenizer,
    /// The GPU, opened on a thread of its own while the tokenizer builds (a driver's
    /// start, 35-45 ms on lavapipe, about what Gemma 3's vocabulary takes).
    gpu: Option<std::thread::JoinHandle<Result<Option<Arc<GpuContext>>>>>,
    t0: Instant,
    /// The adapter asked for, and whether to prefer a hardware GPU ([`device_choice`]):
    /// what the GPU opens with, and the load after it.
    device: (DeviceOptions, bool),
}

/// Contexts sized from a request are rounded up to this many positions.
const CTX_STEP: usize = 256;

impl Opened {
    pub fn new(args: &ModelArgs) -> Result<Opened> {
        Opened::decoding(args, None)
    }

    /// As [`Opened::new`], for a command that will decode at most `tokens` single tokens
    /// where it says.
    pub fn decoding(args: &ModelArgs, tokens: Option<usize>) -> Result<Opened> {
        let t0 = Instant::now();
        let device = device_choice(args, tokens);
        // Only where the load would open one: not with --gpu-layers 0.
        let gpu = (args.gpu_layers != Some(0)).then(|| {
            let (device, hardware) = device.clone();
            std::thread::spawn(move || open_gpu(&device, hardware))
        });
        let file = open(&args.model)?;
        let config = Config::from_metadata(file.metadata())?;
        let tokenizer = Tokenizer::from_gguf(file.metadata())?;
        Ok(Opened {
            file,
            config,
            tokenizer,
            gpu,
            t0,
            device,
        })
    }

    /// Uploads the model. The context is `-c`; without it, `need` positions (rounded up,
    /// as llama.cpp's simple example sizes its context to the request) where the caller
    /// knows them, else the trained context up to 4096. The KV cache is allocated whole,
    /// so a context larger than the request only costs memory. `prompt`, the prompt's
    /// tokens where known, lets the kernels of its first step compile during the upload.
    pub fn load(
        self,
        args: &ModelArgs,
        progress: bool,
        (need, prompt): (Option<usize>, Option<usize>),
    ) -> Result<Loaded> {
        let Opened {
            file,
            config,
            tokenizer,
            gpu,
            t0,
            device: (device, auto),
        } = self;
        let default = config.n_ctx_train.min(4096);
        let n_ctx = match args.ctx {
            Some(0) | None => match need {
                Some(n) => u32::try_from(n.next_multiple_of(CTX_STEP))
                    .unwrap_or(u32::MAX)
                    .min(default),
                None => default,
            },
            Some(c) => {
                if c > config.n_ctx_train {
                    eprintln!(
                        "warning: context {c} is larger than the model's trained context {}; \
                         quality may degrade past it",
                        config.n_ctx_train
                    );
                }
                c
            }
        };
        if args.batch == 0 {
            return Err(Error::invalid("--batch-size must be at least 1"));
        }
        let gpu = match gpu {
            Some(h) => Gpu::Opened(
                h.join()
                    .map_err(|_| Error::gpu("the thread opening the GPU panicked"))??,
            ),
            None => Gpu::ToOpen,
        };
        let opts = EngineOptions {
            n_ctx,
            n_batch: args.batch,
            gpu_layers: args.gpu_layers,
            threads: args.threads,
            device,
            prefer_hardware: auto,
            progress,
            capture_attention: false,
            first_batch: prompt.map(wgllm::session::first_batch),
            gpu,
        };
        let engine = load_or_offload(Arc::new(file), &config, opts)?;
        let mut device = engine.device();
        if auto && device == CPU_DEVICE {
            device.push_str(
                " (no hardware GPU found; `wgllm devices` lists the adapters, --device N picks one)",
            );
        }
        let session = Session::new(engine, args.batch);
        Ok(Loaded {
            session,
            tokenizer,
            config,
            load_ms: t0.elapsed().as_secs_f64() * 1000.0,
            device,
        })
    }
}

/// The adapter `args` name, and whether to prefer a hardware GPU: with no placement
/// asked for, software adapters run only when named. A run of `tokens` single tokens
/// says whether it is too short for chains ([`wgllm::gpu::context::FEW_TOKENS`]).
fn device_choice(args: &ModelArgs, tokens: Option<usize>) -> (DeviceOptions, bool) {
    let device = DeviceOptions {
        device: args.device.clone(),
        few_tokens: tokens.is_some_and(|n| n < wgllm::gpu::context::FEW_TOKENS),
        ..Default::default()
    };
    (device, args.gpu_layers.is_none() && args.device.is_none())
}

/// Text from `-p`, or the contents of `-f` (exact bytes, must be UTF-8).
pub fn prompt_text(prompt: &Option<String>, file: &Option<PathBuf>) -> Result<Option<String>> {
    match (prompt, file) {
        (Some(_), Some(_)) => Err(Error::invalid("give either -p or -f, not both")),
        (Some(p), None) => Ok(Some(p.clone())),
        (None, Some(f)) => {
            let bytes = std::fs::read(f).map_err(|e| Error::Io {
                path: f.clone(),
                source: e,
            })?;
            String::from_utf8(bytes).map(Some).map_err(|e| {
                Error::invalid(format!(
                    "{}: not UTF-8 at byte {}",
                    f.display(),
                    e.utf8_error().valid_up_to()
                ))
            })
        }
        (None, None) => Ok(None),
    }
}

/// Load the engine; when the model does not fit the GPU (memory or limits), keep
/// halving the GPU layers, with a message, rather than failing.
fn load_or_offload(
    file: Arc<GgufFile>,
    cfg: &Config,
    mut opts: EngineOptions,
) -> Result<Box<dyn Engine>> {
    loop {
        match load_engine(file.clone(), cfg, &opts) {
            Ok(e) => return Ok(e),
            Err(Error::Gpu(msg)) if fits_less(&msg) && opts.gpu_layers != Some(0) => {
                let now = opts
                    .gpu_layers
                    .unwrap_or(cfg.n_layer + 1)
                    .min(cfg.n_layer + 1);
                let next = now / 2;
                eprintln!("warning: {msg}\nwarning: retrying with --gpu-layers {next}");
                opts.gpu_layers = Some(next);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Errors that fewer GPU layers can cure.
fn fits_less(msg: &str) -> bool {
    msg.contains("out of GPU memory") || msg.contains("limit")
}
