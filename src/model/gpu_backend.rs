//! The GPU backend: weights uploaded once, the whole graph recorded once as a list of
//! bound kernels, and each step replayed into one command submission whose only
//! readback is the logits sampling needs.

use std::sync::Arc;

use super::config::Config;
use super::graph::{self, HeadNorms, Ops, Proj, Scratch};
use super::weights::{self, ModelWeights};
use crate::gguf::{GgufFile, TensorInfo};
use crate::gpu::readback::{Readback, Wait};
use crate::gpu::upload::{is_vector_uniform, storage};
use crate::gpu::{GpuContext, GpuTensor};
use crate::ops::attention::{Attention, AttnTextures, CacheTextures, Chunks, LayerTextures};
use crate::ops::glu::Activation;
use crate::ops::mul_mat::Columns;
use crate::ops::rope::Rope;
use crate::ops::{self, Dispatch, StepInfo, Store};
use crate::sampling::Cand;
use crate::{Error, Result};

/// The most bytes of attention probabilities a batch keeps at once (see [`Chunks`]).
const PROBS_BUDGET: u64 = 16 << 20;

/// Records the graph's ops as bound kernels.
struct Recorder<'a> {
    ctx: &'a GpuContext,
    step: &'a wgpu::Buffer,
    ids: &'a wgpu::Buffer,
    kv: &'a [(wgpu::Buffer, wgpu::Buffer)],
    probs: &'a wgpu::Buffer,
    chunks: Chunks,
    attn_tex: Option<&'a AttnTextures>,
    /// When set, each layer's last-token attention is kept here ([n_ctx, n_head, n_layer]).
    capture: Option<&'a wgpu::Buffer>,
    /// Where chains run: the buffers odd layers take for Q and its head-normed copy
    /// ([`GpuModel::q_odd`]).
    q_odd: Option<&'a [wgpu::Buffer; 2]>,
    n_head: u32,
    kv_dim: u32,
    n_ctx: u32,
    plan: Vec<Dispatch>,
    /// The last norm of the residual stream, while products may still fold it in.
    pending: Option<PendingNorm>,
}

/// A norm of the residual stream (one row per token) whose readers are still being
/// recorded. Products that read its output may fold it into their kernels
/// (`ops::mul_mat::gpu_normed`); once the next other op is recorded, the norm is
/// settled: kept if a reader did not fold it, dropped otherwise.
struct PendingNorm {
    /// Its index in the plan.
    at: usize,
    x: wgpu::Buffer,
    w: wgpu::Buffer,
    y: wgpu::Buffer,
    n: u32,
    eps: f32,
    /// Whether a product folded it in. A norm settled with none stays as it is: its
    /// output is read by other ops (Gemma's one-head K norm, by RoPE).
    folded: bool,
    /// Whether a product read its output without folding it.
    unfolded: bool,
}

impl<'a> Recorder<'a> {
    /// Settle the pending norm (see [`PendingNorm`]).
    fn settle(&mut self) {
        let Some(p) = self.pending.take() else {
            return;
        };
        if p.unfolded || !p.folded {
            return;
        }
        self.plan.remove(p.at);
    }

    /// Whether a product of `w` reading `x` into `ys` folds the pending norm in. If it
    /// reads the norm's output without folding it, the norm is marked as needed in
    /// every step; if it writes the norm's input or output, the norm is settled first.
    fn folds(&mut self, w: &GpuTensor, x: &wgpu::Buffer, ys: &[&wgpu::Buffer]) -> bool {
        let Some(p) = self.pending.as_ref() else {
            return false;
        };
        if ys.iter().any(|y| **y == p.x || **y == p.y) {
            self.settle();
            return false;
        }
        if *x != p.y {
            return false;
        }
        let fits = p.n as u64 == w.n_cols()
            && ops::mul_mat::folds_norm(self.ctx, w.ty, (w.n_rows(), w.n_cols()), w.memory);
        if let Some(p) = self.pending.as_mut() {
            p.unfolded |= !fits;
        }
        fits
    }

    /// The pending norm's input, weight and epsilon, for a product that folds it in
    /// (which marks it folded).
    fn fold_pending(&mut self) -> Result<(wgpu::Buffer, wgpu::Buffer, f32)> {
        let p = self
            .pending
            .as_mut()
            .ok_or_else(|| Error::gpu("a folded norm with no norm recorded"))?;
        p.folded = true;
        Ok((p.x.clone(), p.w.clone(), p.eps))
    }

    /// A product reading the pending norm's output, with the norm folded in.
    fn mul_mat_normed(
        &mut self,
        w: &GpuTensor,
        ys: &[&wgpu::Buffer],
        rows: &[u32],
        cols: Columns,
    ) -> Result<()> {
        let (x, w_norm, eps) = self.fold_pending()?;
        let norm = ops::mul_mat::Norm {
            x: &x,
            w: &w_norm,
            eps,
        };
        let d = ops::mul_mat::gpu_normed(self.ctx, self.step, w, norm, ys, rows, cols)?;
        self.plan.extend(d);
        Ok(())
    }

    /// Layer `il`'s K and V caches.
    fn cache(&self, il: usize) -> Result<[&'a wgpu::Buffer; 2]> {
        let (kc, vc) = self
            .kv
            .get(il)
            .ok_or_else(|| Error::model(format!("no KV cache for layer {il}")))?;
        Ok([kc, vc])
    }

