//! A conversation with a model: the KV cache position, the token history, batched
//! prompt processing, the generation loop and its timings.

use std::time::Instant;

use crate::model::gpu_backend::Logits;
use crate::model::Config;
use crate::sampling::{Cand, Sampler};
use crate::{Error, Result};

/// Something that runs the model forward: the whole model on the GPU, on the CPU, or
/// split between them.
pub trait Engine: Send {
    fn config(&self) -> &Config;
    fn n_ctx(&self) -> u32;
    /// Largest batch one `step` takes for `mode`.
    fn max_batch(&self, mode: Logits) -> u32;
    /// Run `tokens` at positions `pos..` and return logits (last token, or all).
    fn step(&mut self, tokens: &[u32], pos: u32, mode: Logits) -> Result<Vec<f32>>;
    /// Run `tokens` at positions `pos..` and return the greedy next token
    /// ([`crate::sampling::argmax`] of the last token's logits). Engines whose output
    /// layer runs on a GPU choose it there and read back no logits.
    fn step_argmax(&mut self, tokens: &[u32], pos: u32) -> Result<u32> {
        Ok(crate::sampling::argmax(&self.step(
            tokens,
            pos,
            Logits::Last,
        )?))
    }
    /// Run `tokens` at positions `pos..` and return candidates of the last token's
    /// logits for top-`k` sampling after a penalty on the distinct tokens `listed`: the
    /// `k + listed.len()` best and the listed ones, at least, in any order
    /// ([`crate::sampling::candidates`]). Engines whose output layer runs on a GPU
    /// choose them there and read back a few thousand words.
    fn step_top_k(
        &mut self,
        tokens: &[u32],
        pos: u32,
        k: u32,
        listed: &[u32],
    ) -> Result<Vec<Cand>> {
        let logits = self.step(tokens, pos, Logits::Last)?;
        Ok(crate::sampling::candidates(&logits, k as usize, listed))
    }
    /// Where the model runs, for people: [`CPU_DEVICE`], or the GPU layers and the
    /// adapter.
    fn device(&self) -> String;
    /// Whether a step of `n` tokens at `pos` would first compile kernels (a GPU's
    /// batch builds that no step has run yet).
    fn compiles_for(&self, _n: u32, _pos: u32) -> bool {
        false
    }
    /// Waits for what the engine builds in the background for later steps (a GPU's
    /// chains, `ops::chain`), so that the steps after run as fast as they will.
    fn settle(&self) -> Result<()> {
        Ok(())
    }
}

/// Prompts of at most this many tokens run one token at a time where a batch of their
/// size would first compile its kernels: on lavapipe, Gemma 3's builds for a batch of
/// two take about 240 ms of compiling, while its two tokens one at a time take about
/// 35 ms more than the batch (docs/perf.md). [`first_batch`] leaves their builds out
/// of the upload.
pub const SHORT_PROMPT: usize = 2;

