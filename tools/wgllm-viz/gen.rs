//! The generation worker: owns the model session on its own thread so that the window
//! stays responsive while a step runs. The UI sends [`Cmd`]s and receives [`Event`]s.
//!
//! Every command that replaces the token sequence (start, branch, switch) carries an
//! `epoch`; the worker tags its events with the epoch they belong to, so the UI can drop
//! the late events of a sequence it has already left.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wgllm::cpu::backend::CpuModel;
use wgllm::engine::{load_engine, split, EngineOptions};
use wgllm::gguf::GgufFile;
use wgllm::gpu::GpuContext;
use wgllm::model::gpu_backend::{GpuModel, LoadOptions, Logits};
use wgllm::model::Config;
use wgllm::sampling::{log_prob, top_n_probs, Sampler, SamplingParams};
use wgllm::session::{Engine, Session};
use wgllm::tokenizer::Tokenizer;
use wgllm::{Error, Result};

/// Attention probabilities of one token's step: [layer][head][n_kv].
pub type Attention = Vec<Vec<Vec<f32>>>;

/// How many alternatives each token keeps.
pub const TOP_N: usize = 10;

/// One token of a sequence, with what the model thought when it was chosen.
#[derive(Clone, Debug)]
pub struct TokenRecord {
    pub id: u32,
    /// Part of the prompt (no distribution was sampled for it).
    pub prompt: bool,
    /// Probability of this token under the raw softmax of the step that chose it.
    pub prob: Option<f32>,
    /// Entropy of that distribution, in bits.
    pub entropy: Option<f32>,
    /// The most likely tokens of that distribution: (id, probability).
    pub top: Vec<(u32, f32)>,
    /// Attention of this token (as the step's input) over every position up to its own.
    pub attention: Option<Arc<Attention>>,
    /// Wall time of the step that processed this token.
    pub step_ms: f64,
}

/// How to load a model.
pub struct LoadReq {
    pub path: PathBuf,
    /// Layers on the GPU; `None` means all. 0 runs on the CPU.
    pub gpu_layers: Option<u32>,
    pub n_ctx: u32,
    pub n_batch: u32,
    /// The device shared with the window; `None` forces the CPU.
    pub ctx: Option<Arc<GpuContext>>,
}

pub enum Cmd {
    Load(LoadReq),
    /// Reset, process `prompt`, then generate up to `max_new` tokens.
    Start {
        prompt: String,
        params: SamplingParams,
        max_new: usize,
        epoch: u64,
    },
    Pause,
    /// Continue; from a finished state this starts another `max_new` tokens.
    Resume,
    /// Generate exactly one token, then pause.
    Step,
    Stop,
    SetParams(SamplingParams),
    SetMaxNew(usize),
    /// Keep the first `keep` tokens, append `token`, then continue generating.
    Branch {
        keep: usize,
        token: u32,
        epoch: u64,
    },
    /// Make the session hold `tokens` (re-feeding what differs), then pause.
    Switch {
        tokens: Vec<u32>,
        epoch: u64,
    },
    Quit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    Idle,
    Running,
    Paused,
}

pub struct ModelInfo {
    pub tokenizer: Arc<Tokenizer>,
    pub config: Config,
    pub description: String,
    /// Attention capture works with this engine.
    pub attention: bool,
    pub load_ms: f64,
}

pub enum Event {
    Loaded(Box<ModelInfo>),
    LoadFailed(String),
    /// The prompt was processed: its tokens (the last one with attention).
    Prompt {
        epoch: u64,
        tokens: Vec<TokenRecord>,
        ms: f64,
    },
    /// A generated token.
    Token {
        epoch: u64,
        record: TokenRecord,
    },
    /// The step of token `index` (already known to the UI, e.g. a branch) finished.
    Processed {
        epoch: u64,
        index: usize,
        attention: Option<Arc<Attention>>,
        step_ms: f64,
    },
    State(RunState),
    Error(String),
}

/// A GPU model that reads back its last token's attention after every step.
struct Capturing {
    model: GpuModel,
    last: Arc<Mutex<Option<Attention>>>,
}

impl Engine for Capturing {
    fn config(&self) -> &Config {
        &self.model.cfg
    }
    fn n_ctx(&self) -> u32 {
        self.model.n_ctx
    }
    fn max_batch(&self, mode: Logits) -> u32 {
        Engine::max_batch(&self.model, mode)
    }
    fn step(&mut self, tokens: &[u32], pos: u32, mode: Logits) -> Result<Vec<f32>> {
        let logits = self.model.step(tokens, pos, mode)?;
        let n_kv = pos.saturating_add(tokens.len() as u32);
        let att = self.model.attention(n_kv)?;
        if let Ok(mut slot) = self.last.lock() {
            *slot = Some(att);
        }
        Ok(logits)
    }
    fn device(&self) -> String {
        self.model.device()
    }
}

