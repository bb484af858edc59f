//! Running a step: what it returns (`Output`) checked and planned on first use, the
//! body and the output layer recorded and submitted (the body as chains where the
//! device runs them), and the result read back.

use super::*;

/// How long a single-token step on a CPU-hosted driver polls before it sleeps
/// ([`Wait::Spin`]): longer than a decode step of the small models there (40-120 ms),
/// short against one of a large model, whose long dispatches polling would slow.
const SPIN_CAP: std::time::Duration = std::time::Duration::from_millis(200);

/// How the host waits for a step of `n_tokens`: polling for single tokens on CPU-hosted
/// drivers, whose steps are hundreds of short dispatches, each waking the driver's
/// worker threads (`run_step` polls through the layers only); sleeping otherwise.
fn step_wait(ctx: &GpuContext, n_tokens: u32) -> Wait {
    if n_tokens == 1 && ctx.info.device_type == wgpu::DeviceType::Cpu {
        Wait::Spin(SPIN_CAP)
    } else {
        Wait::Block
    }
}

/// Environment variable that sets [`submit_every`].
pub const SUBMIT_EVERY_ENV: &str = "WGLLM_SUBMIT_EVERY";

/// Dispatches of a step's body per submission: `WGLLM_SUBMIT_EVERY` (0: all in one),
/// else [`GPU_SUBMIT_EVERY`] on GPUs and all in one on CPU-hosted drivers. On an H200 an
/// 8B decode step took 1.0 ms to record; parts of 32 overlap that with the device's work
/// (85.3 → 90.0 t/s; parts of 8 cost more in submissions than they won: 83.3). Lavapipe
/// ran 1.4-1.7x slower in parts (its submission waits on work before it).
pub(super) fn submit_every(ctx: &GpuContext) -> Result<usize> {
    match std::env::var(SUBMIT_EVERY_ENV) {
        Ok(v) if !v.is_empty() => match v.trim().parse::<usize>() {
            Ok(0) => Ok(usize::MAX),
            Ok(n) => Ok(n),
            Err(_) => Err(Error::invalid(format!(
                "{SUBMIT_EVERY_ENV}={v}: expected a number of dispatches"
            ))),
        },
        _ if ctx.info.device_type == wgpu::DeviceType::Cpu => Ok(usize::MAX),
        _ => Ok(GPU_SUBMIT_EVERY),
    }
}

/// Dispatches per submission on GPUs ([`submit_every`]).
pub const GPU_SUBMIT_EVERY: usize = 32;

/// Record `plan` into `enc`, each dispatch timed where a profiler is given.
fn record<'a>(
    enc: &mut wgpu::CommandEncoder,
    profiler: Option<&mut crate::gpu::profile::Profiler>,
    plan: impl Iterator<Item = &'a Dispatch>,
    info: &StepInfo,
) -> Result<()> {
    match profiler {
        Some(prof) => prof.record(enc, plan, info),
        None => crate::ops::record_plan(enc, plan, info),
    }
}

/// What a step may run after the body, per [`Output`]: the output layer over the last
/// token, and the plans built when a step first asks for them.
pub(crate) struct OutputPlans {
    /// The output layer over the batch's last token, and its logits.
    pub(super) last: (Vec<Dispatch>, wgpu::Buffer),
    /// The output layer over every token (perplexity), and its batch limit.
    pub(super) all: Option<(Vec<Dispatch>, wgpu::Buffer, u32)>,
    /// Greedy sampling over the last token's logits, and the buffer of its per-span
    /// candidates.
    /// Greedy sampling's dispatch, its (key, index) pairs and how many it writes.
    pub(super) argmax: Option<(Dispatch, wgpu::Buffer, usize)>,
    /// Top-k sampling's candidates over the last token's logits ([`crate::ops::top_k`]).
    pub(super) top_k: Option<TopKPlan>,
}

