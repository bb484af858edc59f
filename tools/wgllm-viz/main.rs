//! `wgllm-viz`: a window that shows generation token by token — chips coloured by
//! probability, the alternatives at each step, branches, attention heatmaps and timing.
//!
//! With `--screenshot FILE.png` it runs headless: generates `--tokens N` tokens, renders one
//! frame offscreen and writes it as a PNG.

mod app;
mod attention;
mod chips;
mod gen;
mod screenshot;
mod timing;
mod window;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::sampling::SamplingParams;
use wgllm::{Error, Result};

use app::{App, LoadSettings};
use gen::RunState;

#[derive(Parser, Debug)]
#[command(name = "wgllm-viz", about = "Token-by-token generation visualizer")]
struct Args {
    /// GGUF model to load at start (a path can also be entered in the window).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt")]
    prompt: Option<String>,
    /// Tokens to generate per run.
    #[arg(short = 'n', long = "tokens", default_value_t = 32)]
    tokens: usize,
    /// Layers on the GPU (default all; 0 runs on the CPU without attention capture).
    #[arg(long = "gpu-layers")]
    gpu_layers: Option<u32>,
    /// Context size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 1024)]
    ctx: u32,
    /// Batch size for prompt processing.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch: u32,
    /// GPU adapter: index or part of its name.
    #[arg(long)]
    device: Option<String>,
    #[arg(long = "temp", default_value_t = 0.8)]
    temp: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    top_k: u32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    min_p: f32,
    #[arg(short = 's', long = "seed", default_value_t = 42)]
    seed: u64,
    /// Headless: generate, render one frame to this PNG and exit.
    #[arg(long)]
    screenshot: Option<PathBuf>,
    /// Screenshot size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1280x820")]
    size: String,
    /// Give up on a headless run after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
}

impl Args {
    fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }

    fn load(&self) -> Result<LoadSettings> {
        if self.batch == 0 || self.ctx == 0 {
            return Err(Error::invalid(
                "--ctx-size and --batch-size must be at least 1",
            ));
        }
        Ok(LoadSettings {
            gpu_layers: self.gpu_layers,
            n_ctx: self.ctx,
            n_batch: self.batch,
        })
    }
}

fn parse_size(s: &str) -> Result<(u32, u32)> {
    let bad = || {
        Error::invalid(format!(
            "--size {s:?}: expected WIDTHxHEIGHT, e.g. 1280x820"
        ))
    };
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let w = w.trim().parse().map_err(|_| bad())?;
    let h = h.trim().parse().map_err(|_| bad())?;
    Ok((w, h))
}

/// Wait for the worker until `done` holds, an error arrives or time runs out.
fn wait(app: &mut App, deadline: Instant, what: &str, done: impl Fn(&App) -> bool) -> Result<()> {
    loop {
        app.poll();
        if let Some(e) = &app.error {
            return Err(Error::invalid(e.clone()));
        }
        if done(app) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::invalid(format!("timed out while {what}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn headless(args: &Args, out: &std::path::Path) -> Result<()> {
    let (w, h) = parse_size(&args.size)?;
    let model = args
        .model
        .as_ref()
        .ok_or_else(|| Error::invalid("--screenshot needs -m MODEL"))?;
    let ctx = Arc::new(GpuContext::new(&DeviceOptions {
        device: args.device.clone(),
        ..Default::default()
    })?);
    let (tx, rx, worker) = gen::spawn(Box::new(|| {}))?;
    let mut app = App::new(tx, rx, Some(ctx.clone()), args.load()?);
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    app.model_path = model.display().to_string();
    app.params = args.params();
    app.max_new = args.tokens;
    if let Some(p) = &args.prompt {
        app.prompt = p.clone();
    }
    app.request_load();
    wait(&mut app, deadline, "loading the model", |a| !a.loading)?;
    app.request_start();
    wait(&mut app, deadline, "generating", |a| {
        a.state == RunState::Idle && !a.branches.is_empty()
    })?;
    // Show the last token that has attention recorded (an end-of-generation token is
    // never processed, so it has none), else the last token.
    app.selected = app.branches.get(app.current).and_then(|b| {
        b.tokens
            .iter()
            .rposition(|r| r.attention.is_some())
            .or_else(|| b.tokens.len().checked_sub(1))
    });
    if let (Some(m), Some(b)) = (&app.model, app.branches.get(app.current)) {
        let ids: Vec<u32> = b.tokens.iter().map(|r| r.id).collect();
        println!("{}", String::from_utf8_lossy(&m.tokenizer.decode(&ids)));
    }
    screenshot::capture(&ctx, w, h, out, |ui| app.ui(ui))?;
    app.quit();
    drop(app);
    let _ = worker.join();
    eprintln!("wrote {} ({w}x{h})", out.display());
    Ok(())
}

fn run(args: Args) -> Result<()> {
    if let Some(out) = &args.screenshot {
        return headless(&args, out);
    }
    window::run(window::WindowOptions {
        model: args.model.as_ref().map(|m| m.display().to_string()),
        prompt: args.prompt.clone(),
        device: args.device.clone(),
        load: args.load()?,
        params: args.params(),
        max_new: args.tokens,
    })
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