struct Loaded {
    session: Session,
    tokenizer: Arc<Tokenizer>,
    /// Filled by [`Capturing`] after every step; `None` when the engine cannot capture.
    attention: Option<Arc<Mutex<Option<Attention>>>>,
}

impl Loaded {
    fn take_attention(&self) -> Option<Arc<Attention>> {
        let slot = self.attention.as_ref()?;
        slot.lock().ok()?.take().map(Arc::new)
    }
}

/// Entropy of softmax(`logits`) in bits; NaN logits count as impossible.
pub fn entropy_bits(logits: &[f32]) -> f32 {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    if !max.is_finite() {
        return 0.0;
    }
    let mut z = 0.0f64;
    let mut s = 0.0f64;
    for &l in logits.iter().filter(|l| l.is_finite()) {
        let d = l as f64 - max;
        let e = d.exp();
        z += e;
        s += e * d;
    }
    // H = log Z - E[d], in nats; then to bits.
    let h = z.ln() - s / z;
    (h / std::f64::consts::LN_2).max(0.0) as f32
}

/// Build the engine `req` asks for and wrap it in a session.
fn load(req: LoadReq) -> Result<(Loaded, ModelInfo)> {
    let t0 = Instant::now();
    let file = GgufFile::open(&req.path)?;
    let config = Config::from_metadata(file.metadata())?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(file.metadata())?);
    let n_ctx = req.n_ctx.clamp(1, config.n_ctx_train.max(1));
    // llama.cpp's meaning of --gpu-layers: see `wgllm::engine::split`.
    let (first_gpu, head_gpu) = split(config.n_layer, req.gpu_layers);
    let (engine, attention, description): EngineParts = match &req.ctx {
        Some(ctx) if first_gpu == 0 && head_gpu => {
            gpu_engine(ctx, &file, &config, n_ctx, req.n_batch)?
        }
        _ if first_gpu == config.n_layer && !head_gpu => {
            let file = Arc::new(file);
            let m = CpuModel::load(file, config.clone(), n_ctx, req.n_batch, 0)?;
            let desc = format!("CPU, {} threads", m.n_threads());
            (Box::new(m), None, desc)
        }
        _ => {
            // A GPU/CPU split: the engine opens its own device and keeps no attention.
            let opts = EngineOptions {
                n_ctx,
                n_batch: req.n_batch,
                gpu_layers: req.gpu_layers,
                ..EngineOptions::default()
            };
            let e = load_engine(Arc::new(file), &config, &opts)?;
            let desc = format!(
                "{} of {} layers on the GPU",
                config.n_layer - first_gpu,
                config.n_layer
            );
            (e, None, desc)
        }
    };
    let info = ModelInfo {
        tokenizer: tokenizer.clone(),
        config,
        description,
        attention: attention.is_some(),
        load_ms: t0.elapsed().as_secs_f64() * 1000.0,
    };
    let session = Session::new(engine, req.n_batch);
    Ok((
        Loaded {
            session,
            tokenizer,
            attention,
        },
        info,
    ))
}

type EngineParts = (
    Box<dyn Engine>,
    Option<Arc<Mutex<Option<Attention>>>>,
    String,
);

fn gpu_engine(
    ctx: &Arc<GpuContext>,
    file: &GgufFile,
    config: &Config,
    n_ctx: u32,
    n_batch: u32,
) -> Result<EngineParts> {
    let opts = LoadOptions {
        n_ctx,
        n_batch,
        progress: false,
        capture_attention: true,
        ..LoadOptions::default()
    };
    let model = GpuModel::load(ctx.clone(), file, config.clone(), &opts)?;
    let last = Arc::new(Mutex::new(None));
    let desc = format!("GPU: {}", ctx.describe());
    Ok((
        Box::new(Capturing {
            model,
            last: last.clone(),
        }),
        Some(last),
        desc,
    ))
}

/// The worker's state; lives on its own thread.
pub struct Worker {
    rx: Receiver<Cmd>,
    tx: Sender<Event>,
    wake: Box<dyn Fn() + Send>,
    model: Option<Loaded>,
    sampler: Sampler,
    params: SamplingParams,
    state: RunState,
    max_new: usize,
    remaining: usize,
    epoch: u64,
}