/// What a step of `n` tokens records after its body for `output`: the output layer's
/// dispatches, sampling's, and the buffer read back with its words.
struct StepTail<'a> {
    head: &'a [Dispatch],
    sample: &'a [Dispatch],
    out: &'a wgpu::Buffer,
    count: usize,
}

impl OutputPlans {
    fn tail<'a>(
        &'a self,
        output: Output,
        n: u32,
        cfg: &Config,
        scratch: &'a Scratch<wgpu::Buffer>,
    ) -> Result<StepTail<'a>> {
        let missing = |what: &str| Error::gpu(format!("no {what} plan"));
        let last = self.last.0.as_slice();
        let vocab = cfg.n_vocab as usize;
        Ok(match output {
            Output::Argmax => {
                let (d, b, groups) = self
                    .argmax
                    .as_ref()
                    .ok_or_else(|| missing("greedy-sampling"))?;
                StepTail::new(last, std::slice::from_ref(d), b, *groups)
            }
            Output::Logits(Logits::Last) => StepTail::new(last, &[], &self.last.1, vocab),
            Output::Logits(Logits::All) => {
                let (p, b, _) = self.all.as_ref().ok_or_else(|| missing("all-logits"))?;
                StepTail::new(p, &[], b, vocab * n as usize)
            }
            Output::TopK => {
                let t = self
                    .top_k
                    .as_ref()
                    .ok_or_else(|| missing("top-k sampling"))?;
                StepTail::new(last, &t.passes, &t.found, crate::ops::top_k::FOUND_WORDS)
            }
            Output::Hidden => StepTail::new(&[], &[], &scratch.x, (cfg.n_embd * n) as usize),
        })
    }
}

impl<'a> StepTail<'a> {
    fn new(
        head: &'a [Dispatch],
        sample: &'a [Dispatch],
        out: &'a wgpu::Buffer,
        count: usize,
    ) -> StepTail<'a> {
        StepTail {
            head,
            sample,
            out,
            count,
        }
    }
}

/// A step's command encoder, submitted in parts, and the time spent in
/// `queue.submit`.
struct Submission<'a> {
    ctx: &'a GpuContext,
    enc: wgpu::CommandEncoder,
    secs: f64,
}

impl<'a> Submission<'a> {
    fn new(ctx: &'a GpuContext) -> Submission<'a> {
        Submission {
            ctx,
            enc: Self::encoder(ctx, "step"),
            secs: 0.0,
        }
    }

    fn encoder(ctx: &GpuContext, label: &str) -> wgpu::CommandEncoder {
        ctx.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
    }

    /// Submit `enc`; the seconds `queue.submit` took.
    fn submit(ctx: &GpuContext, enc: wgpu::CommandEncoder) -> f64 {
        let cb = enc.finish();
        let t = std::time::Instant::now();
        ctx.queue.submit([cb]);
        t.elapsed().as_secs_f64()
    }

    /// Submit what is recorded so far and go on in a new encoder labelled `label`.
    fn cut(&mut self, label: &str) {
        let next = Self::encoder(self.ctx, label);
        let enc = std::mem::replace(&mut self.enc, next);
        self.secs += Self::submit(self.ctx, enc);
    }

    /// Submit the rest; the seconds spent submitting.
    fn finish(self) -> f64 {
        self.secs + Self::submit(self.ctx, self.enc)
    }
}

/// Record the body into `sub` in parts of `every` dispatches, each submitted once the
/// next is begun, so that the device starts on the first layers while the host still
/// records the rest; as chains where they span the body (in one part, and no profiler
/// timing each dispatch).
fn record_body(
    sub: &mut Submission<'_>,
    body: &[Dispatch],
    (chains, every): (Option<&crate::ops::chain::Chains>, usize),
    mut profiler: Option<&mut crate::gpu::profile::Profiler>,
    info: &StepInfo,
) -> Result<()> {
    for (i, part) in body.chunks(every.max(1)).enumerate() {
        if i > 0 {
            sub.cut("step part");
        }
        match chains {
            Some(c) if part.len() == body.len() && profiler.is_none() => {
                crate::ops::chain::record_plan(&mut sub.enc, part, c, info)?
            }
            _ => record(&mut sub.enc, profiler.as_deref_mut(), part.iter(), info)?,
        }
    }
    Ok(())
}

impl GpuModel {
    /// Run `tokens` at positions pos.. through the model and return the logits.
    pub fn step(&mut self, tokens: &[u32], pos: u32, mode: Logits) -> Result<Vec<f32>> {
        self.step_io(Input::Tokens(tokens), pos, Output::Logits(mode))
    }