    /// How layer `il`'s keys and values join its cache: RoPE (after the heads' norms,
    /// given `norms`) into its caches and, where the layer keeps its cache textures,
    /// a single token's into them too (the attention then records no copies).
    fn cache_append<'r>(
        &self,
        il: usize,
        rope: &'r Rope,
        norms: Option<ops::kv_store::QkNorms<'r>>,
        attn: &Attention,
    ) -> Result<ops::kv_store::CacheAppend<'r>>
    where
        'a: 'r,
    {
        Ok(ops::kv_store::CacheAppend {
            rope,
            caches: self.cache(il)?,
            dims: (self.kv_dim, self.n_ctx),
            norms,
            tex: self.layer_textures(il, attn).and_then(|t| t.cache_views()),
        })
    }

    /// `rope_store` (with the heads' norms first, given in `append`; only for batches
    /// with `batches_only`, whose single tokens the Q/K/V product appended), then the
    /// attention: Q is rotated in place, K on its way into layer `il`'s cache.
    fn rope_store_attend(
        &mut self,
        il: usize,
        [q, k, v]: [&wgpu::Buffer; 3],
        append: &ops::kv_store::CacheAppend<'_>,
        batches_only: bool,
        (out, attn): (&wgpu::Buffer, &Attention),
    ) -> Result<()> {
        let d = ops::kv_store::gpu_with_rope(self.ctx, self.step, q, [k, v], append, batches_only)?;
        self.plan.push(d);
        self.attend(il, q, out, attn, append.tex.is_some())
    }

    /// [`Ops::qkv_attention`] with a single token's RoPE and cache append inside the
    /// Q/K/V product (`ops::mul_mat::gpu_qkv_rope`), where the product folds the norm
    /// before it and the device runs it: Q and K in one matrix, V with them or a
    /// product of its own, recorded first. Returns false, having recorded nothing,
    /// where it does not apply.
    fn qkv_rope_attention(
        &mut self,
        w: &Proj<GpuTensor, 3>,
        x: &wgpu::Buffer,
        [q, k, v]: [&wgpu::Buffer; 3],
        norms: Option<&HeadNorms<'_, GpuTensor>>,
        h: &graph::HeadsAttention<'_, wgpu::Buffer>,
    ) -> Result<bool> {
        let (wt, rows, v_apart) = match w {
            Proj::Fused(wt, rows) => (wt, &rows[..], None),
            Proj::Leading { fused, rows, rest } if rows.len() == 2 && rest.len() == 1 => {
                (fused, &rows[..], rest.first())
            }
            _ => return Ok(false),
        };
        let norms = match norms {
            Some(n) => {
                let (wq, wk) = (single(n.q)?, single(n.k)?);
                let eps = n.eps;
                Some(ops::kv_store::QkNorms { q: wq, k: wk, eps })
            }
            None => None,
        };
        let append = self.cache_append(h.il, h.rope, norms, h.attn)?;
        let ys = [q, k, v];
        if !ops::kv_store::rope_store_available(self.ctx)
            || !ops::mul_mat::fuses_rope(self.ctx, wt, &append)
            || !self.folds(wt, x, &ys[..rows.len()])
        {
            return Ok(false);
        }
        if let Some(wv) = v_apart {
            self.mul_mat(wv, x, v, Columns::All)?;
        }
        let (nx, nw, eps) = self.fold_pending()?;
        let norm = ops::mul_mat::Norm {
            x: &nx,
            w: &nw,
            eps,
        };
        let io = (ys, rows);
        let (d, stored) = ops::mul_mat::gpu_qkv_rope(self.ctx, self.step, wt, norm, io, &append)?;
        self.plan.extend(d);
        self.settle();
        self.rope_store_attend(h.il, ys, &append, stored, (h.out, h.attn))?;
        Ok(true)
    }

    /// Layer `il`'s attention textures, where its attention reads them.
    fn layer_textures(&self, il: usize, attn: &Attention) -> Option<LayerTextures<'a>> {
        self.attn_tex
            .and_then(|t| t.layer(il))
            .filter(|_| attn.reads_textures(self.ctx))
    }

    /// Attention over layer `il`'s caches, which already hold this step's keys and
    /// values (and, with `stored`, its kept textures a single token's), and the capture
    /// of its probabilities where one is kept.
    fn attend(
        &mut self,
        il: usize,
        q: &wgpu::Buffer,
        out: &wgpu::Buffer,
        attn: &Attention,
        stored: bool,
    ) -> Result<()> {
        let [kc, vc] = self.cache(il)?;
        let tex = self.attn_tex.and_then(|t| t.layer(il));
        let tex = tex.map(|t| if stored { t.stored_by_store() } else { t });
        let probs = self.probs;
        let d = attn.gpu(self.ctx, self.step, q, kc, vc, probs, out, self.chunks, tex)?;
        self.plan.extend(d);
        if let Some(cap) = self.capture {
            let offset = il as u32 * self.n_head * self.n_ctx;
            let c = ops::attention::capture_gpu(
                self.ctx,
                self.step,
                self.probs,
                cap,
                self.n_head,
                self.n_ctx,
                offset,
                self.chunks,
            )?;
            self.plan.push(c);
        }
        Ok(())
    }
}