/// Start the worker thread. `wake` is called after every event (to repaint the window).
pub fn spawn(
    wake: Box<dyn Fn() + Send>,
) -> Result<(Sender<Cmd>, Receiver<Event>, std::thread::JoinHandle<()>)> {
    let (ctx_tx, rx) = std::sync::mpsc::channel();
    let (tx, ev_rx) = std::sync::mpsc::channel();
    let params = SamplingParams::default();
    let worker = Worker {
        rx,
        tx,
        wake,
        model: None,
        sampler: Sampler::new(params.clone()),
        params,
        state: RunState::Idle,
        max_new: 64,
        remaining: 0,
        epoch: 0,
    };
    let handle = std::thread::Builder::new()
        .name("wgllm-viz-gen".into())
        .spawn(move || worker.run())
        .map_err(|e| Error::invalid(format!("cannot start the generation thread: {e}")))?;
    Ok((ctx_tx, ev_rx, handle))
}

impl Worker {
    fn send(&self, e: Event) {
        // The UI may be gone while closing; nothing to do then.
        let _ = self.tx.send(e);
        (self.wake)();
    }

    fn set_state(&mut self, s: RunState) {
        if self.state != s {
            self.state = s;
            self.send(Event::State(s));
        }
    }

    fn run(mut self) {
        loop {
            let cmd = if self.state == RunState::Running {
                match self.rx.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return,
                }
            } else {
                match self.rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            };
            match cmd {
                Some(Cmd::Quit) => return,
                Some(c) => self.guarded(|w| w.handle(c)),
                None => self.guarded(|w| w.generate_one()),
            }
        }
    }

    /// Run `f`, turning an error or a panic into an event and an idle state, so that a
    /// failing step never takes the window down.
    fn guarded(&mut self, f: impl FnOnce(&mut Self) -> Result<()>) {
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        let msg = match out {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(p) => panic_text(&p),
        };
        self.send(Event::Error(msg));
        // Always tell the UI, which may have assumed a run had started.
        self.state = RunState::Idle;
        self.send(Event::State(RunState::Idle));
    }

    fn handle(&mut self, cmd: Cmd) -> Result<()> {
        match cmd {
            Cmd::Load(req) => self.load(req),
            Cmd::Start {
                prompt,
                params,
                max_new,
                epoch,
            } => {
                self.epoch = epoch;
                self.params = params.clone();
                self.sampler = Sampler::new(params);
                self.max_new = max_new;
                self.start(&prompt)
            }
            Cmd::Pause => {
                if self.state == RunState::Running {
                    self.set_state(RunState::Paused);
                }
                Ok(())
            }
            Cmd::Resume => {
                if self.model.is_some() && self.has_logits() {
                    if self.state == RunState::Idle || self.remaining == 0 {
                        self.remaining = self.max_new;
                    }
                    self.set_state(RunState::Running);
                }
                Ok(())
            }
            Cmd::Step => {
                if self.model.is_some() && self.has_logits() {
                    self.remaining = self.remaining.max(1);
                    self.generate_one()?;
                    if self.state != RunState::Idle {
                        self.set_state(RunState::Paused);
                    }
                }
                Ok(())
            }
            Cmd::Stop => {
                self.remaining = 0;
                self.set_state(RunState::Idle);
                Ok(())
            }
            Cmd::SetParams(p) => {
                self.params = p.clone();
                self.sampler = Sampler::new(p);
                Ok(())
            }
            Cmd::SetMaxNew(n) => {
                self.max_new = n;
                Ok(())
            }
            Cmd::Branch { keep, token, epoch } => {
                self.epoch = epoch;
                self.branch(keep, token)
            }
            Cmd::Switch { tokens, epoch } => {
                self.epoch = epoch;
                self.switch(&tokens)
            }
            Cmd::Quit => Ok(()),
        }
    }

    fn has_logits(&self) -> bool {
        self.model
            .as_ref()
            .is_some_and(|m| !m.session.logits.is_empty())
    }

    fn loaded(&mut self) -> Result<&mut Loaded> {
        self.model
            .as_mut()
            .ok_or_else(|| Error::invalid("no model is loaded"))
    }

    fn load(&mut self, req: LoadReq) -> Result<()> {
        // Free the old model first: two models may not fit together.
        self.model = None;
        self.set_state(RunState::Idle);
        match load(req) {
            Ok((loaded, info)) => {
                self.model = Some(loaded);
                self.send(Event::Loaded(Box::new(info)));
            }
            Err(e) => self.send(Event::LoadFailed(e.to_string())),
        }
        Ok(())
    }

    fn start(&mut self, prompt: &str) -> Result<()> {
        self.set_state(RunState::Idle);
        let epoch = self.epoch;
        let m = self.loaded()?;
        let ids = m.tokenizer.encode(prompt, m.tokenizer.add_bos(), true)?;
        if ids.is_empty() {
            return Err(Error::invalid("the prompt is empty"));
        }
        m.session.reset();
        let t0 = Instant::now();
        m.session.feed(&ids)?;
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        let last_att = m.take_attention();
        let n = ids.len();
        let tokens = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| TokenRecord {
                id,
                prompt: true,
                prob: None,
                entropy: None,
                top: Vec::new(),
                attention: if i + 1 == n { last_att.clone() } else { None },
                step_ms: 0.0,
            })
            .collect();
        self.send(Event::Prompt { epoch, tokens, ms });
        self.remaining = self.max_new;
        if self.remaining > 0 {
            self.set_state(RunState::Running);
        } else {
            self.send(Event::State(RunState::Idle));
        }
        Ok(())
    }

    /// Sample one token from the current logits and process it.
    fn generate_one(&mut self) -> Result<()> {
        if self.remaining == 0 {
            self.set_state(RunState::Idle);
            return Ok(());
        }
        let epoch = self.epoch;
        let sampler = &mut self.sampler;
        let Some(m) = self.model.as_mut() else {
            self.set_state(RunState::Idle);
            return Ok(());
        };
        let logits = &m.session.logits;
        if logits.is_empty() {
            self.set_state(RunState::Idle);
            return Ok(());
        }
        let id = sampler.sample(logits, &m.session.history);
        let mut record = TokenRecord {
            id,
            prompt: false,
            prob: Some(log_prob(logits, id).exp()),
            entropy: Some(entropy_bits(logits)),
            top: top_n_probs(logits, TOP_N),
            attention: None,
            step_ms: 0.0,
        };
        let eog = m.tokenizer.is_eog(id);
        let full = m.session.n_past() >= m.session.n_ctx();
        if !eog && !full {
            let t0 = Instant::now();
            m.session.push(id)?;
            record.step_ms = t0.elapsed().as_secs_f64() * 1000.0;
            record.attention = m.take_attention();
        }
        self.send(Event::Token { epoch, record });
        self.remaining -= 1;
        if eog || full || self.remaining == 0 {
            self.remaining = 0;
            self.set_state(RunState::Idle);
        }
        Ok(())
    }

    fn branch(&mut self, keep: usize, token: u32) -> Result<()> {
        let epoch = self.epoch;
        let m = self.loaded()?;
        if keep > m.session.history.len() {
            return Err(Error::invalid(format!(
                "branch at token {keep} past the {} cached",
                m.session.history.len()
            )));
        }
        m.session.truncate(keep as u32);
        let t0 = Instant::now();
        m.session.push(token)?;
        let step_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let attention = m.take_attention();
        let eog = m.tokenizer.is_eog(token);
        self.send(Event::Processed {
            epoch,
            index: keep,
            attention,
            step_ms,
        });
        self.remaining = if eog { 0 } else { self.max_new };
        // The UI assumed a run; say what it really is.
        self.state = if eog {
            RunState::Idle
        } else {
            RunState::Running
        };
        self.send(Event::State(self.state));
        Ok(())
    }

    fn switch(&mut self, tokens: &[u32]) -> Result<()> {
        self.set_state(RunState::Idle);
        let m = self.loaded()?;
        if tokens.is_empty() {
            m.session.reset();
            return Ok(());
        }
        let common = m
            .session
            .history
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        // Re-feed at least the last token: its logits are what the next sample needs.
        let keep = common.min(tokens.len() - 1);
        m.session.truncate(keep as u32);
        m.session.feed(&tokens[keep..])?;
        // The attention of a re-fed batch belongs to the branch's last token, which the UI
        // already holds; drop it.
        let _ = m.take_attention();
        self.remaining = 0;
        self.set_state(RunState::Paused);
        Ok(())
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("internal error: {what}")
}

#[cfg(test)]
mod tests {
    use super::entropy_bits;

    #[test]
    fn entropy_of_uniform_and_peaked() {
        // Four equal logits: exactly 2 bits.
        assert!((entropy_bits(&[1.0; 4]) - 2.0).abs() < 1e-5);
        // One certain token: 0 bits.
        assert!(entropy_bits(&[0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]) < 1e-6);
        // p = (0.5, 0.25, 0.25): 1.5 bits.
        let l = [2f32.ln(), 0.0, 0.0];
        assert!((entropy_bits(&l) - 1.5).abs() < 1e-5);
    }
}