    /// One forward step from `input` at positions `pos..`, returning `output`. On a
    /// lost device this is an error saying so (and what to do), never a panic.
    pub fn step_io(&mut self, input: Input<'_>, pos: u32, output: Output) -> Result<Vec<f32>> {
        if output == Output::Argmax {
            return Err(Error::invalid(
                "the greedy token comes from step_argmax_io, not step_io",
            ));
        }
        self.ctx.check_lost()?;
        let r = self.run_step(input, pos, output);
        self.ctx.explain_loss(r)
    }

    /// One forward step from `input` at positions `pos..`, returning the greedy token
    /// after the last (`sampling::argmax` of its logits), chosen on the device: the step
    /// reads back a few hundred bytes instead of every logit.
    pub fn step_argmax_io(&mut self, input: Input<'_>, pos: u32) -> Result<u32> {
        self.ctx.check_lost()?;
        let r = self
            .run_step::<[u32; 2]>(input, pos, Output::Argmax)
            .and_then(|pairs| crate::ops::argmax::pick(&pairs));
        self.ctx.explain_loss(r)
    }

    /// One forward step from `input` at positions `pos..`, returning candidates of the
    /// last token's logits for top-`k` sampling after a penalty on the distinct tokens
    /// `listed` ([`crate::sampling::candidates`]: the `k + listed.len()` best and the
    /// listed ones, in any order). Chosen on the device where that pays
    /// ([`GpuContext::top_k_on_device`]) and it can ([`crate::ops::top_k::supports`]):
    /// the step reads back a few thousand words instead of every logit, or every logit
    /// as well when more candidates passed the device's floor than its list holds.
    pub fn step_top_k_io(
        &mut self,
        input: Input<'_>,
        pos: u32,
        k: u32,
        listed: &[u32],
    ) -> Result<Vec<Cand>> {
        let n = self.cfg.n_vocab;
        let wanted = k.saturating_add(u32::try_from(listed.len()).unwrap_or(u32::MAX));
        if !self.ctx.top_k_on_device() || !crate::ops::top_k::supports(n, wanted, listed.len()) {
            let logits = self.step_io(input, pos, Output::Logits(Logits::Last))?;
            return Ok(crate::sampling::candidates(&logits, k as usize, listed));
        }
        if let Some(bad) = listed.iter().find(|&&t| t >= n) {
            return Err(Error::invalid(format!(
                "token id {bad} is outside the vocabulary of {n}"
            )));
        }
        self.plan_output(Output::TopK)?;
        if let Some(t) = &self.outputs.top_k {
            let want = crate::ops::top_k::want(wanted, listed);
            self.ctx
                .queue
                .write_buffer(&t.want, 0, bytemuck::cast_slice(&want));
        }
        self.ctx.check_lost()?;
        let r = self
            .run_step::<u32>(input, pos, Output::TopK)
            .and_then(
                |words| match crate::ops::top_k::best(&words, wanted, listed)? {
                    Some(cands) => Ok(cands),
                    None => {
                        let logits = crate::gpu::readback::read_buffer(
                            &self.ctx,
                            &self.outputs.last.1,
                            n as usize,
                        )?;
                        Ok(crate::sampling::candidates(&logits, k as usize, listed))
                    }
                },
            );
        self.ctx.explain_loss(r)
    }