impl Ops for Recorder<'_> {
    type Act = wgpu::Buffer;
    type Weight = GpuTensor;

    fn embed(&mut self, w: &GpuTensor, out: &wgpu::Buffer, scale: f32) -> Result<()> {
        self.settle();
        let d = ops::get_rows::gpu(self.ctx, self.step, w, self.ids, out, scale)?;
        self.plan.extend(d);
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &wgpu::Buffer,
        w: &GpuTensor,
        y: &wgpu::Buffer,
        n: u32,
        rows: u32,
        eps: f32,
    ) -> Result<()> {
        self.settle();
        let wb = single(w)?;
        let d = ops::rms_norm::gpu(self.ctx, self.step, x, wb, y, n, rows, eps, Store::Write)?;
        if rows == 1 {
            self.pending = Some(PendingNorm {
                at: self.plan.len(),
                x: x.clone(),
                w: wb.clone(),
                y: y.clone(),
                n,
                eps,
                folded: false,
                unfolded: false,
            });
        }
        self.plan.push(d);
        Ok(())
    }

    fn mul_mat(
        &mut self,
        w: &GpuTensor,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        cols: Columns,
    ) -> Result<()> {
        if self.folds(w, x, &[y]) {
            return self.mul_mat_normed(w, &[y], &[w.n_rows() as u32], cols);
        }
        let d = ops::mul_mat::gpu(self.ctx, self.step, w, x, y, cols, Store::Write)?;
        self.plan.extend(d);
        Ok(())
    }

    fn mul_mat_rows(
        &mut self,
        w: &GpuTensor,
        x: &wgpu::Buffer,
        ys: &[&wgpu::Buffer],
        rows: &[u32],
    ) -> Result<()> {
        if self.folds(w, x, ys) {
            return self.mul_mat_normed(w, ys, rows, Columns::All);
        }
        let d = ops::mul_mat::gpu_rows(self.ctx, self.step, w, x, ys, rows)?;
        self.plan.extend(d);
        Ok(())
    }

    fn rope(&mut self, x: &wgpu::Buffer, rope: &Rope) -> Result<()> {
        self.settle();
        let d = rope.gpu(self.ctx, self.step, x)?;
        self.plan.push(d);
        Ok(())
    }

    fn rope_qk(
        &mut self,
        q: &wgpu::Buffer,
        k: &wgpu::Buffer,
        rope: &Rope,
        k_heads: u32,
    ) -> Result<()> {
        self.settle();
        let d = rope.gpu_pair(self.ctx, self.step, q, Some((k, k_heads)))?;
        self.plan.push(d);
        Ok(())
    }

    fn rope_attention(
        &mut self,
        il: usize,
        [q, k, v]: [&wgpu::Buffer; 3],
        out: &wgpu::Buffer,
        rope: &Rope,
        k_heads: u32,
        attn: &Attention,
    ) -> Result<()> {
        self.settle();
        if !ops::kv_store::rope_store_available(self.ctx) {
            self.rope_qk(q, k, rope, k_heads)?;
            return self.attention(il, q, k, v, out, attn);
        }
        let append = self.cache_append(il, rope, None, attn)?;
        self.rope_store_attend(il, [q, k, v], &append, false, (out, attn))
    }

    fn norm_rope_attention(
        &mut self,
        il: usize,
        qkv: [&wgpu::Buffer; 3],
        [qn, kn]: [&wgpu::Buffer; 2],
        norms: &HeadNorms<'_, GpuTensor>,
        out: &wgpu::Buffer,
        rope: &Rope,
        k_heads: u32,
        attn: &Attention,
    ) -> Result<()> {
        self.settle();
        let (wq, wk) = (single(norms.q)?, single(norms.k)?);
        let fused = ops::kv_store::qk_norms_available(self.ctx, rope.head_dim)
            && is_vector_uniform(wq)
            && is_vector_uniform(wk);
        if !fused {
            let heads = graph::HeadsAttention {
                il,
                out,
                rope,
                k_heads,
                attn,
            };
            return graph::norms_then_rope_attention(self, qkv, [qn, kn], norms, &heads);
        }
        let norms = ops::kv_store::QkNorms {
            q: wq,
            k: wk,
            eps: norms.eps,
        };
        let append = self.cache_append(il, rope, Some(norms), attn)?;
        self.rope_store_attend(il, qkv, &append, false, (out, attn))
    }

    fn qkv_attention(
        &mut self,
        w: &Proj<GpuTensor, 3>,
        x: &wgpu::Buffer,
        (qkv, normed): ([&wgpu::Buffer; 3], [&wgpu::Buffer; 2]),
        norms: Option<&HeadNorms<'_, GpuTensor>>,
        h: &graph::HeadsAttention<'_, wgpu::Buffer>,
    ) -> Result<()> {
        // Odd layers' Q in buffers of their own where chains run: a chain that starts
        // with a layer's attention, which reads Q as a uniform, ends with the next
        // layer's Q/K/V product, which writes Q (`ops::chain`), and wgpu allows a buffer
        // one kind of use per dispatch.
        let (qkv, normed) = match self.q_odd {
            Some([q, qn]) if h.il % 2 == 1 => ([q, qkv[1], qkv[2]], [qn, normed[1]]),
            _ => (qkv, normed),
        };
        if self.qkv_rope_attention(w, x, qkv, norms, h)? {
            return Ok(());
        }
        graph::qkv_then_attention(self, w, x, (qkv, normed), norms, h)
    }

    fn attention(
        &mut self,
        il: usize,
        q: &wgpu::Buffer,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        out: &wgpu::Buffer,
        attn: &Attention,
    ) -> Result<()> {
        self.settle();
        let [kc, vc] = self.cache(il)?;
        let store = ops::kv_store::gpu(self.ctx, self.step, k, v, kc, vc, self.kv_dim, self.n_ctx)?;
        self.plan.push(store);
        self.attend(il, q, out, attn, false)
    }

    fn glu(
        &mut self,
        gate: &wgpu::Buffer,
        up: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: u32,
        act: Activation,
    ) -> Result<()> {
        self.settle();
        let d = ops::glu::gpu(self.ctx, self.step, gate, up, out, n, act)?;
        self.plan.push(d);
        Ok(())
    }

    fn mul_mat_glu(
        &mut self,
        w: &Proj<GpuTensor, 2>,
        x: &wgpu::Buffer,
        [gate, up]: [&wgpu::Buffer; 2],
        out: &wgpu::Buffer,
        (n, act): (u32, Activation),
    ) -> Result<()> {
        let wt = match w {
            Proj::Fused(wt, rows) if *rows == [n, n] && self.ctx.fused_outputs() => wt,
            _ => return graph::products_then_glu(self, w, x, [gate, up], out, (n, act)),
        };
        let glu = ops::mul_mat::Glu { out, act };
        let norm = match self.folds(wt, x, &[gate, up]) {
            true => self.pending.as_mut(),
            false => None,
        };
        let norm = norm.map(|p| {
            p.folded = true;
            ops::mul_mat::Norm {
                x: &p.x,
                w: &p.w,
                eps: p.eps,
            }
        });
        let io = (x, norm);
        let (d, stored) = ops::mul_mat::gpu_gate_up(self.ctx, self.step, wt, io, [gate, up], glu)?;
        self.plan.extend(d);
        self.settle();
        // Batches, and single tokens where the product did not store the activation.
        let d = ops::glu::gpu_in(self.ctx, self.step, [gate, up, out], n, act, stored)?;
        self.plan.push(d);
        Ok(())
    }

    fn add(&mut self, x: &wgpu::Buffer, y: &wgpu::Buffer, n: u32) -> Result<()> {
        self.settle();
        let d = ops::add::gpu(self.ctx, self.step, x, y, n)?;
        self.plan.push(d);
        Ok(())
    }

    // The fused forms: each dispatch costs tens of microseconds on CPU-hosted drivers,
    // whatever its size.
    fn mul_mat_add(
        &mut self,
        w: &GpuTensor,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        _tmp: &wgpu::Buffer,
        _n: u32,
    ) -> Result<()> {
        self.settle();
        let d = ops::mul_mat::gpu(self.ctx, self.step, w, x, y, Columns::All, Store::Add)?;
        self.plan.extend(d);
        Ok(())
    }

    fn rms_norm_add(
        &mut self,
        x: &wgpu::Buffer,
        p: &wgpu::Buffer,
        w: &GpuTensor,
        _tmp: &wgpu::Buffer,
        n: u32,
        eps: f32,
    ) -> Result<()> {
        self.settle();
        let wb = single(w)?;
        let d = ops::rms_norm::gpu(self.ctx, self.step, p, wb, x, n, 1, eps, Store::Add)?;
        self.plan.push(d);
        Ok(())
    }
}

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
fn submit_every(ctx: &GpuContext) -> Result<usize> {
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

/// The buffer of a tensor that must fit one binding (norm weights).
fn single(w: &GpuTensor) -> Result<&wgpu::Buffer> {
    if w.ty != crate::quant::GgmlType::F32 {
        return Err(Error::Unsupported(format!(
            "tensor {}: {} norm weights (the GPU norm kernels read F32)",
            w.name, w.ty
        )));
    }
    match w.parts.as_slice() {
        [p] => p
            .buffer()
            .ok_or_else(|| Error::gpu(format!("{}: norm weights held in a texture", w.name))),
        _ => Err(Error::gpu(format!(
            "{}: expected a single buffer, found {} parts",
            w.name,
            w.parts.len()
        ))),
    }
}

/// What logits a step returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// The last token's logits only: [n_vocab].
    Last,
    /// Every token's: [n_vocab, n_tokens].
    All,
}

