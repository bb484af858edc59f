//! The GPU backend: weights uploaded once, the whole graph recorded once as a list of
//! bound kernels, and each step replayed into one command submission whose only
//! readback is the logits sampling needs.
//!
//! - `load`: the upload, the buffers, the graph recorded;
//! - `recorder`: the graph's ops as bound kernels;
//! - `step`: a step checked, recorded, submitted and read back;
//! - `pin`: the driver's worker threads pinned to cores.

mod load;
mod pin;
mod recorder;
mod step;

pub(crate) use load::*;
use pin::*;
pub use step::*;

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
    /// What a step may run after the body: the output layer, sampling.
    pub(crate) outputs: OutputPlans,
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
    /// Largest batch a step with `Logits::All` takes (all logits must fit one binding).
    pub fn max_batch_all_logits(&self) -> u32 {
        let per_token = act_bytes(self.cfg.n_vocab, 1);
        (self.ctx.max_binding() / per_token).clamp(1, self.max_batch as u64) as u32
    }

    /// Whether a step of `n` tokens at `pos` would first compile kernels that no step
    /// has run yet (a batch size whose builds were not prepared with the upload).
    pub fn compiles_for(&self, n: u32, pos: u32) -> bool {
        let info = StepInfo::new(pos, n);
        crate::ops::needs_compile(self.body.iter().chain(&self.outputs.last.0), &info)
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
        self.body
            .iter()
            .chain(&self.outputs.last.0)
            .filter(runs)
            .count()
    }
}