/// The first step's size to prepare the kernels of, for a prompt of `n` tokens: a
/// short prompt ([`SHORT_PROMPT`]) runs single tokens.
pub fn first_batch(n: usize) -> u32 {
    if n <= SHORT_PROMPT {
        1
    } else {
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// [`Engine::device`] of a model that runs on the CPU alone.
pub const CPU_DEVICE: &str = "CPU";

impl Engine for crate::model::gpu_backend::GpuModel {
    fn config(&self) -> &Config {
        &self.cfg
    }
    fn n_ctx(&self) -> u32 {
        self.n_ctx
    }
    fn max_batch(&self, mode: Logits) -> u32 {
        match mode {
            Logits::Last => self.max_batch,
            Logits::All => self.max_batch_all_logits(),
        }
    }
    fn step(&mut self, tokens: &[u32], pos: u32, mode: Logits) -> Result<Vec<f32>> {
        crate::model::gpu_backend::GpuModel::step(self, tokens, pos, mode)
    }
    fn step_argmax(&mut self, tokens: &[u32], pos: u32) -> Result<u32> {
        use crate::model::gpu_backend::Input;
        self.step_argmax_io(Input::Tokens(tokens), pos)
    }
    fn step_top_k(
        &mut self,
        tokens: &[u32],
        pos: u32,
        k: u32,
        listed: &[u32],
    ) -> Result<Vec<Cand>> {
        use crate::model::gpu_backend::Input;
        self.step_top_k_io(Input::Tokens(tokens), pos, k, listed)
    }
    fn compiles_for(&self, n: u32, pos: u32) -> bool {
        crate::model::gpu_backend::GpuModel::compiles_for(self, n, pos)
    }
    fn settle(&self) -> Result<()> {
        self.wait_for_chains()
    }
    fn device(&self) -> String {
        format!(
            "{}/{} layers{} on GPU [{} ({:?})]",
            self.layers.len(),
            self.cfg.n_layer,
            if self.head { " + output" } else { "" },
            self.ctx.info.name,
            self.ctx.info.backend
        )
    }
}

/// Time spent and tokens processed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_ms: f64,
    pub gen_tokens: usize,
    pub gen_ms: f64,
}

impl Timings {
    pub fn prompt_tps(&self) -> f64 {
        per_second(self.prompt_tokens, self.prompt_ms)
    }
    pub fn gen_tps(&self) -> f64 {
        per_second(self.gen_tokens, self.gen_ms)
    }
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

/// What a step keeps of the model's output for the next pick ([`Session::sample`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Keep {
    /// Every logit, in [`Session::logits`].
    #[default]
    Logits,
    /// The greedy next token alone, chosen where the output layer runs (on a GPU: no
    /// logits read back), for samplers that take the argmax
    /// ([`Sampler::is_plain_greedy`]).
    Greedy,
    /// The k best logits and those the penalty changes alone, chosen where the output
    /// layer runs (on a GPU: a few thousand words read back instead of every logit),
    /// for samplers that pick from their top-k ([`Sampler::picks_from_top_k`]), whose
    /// penalty looks at the last `window` tokens ([`Sampler::penalty_window`]).
    TopK { k: u32, window: usize },
}

impl Keep {
    /// The least a step over `n_vocab` logits must keep for `sampler`'s picks.
    pub fn for_sampler(sampler: &Sampler, n_vocab: u32) -> Keep {
        if sampler.is_plain_greedy() {
            return Keep::Greedy;
        }
        match sampler.picks_from_top_k() {
            Some(k) if k < n_vocab => Keep::TopK {
                k,
                window: sampler.penalty_window(),
            },
            _ => Keep::Logits,
        }
    }
}

pub struct Session {
    pub engine: Box<dyn Engine>,
    /// Tokens held in the KV cache, in order.
    pub history: Vec<u32>,
    /// Logits after the last processed token.
    pub logits: Vec<f32>,
    pub timings: Timings,
    /// Batch size for prompt processing.
    pub n_batch: u32,
    /// What each step keeps for the next pick: set it with [`Keep::for_sampler`] of
    /// the sampler that [`sample`](Self::sample) is given.
    pub keep: Keep,
    /// The greedy next token, after a step that kept only that.
    greedy_next: Option<u32>,
    /// Top-k's candidates (and the penalised tokens'), after a step that kept only
    /// those.
    best: Vec<Cand>,
}

impl Session {
    pub fn new(engine: Box<dyn Engine>, n_batch: u32) -> Session {
        Session {
            engine,
            history: Vec::new(),
            logits: Vec::new(),
            timings: Timings::default(),
            n_batch: n_batch.max(1),
            keep: Keep::Logits,
            greedy_next: None,
            best: Vec::new(),
        }
    }

    pub fn n_past(&self) -> u32 {
        self.history.len() as u32
    }

    pub fn n_ctx(&self) -> u32 {
        self.engine.n_ctx()
    }

    /// Forget everything in the KV cache.
    pub fn reset(&mut self) {
        self.history.clear();
        self.logits.clear();
        self.greedy_next = None;
        self.best.clear();
    }

    /// Drop cached positions from `n` on (so the next tokens overwrite them).
    pub fn truncate(&mut self, n: u32) {
        self.history.truncate(n as usize);
        self.greedy_next = None;
        self.best.clear();
    }

    /// Tokens per step for steps that return `mode`'s logits: the session's batch, as
    /// far as the engine takes it.
    fn batch(&self, mode: Logits) -> usize {
        self.n_batch.min(self.engine.max_batch(mode)).max(1) as usize
    }

    fn check_room(&self, n: usize) -> Result<()> {
        let need = self.history.len() + n;
        if need > self.n_ctx() as usize {
            return Err(Error::invalid(format!(
                "{need} tokens do not fit the context of {} (raise -c, up to the model's trained {})",
                self.n_ctx(),
                self.engine.config().n_ctx_train
            )));
        }
        Ok(())
    }

    /// Process `tokens` (a prompt) in batches; afterwards the session holds what
    /// [`keep`](Self::keep) says of the next token's logits (see
    /// [`sample`](Self::sample)): `self.logits` is left empty unless that is all of them.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Ok(());
        }
        self.check_room(tokens.len())?;
        let t0 = Instant::now();
        let mut batch = self.batch(Logits::Last);
        let n = tokens.len().min(batch) as u32;
        if tokens.len() <= SHORT_PROMPT && self.engine.compiles_for(n, self.n_past()) {
            batch = 1;
        }
        let n_chunks = tokens.len().div_ceil(batch);
        for (i, chunk) in tokens.chunks(batch).enumerate() {
            // Only the last chunk's output is sampled from.
            let keep = if i + 1 == n_chunks {
                self.keep
            } else {
                Keep::Logits
            };
            self.run(chunk, keep)?;
            self.history.extend_from_slice(chunk);
        }
        self.timings.prompt_tokens += tokens.len();
        self.timings.prompt_ms += t0.elapsed().as_secs_f64() * 1000.0;
        Ok(())
    }

    /// Process one generated token; afterwards the session holds what
    /// [`keep`](Self::keep) says of the next token's logits.
    pub fn push(&mut self, token: u32) -> Result<()> {
        self.check_room(1)?;
        let t0 = Instant::now();
        self.run(&[token], self.keep)?;
        self.history.push(token);
        self.timings.gen_tokens += 1;
        self.timings.gen_ms += t0.elapsed().as_secs_f64() * 1000.0;
        Ok(())
    }

    /// One step at the end of the history, keeping `keep` of its output.
    fn run(&mut self, tokens: &[u32], keep: Keep) -> Result<()> {
        let pos = self.n_past();
        self.logits.clear();
        self.greedy_next = None;
        self.best.clear();
        match keep {
            Keep::Logits => self.logits = self.engine.step(tokens, pos, Logits::Last)?,
            Keep::Greedy => self.greedy_next = Some(self.engine.step_argmax(tokens, pos)?),
            Keep::TopK { k, window } => {
                let listed = self.penalised_after(tokens, window);
                self.best = self.engine.step_top_k(tokens, pos, k, &listed)?;
            }
        }
        Ok(())
    }

    /// The distinct tokens among the last `window` of the history followed by `tokens`.
    fn penalised_after(&self, tokens: &[u32], window: usize) -> Vec<u32> {
        let skip = (self.history.len() + tokens.len()).saturating_sub(window);
        let tail: Vec<u32> = self
            .history
            .iter()
            .chain(tokens)
            .skip(skip)
            .copied()
            .collect();
        crate::sampling::penalised_ids(&tail, window)
    }

    /// The next token: the greedy one where the last step kept only that, `sampler`'s
    /// draw from the best candidates where it kept those, else `sampler`'s pick from
    /// the logits. `sampler` is the one [`keep`](Self::keep) was set for.
    pub fn sample(&self, sampler: &mut Sampler) -> u32 {
        match self.greedy_next {
            Some(id) => id,
            None if !self.best.is_empty() => sampler.sample_best(&self.best, &self.history),
            None => sampler.sample(&self.logits, &self.history),
        }
    }

    /// Logits of every token of `tokens` (for perplexity), processed from position `pos`
    /// after truncating the cache there. Returns [n_vocab, tokens.len()].
    pub fn all_logits(&mut self, tokens: &[u32], pos: u32) -> Result<Vec<f32>> {
        self.scored_logits(tokens, pos, 0)
    }

    /// [`all_logits`](Self::all_logits) of `tokens[from..]` only: the tokens before
    /// `from` fill the cache in steps that keep the last token's logits alone, so the
    /// output head runs for the tokens that are read. Perplexity scores the second half
    /// of each chunk, and on a model with a large vocabulary the head over every token
    /// is most of a chunk's work (Gemma 3's 262144 rows: 1.4x faster, docs/perf.md).
    /// Returns [n_vocab, tokens.len() - from].
    pub fn scored_logits(&mut self, tokens: &[u32], pos: u32, from: usize) -> Result<Vec<f32>> {
        if from > tokens.len() {
            return Err(Error::invalid(format!(
                "logits from token {from} of a run of {}",
                tokens.len()
            )));
        }
        self.truncate(pos);
        self.check_room(tokens.len())?;
        let (unread, tokens) = tokens.split_at(from);
        let batch = self.batch(Logits::Last);
        for chunk in unread.chunks(batch) {
            self.engine.step(chunk, self.n_past(), Logits::Last)?;
            self.history.extend_from_slice(chunk);
        }
        let batch = self.batch(Logits::All);
        let mut out = Vec::new();
        for chunk in tokens.chunks(batch) {
            let l = self.engine.step(chunk, self.n_past(), Logits::All)?;
            // One batch's logits are the answer as they are: no second copy of them
            // (a perplexity chunk's are 268 MB on Gemma 3).
            if out.is_empty() {
                out = l;
            } else {
                out.extend_from_slice(&l);
            }
            self.history.extend_from_slice(chunk);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::gguf::synth::{LlamaShape, SynthQuant, SynthSpec};

    /// The steps an engine was asked for: their sizes and what logits they returned.
    type StepLog = Arc<Mutex<Vec<(usize, Logits)>>>;

    /// An engine that records every step's size and logits, for which a step of
    /// `batch_compiles` tokens or more would compile kernels.
    struct Steps {
        cfg: Config,
        steps: StepLog,
        batch_compiles: u32,
    }

    impl Engine for Steps {
        fn config(&self) -> &Config {
            &self.cfg
        }
        fn n_ctx(&self) -> u32 {
            64
        }
        fn max_batch(&self, _: Logits) -> u32 {
            16
        }
        /// Logits of a fake vocabulary of one: each token's position.
        fn step(&mut self, tokens: &[u32], pos: u32, mode: Logits) -> Result<Vec<f32>> {
            self.steps.lock().unwrap().push((tokens.len(), mode));
            let n = tokens.len() as u32;
            Ok(match mode {
                Logits::Last => vec![(pos + n - 1) as f32],
                Logits::All => (pos..pos + n).map(|p| p as f32).collect(),
            })
        }
        fn device(&self) -> String {
            CPU_DEVICE.into()
        }
        fn compiles_for(&self, n: u32, _: u32) -> bool {
            n >= self.batch_compiles
        }
    }

    /// A session of batches of 16 on a [`Steps`] engine, and the steps it records.
    fn session(batch_compiles: u32) -> (Session, StepLog) {
        let mut md = crate::gguf::Metadata::new();
        for (k, v) in SynthSpec::new(LlamaShape::TINY, SynthQuant::Q4_0).metadata() {
            md.insert(k, v);
        }
        let steps = Arc::new(Mutex::new(Vec::new()));
        let engine = Steps {
            cfg: Config::from_metadata(&md).unwrap(),
            steps: steps.clone(),
            batch_compiles,
        };
        (Session::new(Box::new(engine), 16), steps)
    }

    /// The step sizes a prompt of `prompt` tokens is fed in.
    fn fed(prompt: usize, batch_compiles: u32) -> Vec<usize> {
        let (mut s, steps) = session(batch_compiles);
        let tokens: Vec<u32> = (0..prompt as u32).collect();
        s.feed(&tokens).unwrap();
        assert_eq!(s.n_past() as usize, prompt);
        let sizes = steps.lock().unwrap().iter().map(|&(n, _)| n).collect();
        sizes
    }

    /// Perplexity's runs: the tokens before `from` fill the cache in steps that keep
    /// one token's logits, and every token from `from` on has its own, in order.
    #[test]
    fn scored_logits_run_the_head_for_the_scored_tokens() {
        let (mut s, log) = session(u32::MAX);
        let tokens: Vec<u32> = (0..40).collect();
        s.feed(&tokens[..5]).unwrap();
        log.lock().unwrap().clear();
        // From position 3, after dropping the cache past it.
        let got = s.scored_logits(&tokens, 3, 20).unwrap();
        let want: Vec<f32> = (23..43).map(|p| p as f32).collect();
        assert_eq!(got, want);
        assert_eq!(s.n_past(), 43);
        let steps = log.lock().unwrap().clone();
        use Logits::{All, Last};
        assert_eq!(steps, [(16, Last), (4, Last), (16, All), (4, All)]);
        // All of them, and none.
        assert_eq!(s.all_logits(&tokens[..3], 0).unwrap(), [0.0, 1.0, 2.0]);
        assert!(s.scored_logits(&tokens[..3], 0, 3).unwrap().is_empty());
        assert!(s.scored_logits(&tokens[..3], 0, 4).is_err());
    }

    #[test]
    fn short_prompts_run_single_tokens_rather_than_compile() {
        // Batch kernels not compiled yet: a two-token prompt runs one token at a time.
        assert_eq!(fed(SHORT_PROMPT, 2), vec![1; SHORT_PROMPT]);
        // Already compiled (or an engine that never compiles): one batch.
        assert_eq!(fed(SHORT_PROMPT, u32::MAX), [SHORT_PROMPT]);
        // Longer prompts are batched whatever it costs.
        assert_eq!(fed(SHORT_PROMPT + 1, 2), [SHORT_PROMPT + 1]);
        assert_eq!(fed(20, 2), [16, 4]);
        assert_eq!(fed(1, 1), [1]);
    }

    /// What a sampler needs decides what a step keeps.
    #[test]
    fn steps_keep_what_the_sampler_needs() {
        let keep = |temperature, top_k, repeat_penalty| {
            let s = Sampler::new(crate::sampling::SamplingParams {
                temperature,
                top_k,
                repeat_penalty,
                ..Default::default()
            });
            Keep::for_sampler(&s, 1000)
        };
        assert_eq!(keep(0.0, 40, 1.0), Keep::Greedy);
        assert_eq!(keep(0.0, 40, 1.1), Keep::TopK { k: 1, window: 64 });
        assert_eq!(keep(0.8, 40, 1.0), Keep::TopK { k: 40, window: 0 });
        assert_eq!(keep(0.8, 40, 1.1), Keep::TopK { k: 40, window: 64 });
        assert_eq!(keep(0.8, 0, 1.0), Keep::Logits);
        assert_eq!(keep(0.8, 1000, 1.0), Keep::Logits);
    }

    /// The tokens a step lists for the penalty include those it processes.
    #[test]
    fn a_step_lists_the_tokens_it_processes_too() {
        let (mut s, _) = session(u32::MAX);
        s.feed(&[5, 6, 7]).unwrap();
        assert_eq!(s.penalised_after(&[7, 9], 3), [7, 9]);
        assert_eq!(s.penalised_after(&[7, 9], 4), [6, 7, 9]);
        assert_eq!(s.penalised_after(&[], 2), [6, 7]);
        assert!(s.penalised_after(&[1], 0).is_empty());
    }

    #[test]
    fn first_batch_of_a_short_prompt_is_a_single_token() {
        assert_eq!(first_batch(1), 1);
        assert_eq!(first_batch(SHORT_PROMPT), 1);
        assert_eq!(first_batch(SHORT_PROMPT + 1), SHORT_PROMPT as u32 + 1);
    }
}