/// A model whose every layer runs on the GPU.
pub struct GpuModel {
    pub ctx: Arc<GpuContext>,
    pub cfg: Config,
    pub n_ctx: u32,
    /// Largest batch one step takes.
    pub max_batch: u32,
    pub(crate) weights: ModelWeights<GpuTensor>,
    pub(crate) step: wgpu::Buffer,
    pub(crate) ids: wgpu::Buffer,
    pub(crate) scratch: Scratch<wgpu::Buffer>,
    /// Where chains run, odd layers' Q and its head-normed copy (`Recorder::q_odd`).
    q_odd: Option<[wgpu::Buffer; 2]>,
    pub(crate) kv: Vec<(wgpu::Buffer, wgpu::Buffer)>,
    pub(crate) probs: wgpu::Buffer,
    /// How a batch's attention is cut to fit `probs`.
    pub(crate) chunks: Chunks,
    /// Where batches' attention reads its operands, on devices that read them faster
    /// from textures.
    pub(crate) attn_tex: Option<AttnTextures>,
    /// Last-token attention of every layer, when asked for at load.
    pub(crate) capture: Option<wgpu::Buffer>,
    /// Embedding and layers.
    pub(crate) body: Vec<Dispatch>,
    pub(crate) last: (Vec<Dispatch>, wgpu::Buffer),
    /// Built on first use: the head over every token (perplexity), and its batch limit.
    pub(crate) all: Option<(Vec<Dispatch>, wgpu::Buffer, u32)>,
    /// Built on first use: greedy sampling over the last token's logits, and the
    /// buffer of its per-span candidates.
    pub(crate) argmax: Option<(Dispatch, wgpu::Buffer)>,
    /// Built on first use: top-k sampling's candidates over the last token's logits
    /// ([`crate::ops::top_k`]).
    pub(crate) top_k: Option<TopKPlan>,
    pub(crate) readback: Readback,
    pub(crate) layers: std::ops::Range<u32>,
    /// Whether this model embeds token ids itself (it starts at layer 0 and the host
    /// does not embed for it).
    embeds: bool,
    pub(crate) head: bool,
    /// Per-kernel timing (`WGLLM_PROFILE=1`).
    pub(crate) profiler: Option<crate::gpu::profile::Profiler>,
    /// Where the host's time goes per step (`WGLLM_HOST_TIMES=1`).
    pub(crate) host_times: Option<crate::gpu::profile::HostTimes>,
    /// Dispatches of the body per submission ([`submit_every`]).
    pub(crate) submit_every: usize,
    /// The body's runs of single-token products as chains, one dispatch each, where the
    /// device runs them ([`crate::ops::chain`]).
    pub(crate) chains: Option<crate::ops::chain::Chains>,
    /// Where the model still looks for the driver's workers to pin
    /// ([`crate::gpu::pin`], [`GpuModel::pin_workers`]): until it pins them or gives up.
    pub(crate) pin: Option<PinWatch>,
    /// The worker threads pinned, and their cores.
    pub(crate) pinned: Vec<(i32, usize)>,
}

/// Single-token steps over which a model looks for the driver's workers, the threads
/// that ran most, and how many times it looks before it gives up.
const PIN_STEPS: u32 = 4;
const PIN_TRIES: u32 = 4;

/// What a model keeps while it looks for the driver's workers ([`GpuModel::pin`]).
#[derive(Default)]
pub(crate) struct PinWatch {
    /// The threads' run times when the current look began.
    census: Option<crate::gpu::pin::Census>,
    steps: u32,
    tries: u32,
}

/// Options of [`GpuModel::load`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Layers this model runs (all when `None`). A model that does not start at layer 0
    /// takes the residual stream from the host instead of token ids.
    pub layers: Option<std::ops::Range<u32>>,
    /// Whether the final norm and output projection run here; without them a step
    /// returns the residual stream.
    pub head: bool,
    pub n_ctx: u32,
    pub n_batch: u32,
    /// Show an upload progress bar on stderr.
    pub progress: bool,
    /// Keep every layer's last-token attention probabilities (see
    /// [`GpuModel::attention`]).
    pub capture_attention: bool,
    /// Tokens in the first step, where known (a prompt's length): the kernels that step
    /// runs compile while the weights upload, and those of other batch sizes when a
    /// step first runs them. `None`: those of a prompt of [`DEFAULT_FIRST_BATCH`].
    pub first_batch: Option<u32>,
    /// Take the residual stream from the host even from layer 0 (the host embeds the
    /// tokens), keeping no copy of the token embedding unless a tied output layer runs
    /// here.
    pub hidden_in: bool,
}

/// The first step [`LoadOptions::first_batch`] prepares for when it is not known: a
/// prompt of a few dozen tokens (a chat turn). Longer prompts compile their builds
/// (`mul_mat`'s tiles of eight) in their first step.
pub const DEFAULT_FIRST_BATCH: u32 = 32;

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            layers: None,
            head: true,
            n_ctx: 4096,
            n_batch: 512,
            progress: false,
            capture_attention: false,
            first_batch: None,
            hidden_in: false,
        }
    }
}

/// What a step starts from.
pub enum Input<'a> {
    Tokens(&'a [u32]),
    /// The residual stream entering the first layer: [n_embd, n_tokens].
    Hidden(&'a [f32]),
}

/// What a step returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Logits(Logits),
    /// The residual stream after the last layer: [n_embd, n_tokens].
    Hidden,
    /// The greedy token after the batch's last, chosen on the device
    /// ([`GpuModel::step_argmax_io`]).
    Argmax,
    /// The candidates for top-k sampling over the batch's last token's logits, chosen
    /// on the device ([`GpuModel::step_top_k_io`]).
    TopK,
}

/// Top-k sampling's passes, the buffer the host says what it wants in, and the one
/// they leave their candidates in.
pub(crate) struct TopKPlan {
    passes: Vec<Dispatch>,
    want: wgpu::Buffer,
    found: wgpu::Buffer,
}