    /// Build the top-k passes.
    fn plan_top_k(&mut self) -> Result<()> {
        let words = |w: usize| w as u64 * 4;
        let top_k = |label, bytes| storage(&self.ctx, label, bytes);
        let want = top_k("topk want", words(crate::ops::top_k::WANT_WORDS))?;
        let maxima = top_k("topk maxima", words(crate::ops::top_k::MAX_SPANS as usize))?;
        let found = top_k("topk found", words(crate::ops::top_k::FOUND_WORDS))?;
        let passes = crate::ops::top_k::gpu(
            &self.ctx,
            &self.step,
            [&self.outputs.last.1, &want],
            &maxima,
            &found,
            self.cfg.n_vocab,
        )?;
        self.outputs.top_k = Some(TopKPlan {
            passes,
            want,
            found,
        });
        // A small model's staging buffer, sized for its logits, may hold less than the
        // list.
        self.readback
            .reserve(&self.ctx, words(crate::ops::top_k::FOUND_WORDS));
        Ok(())
    }

    fn run_step<T: bytemuck::Pod>(
        &mut self,
        input: Input<'_>,
        pos: u32,
        output: Output,
    ) -> Result<Vec<T>> {
        let n = self.check_step(&input, pos, output)?;
        self.plan_output(output)?;
        let q = &self.ctx.queue;
        match input {
            Input::Tokens(tokens) => q.write_buffer(&self.ids, 0, bytemuck::cast_slice(tokens)),
            Input::Hidden(h) => q.write_buffer(&self.scratch.x, 0, bytemuck::cast_slice(h)),
        }
        let info = StepInfo::new(pos, n);
        q.write_buffer(&self.step, 0, bytemuck::bytes_of(&info));
        let out = self.submit_step(output, &info)?;
        if let Some(prof) = self.profiler.as_mut() {
            prof.collect(&self.ctx)?;
        }
        self.pin_workers(n);
        // A loss during this step may leave garbage in a readback that still succeeded.
        self.ctx.check_lost()?;
        Ok(out)
    }

    /// The tokens of a step from `input` at `pos` that returns `output`, or what is
    /// wrong with it.
    fn check_step(&self, input: &Input<'_>, pos: u32, output: Output) -> Result<u32> {
        let n = match input {
            Input::Tokens(t) => t.len() as u32,
            Input::Hidden(h) => (h.len() / self.cfg.n_embd as usize) as u32,
        };
        let limit = match output {
            Output::Logits(Logits::All) => self.max_batch_all_logits(),
            _ => self.max_batch,
        };
        if n == 0 || n > limit {
            return Err(Error::invalid(format!(
                "a step takes 1..={limit} tokens, got {n}"
            )));
        }
        if pos as u64 + n as u64 > self.n_ctx as u64 {
            return Err(Error::invalid(format!(
                "positions {pos}..{} exceed the context of {} tokens",
                pos as u64 + n as u64,
                self.n_ctx
            )));
        }
        match input {
            Input::Tokens(_) if !self.embeds => {
                return Err(Error::invalid(
                    "this GPU model starts after the embedding: give it hidden states",
                ))
            }
            Input::Tokens(tokens) => {
                if let Some(bad) = tokens.iter().find(|&&t| t >= self.cfg.n_vocab) {
                    return Err(Error::invalid(format!(
                        "token id {bad} is outside the vocabulary of {}",
                        self.cfg.n_vocab
                    )));
                }
            }
            Input::Hidden(h) => {
                if self.embeds || h.len() != (n * self.cfg.n_embd) as usize {
                    return Err(Error::invalid(
                        "hidden input: wrong size, or this model embeds tokens itself",
                    ));
                }
            }
        }
        if output != Output::Hidden && !self.head {
            return Err(Error::invalid("this GPU model has no output layer"));
        }
        Ok(n)
    }