/// Bytes of an f32 activation of `per_token` floats for `n` tokens.
fn act_bytes(per_token: u32, n: u32) -> u64 {
    per_token as u64 * n as u64 * 4
}

impl GpuModel {
    /// Upload `file`'s weights and record the graph for contexts of `n_ctx` tokens and
    /// batches of up to `n_batch`. A lost device is an error saying so.
    pub fn load(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: Config,
        opts: &LoadOptions,
    ) -> Result<GpuModel> {
        ctx.check_lost()?;
        let r = Self::load_on(ctx.clone(), file, cfg, opts);
        ctx.explain_loss(r)
    }

    fn load_on(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: Config,
        opts: &LoadOptions,
    ) -> Result<GpuModel> {
        let (n_ctx, n_batch) = (opts.n_ctx, opts.n_batch);
        if n_ctx == 0 || n_batch == 0 {
            return Err(Error::invalid("context and batch sizes must be at least 1"));
        }
        let layers = opts.layers.clone().unwrap_or(0..cfg.n_layer);
        if layers.start > layers.end || layers.end > cfg.n_layer {
            return Err(Error::invalid(format!(
                "layers {layers:?} of a {}-layer model",
                cfg.n_layer
            )));
        }
        let embeds = layers.start == 0 && !opts.hidden_in;
        // The heavy pipelines compile on a second thread while the weights upload.
        let batch = opts.first_batch.unwrap_or(DEFAULT_FIRST_BATCH);
        let batch = batch.min(n_batch).min(n_ctx);
        let part = (&layers, embeds, opts.head);
        let weights = std::thread::scope(|s| {
            s.spawn(|| super::gpu_warm::warm(&ctx, file, &cfg, part, batch));
            upload_weights(&ctx, file, &cfg, &layers, embeds, opts.head, opts.progress)
        })?;
        // Huge pages for the weights, read whole every step, but not for the caches
        // and activations, mostly untouched at short contexts.
        ctx.end_huge_pages();
        let max_binding = ctx.max_binding();
        // Attention runs in chunks of a batch whose probabilities fit a modest scratch
        // (and one binding); one token's must fit.
        let probs_per_token = act_bytes(cfg.n_head, n_ctx);
        if probs_per_token > max_binding {
            return Err(Error::gpu(format!(
                "one token's attention over a context of {n_ctx} needs {probs_per_token} \
                 bytes, over the device's {max_binding} byte binding limit; lower -c"
            )));
        }
        // Every activation of a batch must fit one binding too.
        let widest = [cfg.n_embd, cfg.n_ff, cfg.q_dim(), cfg.kv_dim()]
            .into_iter()
            .max()
            .unwrap_or(1);
        // A batch never holds more positions than the context.
        let max_batch = (max_binding / act_bytes(widest, 1).max(1))
            .min(n_batch.min(n_ctx) as u64)
            .max(1) as u32;
        let chunks = Chunks::new(cfg.n_head, n_ctx, max_batch, PROBS_BUDGET.min(max_binding));
        let c = &cfg;
        let a = |name: &str, per_token: u32| {
            crate::gpu::upload::activations(&ctx, name, act_bytes(per_token, max_batch))
        };
        let scratch = Scratch {
            x: a("x", c.n_embd)?,
            xn: a("xn", c.n_embd)?,
            q: a("q", c.q_dim())?,
            k: a("k", c.kv_dim())?,
            v: a("v", c.kv_dim())?,
            qn: a("qn", c.q_dim())?,
            kn: a("kn", c.kv_dim())?,
            attn: a("attn", c.q_dim())?,
            proj: a("proj", c.n_embd)?,
            gate: a("gate", c.n_ff)?,
            up: a("up", c.n_ff)?,
            ffn: a("ffn", c.n_ff)?,
        };
        let q_odd = match ctx.chains() {
            true => Some([a("q odd", c.q_dim())?, a("qn odd", c.q_dim())?]),
            false => None,
        };
        let mut kv = Vec::new();
        for il in 0..c.n_layer {
            // Layers that run elsewhere get no cache.
            let bytes = if layers.contains(&il) {
                ops::kv_store::cache_bytes(c.kv_dim(), n_ctx)
            } else {
                4
            };
            kv.push((
                storage(&ctx, &format!("k_cache.{il}"), bytes)?,
                storage(&ctx, &format!("v_cache.{il}"), bytes)?,
            ));
        }
        let probs = storage(&ctx, "attn_probs", chunks.probs_bytes(cfg.n_head, n_ctx))?;
        let attn0 = graph::attention_of(c, 0, n_ctx);
        let caches = CacheTextures::for_layers(&attn0, layers.clone());
        let attn_tex = AttnTextures::new(&ctx, &attn0, max_batch, chunks, caches)?;
        let step = ops::uniform(&ctx, "step", &StepInfo::default());
        let ids = storage(&ctx, "ids", max_batch as u64 * 4)?;
        let logits_last = storage(&ctx, "logits", act_bytes(c.n_vocab, 1))?;
        let capture = if opts.capture_attention {
            Some(storage(
                &ctx,
                "attention_capture",
                act_bytes(c.n_head * c.n_layer, n_ctx),
            )?)
        } else {
            None
        };
        let readback = Readback::new(&ctx, act_bytes(c.n_vocab.max(c.n_embd * max_batch), 1));
        let submit_every = submit_every(&ctx)?;
        let mut m = GpuModel {
            body: Vec::new(),
            last: (Vec::new(), logits_last),
            all: None,
            argmax: None,
            top_k: None,
            ctx,
            cfg,
            n_ctx,
            max_batch,
            weights,
            step,
            ids,
            scratch,
            q_odd,
            kv,
            probs,
            chunks,
            attn_tex,
            capture,
            readback,
            layers,
            embeds,
            head: opts.head,
            profiler: None,
            host_times: crate::gpu::profile::HostTimes::from_env(),
            submit_every,
            chains: None,
            pin: None,
            pinned: Vec::new(),
        };
        m.body = m.record(|r, m| {
            if m.embeds {
                graph::embed(r, &m.cfg, m.weights.embedding()?, &m.scratch)?;
            }
            for il in m.layers.clone() {
                let lw = m.weights.layers.get(il as usize).and_then(|l| l.as_ref());
                let lw = lw.ok_or_else(|| Error::model(format!("layer {il} missing")))?;
                graph::layer(r, &m.cfg, il, m.n_ctx, lw, &m.scratch)?;
            }
            Ok(())
        })?;
        m.chains = crate::ops::chain::Chains::link(&m.ctx, &m.body)?;
        if m.head {
            m.last.0 = m.record(|r, m| m.record_head(r, &m.last.1, Columns::Last))?;
        }
        let n_dispatch = m.body.len() + m.last.0.len();
        m.profiler = crate::gpu::profile::Profiler::from_env(&m.ctx, n_dispatch);
        m.pin = m.ctx.pins_threads().then(PinWatch::default);
        Ok(m)
    }