    /// Build what a step returning `output` runs after the body, where no step has asked
    /// for it before: the output layer over every token, greedy or top-k sampling.
    fn plan_output(&mut self, output: Output) -> Result<()> {
        if output == Output::TopK && self.outputs.top_k.is_none() {
            self.plan_top_k()?;
        }
        if output == Output::Logits(Logits::All) && self.outputs.all.is_none() {
            let nb = self.max_batch_all_logits();
            let buf = storage(&self.ctx, "logits_all", act_bytes(self.cfg.n_vocab, nb))?;
            let plan = self.record(|r, m| m.record_head(r, &buf, Columns::All))?;
            self.outputs.all = Some((plan, buf, nb));
            self.readback
                .reserve(&self.ctx, act_bytes(self.cfg.n_vocab, nb));
        }
        if output == Output::Argmax && self.outputs.argmax.is_none() {
            let n = self.cfg.n_vocab;
            let groups = crate::ops::argmax::split(&self.ctx, n).groups;
            let buf = storage(&self.ctx, "argmax", groups as u64 * 8)?;
            let d = crate::ops::argmax::gpu(&self.ctx, &self.step, &self.outputs.last.1, &buf, n)?;
            self.outputs.argmax = Some((d, buf, groups as usize));
        }
        Ok(())
    }

    /// Record a step (`info`) returning `output`, submit it, and read back what it
    /// returns.
    fn submit_step<T: bytemuck::Pod>(&mut self, output: Output, info: &StepInfo) -> Result<Vec<T>> {
        let n = info.n_tokens;
        let tail = self.outputs.tail(output, n, &self.cfg, &self.scratch)?;
        let after_body = tail.head.iter().chain(tail.sample);
        // Pipelines compiled only when a step first runs them (a first long prompt).
        crate::ops::prepare(self.body.iter().chain(after_body.clone()), info)?;
        let t0 = std::time::Instant::now();
        let mut sub = Submission::new(&self.ctx);
        let mut profiler = self.profiler.as_mut();
        if let Some(prof) = profiler.as_deref_mut() {
            prof.begin_step();
        }
        let chains = (self.chains.as_ref(), self.submit_every);
        record_body(&mut sub, &self.body, chains, profiler.as_deref_mut(), info)?;
        let wait = step_wait(&self.ctx, n);
        // Polling keeps a core awake through the body's hundreds of short dispatches,
        // but takes time from the driver's workers in the head's one long product
        // (Gemma 3's output: 38 ms blocking against 41-49 polling, docs/perf.md). So
        // the body goes in a submission of its own, polled until done; the head's is
        // waited for blocking.
        let body_done = match wait {
            Wait::Spin(cap) if !tail.head.is_empty() => {
                sub.cut("step head");
                let (tx, rx) = std::sync::mpsc::channel();
                self.ctx.queue.on_submitted_work_done(move || {
                    let _ = tx.send(());
                });
                Some((rx, cap))
            }
            _ => None,
        };
        record(&mut sub.enc, profiler.as_deref_mut(), after_body, info)?;
        if let Some(prof) = profiler {
            prof.finish(&mut sub.enc);
        }
        let bytes = (tail.count * std::mem::size_of::<T>()) as u64;
        self.readback.record(&mut sub.enc, tail.out, 0, bytes)?;
        let submit_s = sub.finish();
        let t_wait = std::time::Instant::now();
        let wait = match body_done {
            Some((rx, cap)) => {
                crate::gpu::readback::poll_for(&self.ctx, &rx, cap)?;
                Wait::Block
            }
            None => wait,
        };
        let out = self.readback.read_waiting(&self.ctx, tail.count, wait)?;
        if let Some(h) = self.host_times.as_mut() {
            h.add(
                n,
                crate::gpu::profile::StepPhases {
                    record: (t_wait - t0).as_secs_f64() - submit_s,
                    submit: submit_s,
                    wait: t_wait.elapsed().as_secs_f64(),
                },
            );
        }
        Ok(out)
    }
}