    /// After a step of `n_tokens`: look for the driver's workers over [`PIN_STEPS`]
    /// single-token steps, from the first single token on (the driver compiles each
    /// kernel at its first dispatch, on its submitting thread, which then outruns the
    /// workers), and pin them ([`crate::gpu::pin`]); look again, at most
    /// [`PIN_TRIES`] times, where a look does not find them (the chains' first dispatch
    /// compiles theirs).
    fn pin_workers(&mut self, n_tokens: u32) {
        let Some(w) = self.pin.as_mut() else {
            return;
        };
        if n_tokens != 1 {
            return;
        }
        // One worker, or none (`LP_NUM_THREADS=0`), has no other to share a core with.
        let workers = crate::gpu::context::driver_threads() as usize;
        if workers < 2 {
            self.pin = None;
            return;
        }
        let Some(census) = w.census.as_ref() else {
            w.census = Some(crate::gpu::pin::Census::take());
            return;
        };
        w.steps += 1;
        if w.steps < PIN_STEPS {
            return;
        }
        match census.pin_busiest(workers) {
            Some(pins) => {
                self.pinned = pins;
                self.pin = None;
            }
            None if w.tries + 1 >= PIN_TRIES => self.pin = None,
            None => {
                w.tries += 1;
                w.steps = 0;
                w.census = Some(crate::gpu::pin::Census::take());
            }
        }
    }

    fn recorder(&self) -> Recorder<'_> {
        Recorder {
            ctx: &self.ctx,
            step: &self.step,
            ids: &self.ids,
            kv: &self.kv,
            probs: &self.probs,
            chunks: self.chunks,
            attn_tex: self.attn_tex.as_ref(),
            capture: self.capture.as_ref(),
            q_odd: self.q_odd.as_ref(),
            n_head: self.cfg.n_head,
            kv_dim: self.cfg.kv_dim(),
            n_ctx: self.n_ctx,
            plan: Vec::new(),
            pending: None,
        }
    }

    fn record(
        &self,
        f: impl FnOnce(&mut Recorder<'_>, &GpuModel) -> Result<()>,
    ) -> Result<Vec<Dispatch>> {
        let mut r = self.recorder();
        f(&mut r, self)?;
        r.settle();
        Ok(r.plan)
    }

    fn record_head(
        &self,
        r: &mut Recorder<'_>,
        logits: &wgpu::Buffer,
        cols: Columns,
    ) -> Result<()> {
        let output = self.weights.output_projection()?;
        graph::head(
            r,
            &self.cfg,
            &self.weights.output_norm,
            output,
            &self.scratch,
            logits,
            cols,
        )
    }

    /// Largest batch a step with `Logits::All` takes (all logits must fit one binding).
    pub fn max_batch_all_logits(&self) -> u32 {
        let per_token = act_bytes(self.cfg.n_vocab, 1);
        (self.ctx.max_binding() / per_token).clamp(1, self.max_batch as u64) as u32
    }

    /// Run `tokens` at positions pos.. through the model and return the logits.
    pub fn step(&mut self, tokens: &[u32], pos: u32, mode: Logits) -> Result<Vec<f32>> {
        self.step_io(Input::Tokens(tokens), pos, Output::Logits(mode))
    }

    /// Whether a step of `n` tokens at `pos` would first compile kernels that no step
    /// has run yet (a batch size whose builds were not prepared with the upload).
    pub fn compiles_for(&self, n: u32, pos: u32) -> bool {
        let info = StepInfo::new(pos, n);
        crate::ops::needs_compile(self.body.iter().chain(&self.last.0), &info)
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
        self.plan_top_k()?;
        if let Some(t) = &self.top_k {
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
                        let logits =
                            crate::gpu::readback::read_buffer(&self.ctx, &self.last.1, n as usize)?;
                        Ok(crate::sampling::candidates(&logits, k as usize, listed))
                    }
                },
            );
        self.ctx.explain_loss(r)
    }

    /// Build the top-k passes, unless they are built.
    fn plan_top_k(&mut self) -> Result<()> {
        if self.top_k.is_some() {
            return Ok(());
        }
        let words = |w: usize| w as u64 * 4;
        let top_k = |label, bytes| storage(&self.ctx, label, bytes);
        let want = top_k("topk want", words(crate::ops::top_k::WANT_WORDS))?;
        let maxima = top_k("topk maxima", words(crate::ops::top_k::MAX_SPANS as usize))?;
        let found = top_k("topk found", words(crate::ops::top_k::FOUND_WORDS))?;
        let passes = crate::ops::top_k::gpu(
            &self.ctx,
            &self.step,
            [&self.last.1, &want],
            &maxima,
            &found,
            self.cfg.n_vocab,
        )?;
        self.top_k = Some(TopKPlan {
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
        let q = &self.ctx.queue;
        match input {
            Input::Tokens(tokens) => {
                if !self.embeds {
                    return Err(Error::invalid(
                        "this GPU model starts after the embedding: give it hidden states",
                    ));
                }
                if let Some(bad) = tokens.iter().find(|&&t| t >= self.cfg.n_vocab) {
                    return Err(Error::invalid(format!(
                        "token id {bad} is outside the vocabulary of {}",
                        self.cfg.n_vocab
                    )));
                }
                q.write_buffer(&self.ids, 0, bytemuck::cast_slice(tokens));
            }
            Input::Hidden(h) => {
                if self.embeds || h.len() != (n * self.cfg.n_embd) as usize {
                    return Err(Error::invalid(
                        "hidden input: wrong size, or this model embeds tokens itself",
                    ));
                }
                q.write_buffer(&self.scratch.x, 0, bytemuck::cast_slice(h));
            }
        }
        if output != Output::Hidden && !self.head {
            return Err(Error::invalid("this GPU model has no output layer"));
        }
        if output == Output::Logits(Logits::All) && self.all.is_none() {
            let nb = self.max_batch_all_logits();
            let buf = storage(&self.ctx, "logits_all", act_bytes(self.cfg.n_vocab, nb))?;
            let plan = self.record(|r, m| m.record_head(r, &buf, Columns::All))?;
            self.all = Some((plan, buf, nb));
            self.readback
                .reserve(&self.ctx, act_bytes(self.cfg.n_vocab, nb));
        }
        if output == Output::Argmax && self.argmax.is_none() {
            let n = self.cfg.n_vocab;
            let buf = storage(
                &self.ctx,
                "argmax",
                crate::ops::argmax::groups(n) as u64 * 8,
            )?;
            let d = crate::ops::argmax::gpu(&self.ctx, &self.step, &self.last.1, &buf, n)?;
            self.argmax = Some((d, buf));
        }
        let info = StepInfo::new(pos, n);
        q.write_buffer(&self.step, 0, bytemuck::bytes_of(&info));
        let none: &[Dispatch] = &[];
        let (head, out_buf, count) = match output {
            Output::Argmax => {
                let (_, b) = self
                    .argmax
                    .as_ref()
                    .ok_or_else(|| Error::gpu("no greedy-sampling plan"))?;
                let groups = crate::ops::argmax::groups(self.cfg.n_vocab) as usize;
                (self.last.0.as_slice(), b, groups)
            }
            Output::Logits(Logits::Last) => (
                self.last.0.as_slice(),
                &self.last.1,
                self.cfg.n_vocab as usize,
            ),
            Output::Logits(Logits::All) => {
                let (p, b, _) = self
                    .all
                    .as_ref()
                    .ok_or_else(|| Error::gpu("no all-logits plan"))?;
                (p.as_slice(), b, self.cfg.n_vocab as usize * n as usize)
            }
            Output::TopK => {
                let t = self
                    .top_k
                    .as_ref()
                    .ok_or_else(|| Error::gpu("no top-k sampling plan"))?;
                (
                    self.last.0.as_slice(),
                    &t.found,
                    crate::ops::top_k::FOUND_WORDS,
                )
            }
            Output::Hidden => (none, &self.scratch.x, (self.cfg.n_embd * n) as usize),
        };
        let sample: &[Dispatch] = match (output, &self.argmax, &self.top_k) {
            (Output::Argmax, Some((d, _)), _) => std::slice::from_ref(d),
            (Output::TopK, _, Some(t)) => &t.passes,
            _ => none,
        };
        let encoder = |label| {
            self.ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
        };
        // Pipelines compiled only when a step first runs them (a first long prompt).
        crate::ops::prepare(self.body.iter().chain(head.iter()).chain(sample), &info)?;
        let t0 = std::time::Instant::now();
        let mut submit_s = 0.0;
        let submit = |enc: wgpu::CommandEncoder, secs: &mut f64| {
            let cb = enc.finish();
            let t = std::time::Instant::now();
            self.ctx.queue.submit([cb]);
            *secs += t.elapsed().as_secs_f64();
        };
        let mut enc = encoder("step");
        if let Some(prof) = self.profiler.as_mut() {
            prof.begin_step();
        }
        // The body in parts of `submit_every` dispatches, each submitted once the next
        // is begun, so that the device starts on the first layers while the host still
        // records the rest.
        let every = self.submit_every.max(1);
        for (i, part) in self.body.chunks(every).enumerate() {
            if i > 0 {
                submit(
                    std::mem::replace(&mut enc, encoder("step part")),
                    &mut submit_s,
                );
            }
            match &self.chains {
                // Chains span the body: with it in one part and no profiler timing each
                // dispatch.
                Some(c) if part.len() == self.body.len() && self.profiler.is_none() => {
                    crate::ops::chain::record_plan(&mut enc, part, c, &info)?
                }
                _ => record(&mut enc, self.profiler.as_mut(), part.iter(), &info)?,
            }
        }
        let wait = step_wait(&self.ctx, n);
        // Polling keeps a core awake through the body's hundreds of short dispatches,
        // but takes time from the driver's workers in the head's one long product
        // (Gemma 3's output: 38 ms blocking against 41-49 polling, docs/perf.md). So
        // the body goes in a submission of its own, polled until done; the head's is
        // waited for blocking.
        let body_done = match wait {
            Wait::Spin(cap) if !head.is_empty() => {
                submit(
                    std::mem::replace(&mut enc, encoder("step head")),
                    &mut submit_s,
                );
                let (tx, rx) = std::sync::mpsc::channel();
                self.ctx.queue.on_submitted_work_done(move || {
                    let _ = tx.send(());
                });
                Some((rx, cap))
            }
            _ => None,
        };
        record(
            &mut enc,
            self.profiler.as_mut(),
            head.iter().chain(sample),
            &info,
        )?;
        if let Some(prof) = self.profiler.as_ref() {
            prof.finish(&mut enc);
        }
        let bytes = (count * std::mem::size_of::<T>()) as u64;
        self.readback.record(&mut enc, out_buf, 0, bytes)?;
        submit(enc, &mut submit_s);
        let t_wait = std::time::Instant::now();
        let wait = match body_done {
            Some((rx, cap)) => {
                crate::gpu::readback::poll_for(&self.ctx, &rx, cap)?;
                Wait::Block
            }
            None => wait,
        };
        let out = self.readback.read_waiting(&self.ctx, count, wait)?;
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
        if let Some(prof) = self.profiler.as_mut() {
            prof.collect(&self.ctx)?;
        }
        self.pin_workers(n);
        // A loss during this step may leave garbage in a readback that still succeeded.
        self.ctx.check_lost()?;
        Ok(out)
    }

    /// The last step's attention probabilities of the batch's last token, per layer and
    /// head: [n_kv, n_head, n_layer] flattened (positions past the cache are dropped).
    /// Needs `capture_attention` at load.
    pub fn attention(&self, n_kv: u32) -> Result<Vec<Vec<Vec<f32>>>> {
        let cap = self
            .capture
            .as_ref()
            .ok_or_else(|| Error::invalid("the model was loaded without attention capture"))?;
        let (nl, nh, nc) = (
            self.cfg.n_layer as usize,
            self.cfg.n_head as usize,
            self.n_ctx as usize,
        );
        let all: Vec<f32> = crate::gpu::readback::read_buffer(&self.ctx, cap, nl * nh * nc)?;
        let n_kv = (n_kv as usize).min(nc);
        Ok((0..nl)
            .map(|l| {
                (0..nh)
                    .map(|h| all[(l * nh + h) * nc..][..n_kv].to_vec())
                    .collect()
            })
            .collect())
    }

    /// Dispatches that chains spare a single-token step ([`crate::ops::chain`]): 0
    /// where the device runs none.
    pub fn chained_dispatches(&self) -> usize {
        self.chains.as_ref().map_or(0, |c| c.saved())
    }

    /// Distinct pipelines the chains compile ([`crate::ops::chain::Chains::builds`]).
    pub fn chain_builds(&self) -> usize {
        self.chains.as_ref().map_or(0, |c| c.builds())
    }

    /// The fewest and the most cached positions at which a chain runs the attention
    /// that leads it ([`crate::ops::chain::Chains::kv_limits`]); past them a step runs
    /// that attention apart.
    pub fn chain_attention_limits(&self) -> Option<(u32, u32)> {
        self.chains.as_ref().and_then(|c| c.kv_limits())
    }

    /// Single-token steps run with chains so far ([`crate::ops::chain`]).
    pub fn chained_steps(&self) -> usize {
        self.chains.as_ref().map_or(0, |c| c.steps())
    }

    /// The driver's worker threads this model pinned, with their cores
    /// ([`crate::gpu::pin`]): none before its first step, or where it pins none.
    pub fn pinned_workers(&self) -> &[(i32, usize)] {
        &self.pinned
    }

    /// Waits until the chains' pipelines, compiled beside the first steps, are ready, so
    /// that every single-token step from now on runs them; an error if their
    /// compilation failed. Nothing to wait for where the device runs no chains.
    pub fn wait_for_chains(&self) -> Result<()> {
        self.chains.as_ref().map_or(Ok(()), |c| c.wait())
    }

    /// Whether this model holds a copy of the token embedding: to embed tokens, or as
    /// its tied output layer.
    pub fn holds_embedding(&self) -> bool {
        self.weights.token_embd.is_some()
    }

    /// Number of kernel dispatches a generation step runs (of one token, at the start
    /// of the context): the recorded ones whose grid is not empty then (chains apart:
    /// [`Self::chained_dispatches`]).
    pub fn dispatches_per_step(&self) -> usize {
        let s = StepInfo::new(0, 1);
        let runs = |d: &&Dispatch| d.grid(&s).iter().all(|&n| n > 0);
        self.body.iter().chain(&self.last.0).filter(runs).count()
    }
}

/// The layer a tensor named `blk.N.*` belongs to.
fn layer_of(name: &str) -> Option<u32> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Upload the weights of this part of the model (the layers of `range`, the output layer
/// when `head`) straight from the file map, with a progress bar on stderr.
fn upload_weights(
    ctx: &GpuContext,
    file: &GgufFile,
    cfg: &Config,
    range: &std::ops::Range<u32>,
    embeds: bool,
    head: bool,
    progress: bool,
) -> Result<ModelWeights<GpuTensor>> {
    // The token embedding is needed to embed tokens or as a tied output layer; a part
    // with neither keeps no copy (Gemma 3's is 178 MB).
    let tied = file.tensor("output.weight").is_none();
    let holds_embd = embeds || (head && tied);
    let in_part = |name: &str| match layer_of(name) {
        Some(il) => range.contains(&il),
        None => match name {
            "token_embd.weight" => holds_embd,
            "output.weight" => head,
            _ => true,
        },
    };
    let total: u64 = file
        .tensors()
        .iter()
        .filter(|t| in_part(&t.name))
        .map(|t| t.n_bytes)
        .sum();
    let bar = if progress {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "uploading {bar:40} {bytes}/{total_bytes} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let uploaded = |info: &TensorInfo| -> Result<()> {
        file.release(info);
        bar.inc(info.n_bytes);
        Ok(())
    };
    // Copied bytes need not stay resident in the map: released run by run, a large
    // tensor (a 178 MB embedding) is not held twice while it uploads.
    let mut release = |run: &[u8]| file.release_bytes(run);
    let mut load = |name: &str| -> Result<GpuTensor> {
        let info = file
            .tensor(name)
            .ok_or_else(|| Error::model(format!("missing tensor {name}")))?;
        let t = GpuTensor::upload_with(ctx, info, file.tensor_data(info), &mut release)?;
        uploaded(info)?;
        Ok(t)
    };
    let mut fuse = |names: &[&str]| -> Result<Option<GpuTensor>> {
        let Some(infos) = fusable(ctx, file, names) else {
            return Ok(None);
        };
        let parts: Vec<_> = infos.iter().map(|i| (*i, file.tensor_data(i))).collect();
        let name = names.join("+");
        let t = GpuTensor::upload_fused(ctx, &name, &parts, &mut |run| file.release_bytes(run))?;
        for info in infos {
            uploaded(info)?;
        }
        Ok(Some(t))
    };
    let e = cfg.n_embd as u64;
    weights::expect_dims(file, "token_embd.weight", &[e, cfg.n_vocab as u64])?;
    let token_embd = holds_embd.then(|| load("token_embd.weight")).transpose()?;
    let mut layers = Vec::new();
    for il in 0..cfg.n_layer {
        layers.push(if range.contains(&il) {
            Some(weights::layer(file, cfg, il, &mut load, &mut fuse)?)
        } else {
            None
        });
    }
    weights::expect_dims(file, "output_norm.weight", &[e])?;
    let output_norm = load("output_norm.weight")?;
    let output = match file.tensor("output.weight") {
        Some(_) if head => {
            weights::expect_dims(file, "output.weight", &[e, cfg.n_vocab as u64])?;
            Some(load("output.weight")?)
        }
        _ => None,
    };
    bar.finish_and_clear();
    // wgpu keeps the ring's buffers until their last copies have run.
    ctx.release_staging();
    Ok(ModelWeights {
        token_embd,
        layers,
        output_norm,
        output,
    })
}

/// The tensors `names`, when the GPU runs them as one product ([`graph::Proj`]): two
/// or more matrices of one type and row length that fit one storage binding together,
/// on a device that binds the kernels' extra outputs.
/// One dispatch instead of several saves the per-dispatch cost (25-40 us on lavapipe)
/// and gives the small K and V products' rows to more workgroups at once.
pub(super) fn fusable<'a>(
    ctx: &GpuContext,
    file: &'a GgufFile,
    names: &[&str],
) -> Option<Vec<&'a TensorInfo>> {
    if !ctx.fused_outputs() {
        return None;
    }
    let infos: Vec<&TensorInfo> = names
        .iter()
        .map(|n| file.tensor(n))
        .collect::<Option<_>>()?;
    let first = infos.first()?;
    let same = infos
        .iter()
        .all(|i| i.ty == first.ty && i.dims.len() == 2 && i.dims[0] == first.dims[0]);
    let gpu_row = crate::gpu::layout::row_bytes(first.ty, first.dims[0])
        .or_else(|| first.ty.row_bytes(first.dims[0]))?;
    let rows: u64 = infos.iter().map(|i| i.dims[1]).sum();
    (infos.len() > 1 && same && rows * gpu_row <= ctx.max_binding()).then_some(infos)
}
