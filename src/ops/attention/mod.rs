//! Causal multi-head attention over the KV cache with grouped-query heads and an
//! optional sliding window, in three kernels: scores (`attn_scores.wgsl`), softmax
//! (`softmax.wgsl`) and the weighted sum of values (`attn_out.wgsl`); single-token steps
//! run all three as one (`attn_decode.wgsl`) where the device has fixed-size subgroups.
//! The probabilities stay in their buffer after the step, so tools can show where the
//! model looked.

use super::chain::{Chainable, KvTrips};
use super::{
    dispatch, groups, op_pipeline, op_pipeline_later, Dispatch, Pipe, StepInfo, WarmJob, WG,
};
use crate::gpu::pipelines::Binding;
use crate::gpu::GpuContext;
use crate::{Error, Result};

mod textures;
use textures::Tex;
pub use textures::{AttnTextures, CacheTextures, LayerTextures};

/// Keys per invocation of `attn_scores` (`TK`) and tokens per invocation of the batch
/// kernels `attn_scores_t8` and `attn_out_t8` (`TT`).
const TILE_KEYS: u32 = 4;
const TILE_TOKENS: u32 = 8;
const OUT_TILE_TOKENS: u32 = 8;

/// The attention kernels a model's steps dispatch (`Attention::gpu`) besides
/// `kv_store` and `attn_decode`: the single-token scores and weighted sum (where
/// `attn_decode` does not run single tokens), and the batch kernels that read storage
/// buffers or, where [`AttnTextures`] are made, textures.
const SINGLE_KERNELS: [&str; 2] = ["attn_scores", "attn_out"];
const BATCH_KERNELS: [&str; 2] = ["attn_scores_t8", "attn_out_t8"];
const BATCH_TEXTURE_KERNELS: [&str; 2] = ["attn_scores_t8_tex", "attn_out_t8_tex"];

/// The bindings of the scores and weighted-sum kernels: the step, their parameters,
/// their two operands (storage buffers, or textures for the `_tex` builds) and their
/// output.
const fn attention_layout(operand: Binding) -> [Binding; 5] {
    [
        Binding::Uniform,
        Binding::Uniform,
        operand,
        operand,
        Binding::ReadWrite,
    ]
}

/// A kernel of attention, laid out as [`attention_layout`] says, compiled when a step first runs it, or when the load warms it:
/// the batch kernels (`BATCH_KERNELS`, `BATCH_TEXTURE_KERNELS`), and the single-token
/// ones where `attn_decode` runs single tokens ([`single_pipeline`]).
fn later_pipeline(ctx: &GpuContext, name: &str) -> Result<Pipe> {
    let operand = match name.ends_with("_tex") {
        true => Binding::Texture,
        false => Binding::Read,
    };
    op_pipeline_later(ctx, name, &attention_layout(operand))
}

/// A single-token kernel of [`SINGLE_KERNELS`]. Where `attn_decode` runs single tokens
/// (`decodes`), these run only past [`DECODE_MAX_KV`] cached positions, and compile when a
/// step first needs them (or with the load, for a context that long).
fn single_pipeline(ctx: &GpuContext, name: &str, decodes: bool) -> Result<Pipe> {
    match decodes {
        true => later_pipeline(ctx, name),
        false => Ok(Pipe::Ready(op_pipeline(ctx, name)?)),
    }
}

/// Compiles `pipe` now, if it is deferred.
fn compile_now(pipe: Pipe) -> Result<()> {
    match pipe {
        Pipe::Deferred(d) => d.get().map(drop),
        Pipe::Ready(_) => Ok(()),
    }
}

/// Kernel `name` reading `textures` (bindings 2 and 3) and writing `out` (binding 4).
fn tex_dispatch<P: bytemuck::Pod>(
    ctx: &GpuContext,
    name: &str,
    step: &wgpu::Buffer,
    params: &P,
    textures: [&Tex; 2],
    out: &wgpu::Buffer,
    grid: impl Fn(&StepInfo) -> [u32; 3] + Send + Sync + 'static,
) -> Result<Dispatch> {
    let resources = vec![
        wgpu::BindingResource::TextureView(&textures[0].1),
        wgpu::BindingResource::TextureView(&textures[1].1),
        out.as_entire_binding(),
    ];
    let pipeline = later_pipeline(ctx, name)?;
    super::dispatch_bound(ctx, name, pipeline, step, params, resources, grid)
}

/// Compiling (or finding) each pipeline of `attn` ahead of recording, one job per
/// pipeline, for any thread; the batch kernels only for a first step of `batch` tokens
/// over one.
pub fn warm_jobs<'a>(ctx: &'a GpuContext, attn: &Attention, batch: u32) -> Vec<WarmJob<'a>> {
    let batch_kernels = if attn.reads_textures(ctx) {
        BATCH_TEXTURE_KERNELS
    } else {
        BATCH_KERNELS
    };
    let mut jobs: Vec<WarmJob<'_>> = vec![Box::new(move || op_pipeline(ctx, "kv_store").map(drop))];
    let decodes = decode_available(ctx);
    if !decodes || attn.n_ctx > DECODE_MAX_KV {
        for name in SINGLE_KERNELS {
            jobs.push(Box::new(move || {
                compile_now(single_pipeline(ctx, name, decodes)?)
            }));
        }
    }
    if batch > 1 {
        for name in batch_kernels {
            jobs.push(Box::new(move || compile_now(later_pipeline(ctx, name)?)));
        }
    }
    let n_ctx = attn.n_ctx;
    jobs.push(Box::new(move || {
        super::reduce_pipeline(ctx, "softmax", &[], n_ctx).map(drop)
    }));
    let decode_tex = attn.decodes_from_textures(ctx);
    let heads = attn.decode_heads(decode_tex);
    jobs.push(Box::new(move || {
        decode_pipeline(ctx, decode_tex, heads, 1).map(drop)
    }));
    let splits = attn.decode_splits(decode_tex, heads);
    if splits > 1 {
        jobs.push(Box::new(move || {
            decode_pipeline(ctx, decode_tex, heads, splits)?;
            op_pipeline_with(ctx, "attn_decode_join", splits).map(drop)
        }));
    }
    jobs
}

/// `attn_decode_join` for `splits` splits.
fn op_pipeline_with(
    ctx: &GpuContext,
    name: &str,
    splits: u32,
) -> Result<std::sync::Arc<wgpu::ComputePipeline>> {
    let consts = [("WG", WG as f64), ("SPLITS", splits as f64)];
    ctx.pipelines.get(&ctx.device, name, &consts, || {
        crate::gpu::shaders::op_source(name)
    })
}

/// Most cached positions a single-token step may hold for `attn_decode`: it runs one
/// workgroup per head, which a long context would leave with too little parallelism on
/// a real GPU, where the three split kernels spread the keys over the device.
pub const DECODE_MAX_KV: u32 = 4096;

/// Whether a step's attention runs as `attn_decode` (where the device has it).
fn decode_fused(s: &StepInfo) -> bool {
    s.n_tokens == 1 && s.n_kv <= DECODE_MAX_KV
}

/// Fewest cached positions at which `attn_decode` splits its keys where it has splits
/// (`Attention::decode_splits`): below, the join's dispatch (about 60 us on lavapipe)
/// costs about what the idle cores do (SmolLM2 at 2000 positions: 17.4 ms of attention
/// per step whole, 14.3 split plus 1.9 joining; docs/perf.md).
pub const SPLIT_MIN_KV: u32 = 2048;

/// Whether a step runs `attn_decode` with its keys split.
fn decode_split(s: &StepInfo) -> bool {
    decode_fused(s) && s.n_kv >= SPLIT_MIN_KV
}

/// Most splits of `attn_decode`'s keys (`MAX_SPLITS` in `attn_decode_join`).
const MAX_DECODE_SPLITS: u32 = 16;

/// Most query heads one `attn_decode` workgroup takes (`MAX_HG` in its shader).
const MAX_DECODE_HEADS: u32 = 4;

/// `attn_decode`'s pipeline (`attn_decode_tex` with `tex`) for workgroups of `heads`
/// query heads and keys in `splits`, or None where the device cannot run it: its
/// workgroup must be one whole subgroup, and it binds six storage buffers. Where the
/// context runs chains, the whole rows' build from textures is laid out for a chain to
/// join ([`Attention::decode_chainable`]), compiled now all the same.
fn decode_pipeline(ctx: &GpuContext, tex: bool, heads: u32, splits: u32) -> Result<Option<Pipe>> {
    let Some(sg) = ctx.fixed_subgroup().filter(|_| decode_available(ctx)) else {
        return Ok(None);
    };
    let consts = [
        ("WG", sg as f64),
        ("HG", heads as f64),
        ("SPLITS", splits as f64),
    ];
    let name = if tex {
        "attn_decode_tex"
    } else {
        "attn_decode"
    };
    let source = || crate::gpu::shaders::op_source(name);
    if !(ctx.chains() && tex && splits == 1) {
        let pipe = ctx.pipelines.get(&ctx.device, name, &consts, source)?;
        return Ok(Some(Pipe::Ready(pipe)));
    }
    let d = ctx
        .pipelines
        .deferred(&ctx.device, name, &consts, &DECODE_TEX_BINDINGS, source)?;
    d.get()?;
    Ok(Some(Pipe::Deferred(d)))
}

/// `attn_decode_tex`'s bindings: the step, its parameters, q (a uniform), K's and V's
/// textures, the probabilities, the output and the splits' parts.
const DECODE_TEX_BINDINGS: [Binding; 8] = [
    Binding::Uniform,
    Binding::Uniform,
    Binding::Uniform,
    Binding::Texture,
    Binding::Texture,
    Binding::ReadWrite,
    Binding::ReadWrite,
    Binding::ReadWrite,
];

/// The first key a query at `qpos` sees (common/attn_mask.wgsl's `window_start`): past a
/// sliding `window`'s reach, the one `window` keys back; else key 0.
pub fn window_start(window: u32, qpos: u32) -> u32 {
    match window > 0 && qpos + 1 > window {
        true => qpos + 1 - window,
        false => 0,
    }
}

/// Whether the device runs `attn_decode`: its workgroup must be one whole subgroup,
/// and it binds six storage buffers.
fn decode_available(ctx: &GpuContext) -> bool {
    ctx.fixed_subgroup().is_some() && ctx.limits.max_storage_buffers_per_shader_stage >= 6
}

#[derive(Clone, Copy, Debug)]
pub struct Attention {
    pub head_dim: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    /// Context length the cache holds.
    pub n_ctx: u32,
    /// Keys at least this far behind the query are masked; 0 for none.
    pub window: u32,
    pub scale: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct ScoreParams {
    head_dim: u32,
    n_head: u32,
    n_head_kv: u32,
    window: u32,
    scale: f32,
    t0: u32,
    tn: u32,
    _pad: u32,
}

/// `attn_decode`'s and `attn_decode_join`'s (shaders/common/attn_dec_params.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct DecodeParams {
    head_dim: u32,
    n_head: u32,
    n_head_kv: u32,
    window: u32,
    scale: f32,
    _pad0: u32,
    /// Rows per head of the probabilities.
    tn: u32,
    _pad1: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct SoftmaxParams {
    n_head: u32,
    t0: u32,
    tn: u32,
    window: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct OutParams {
    head_dim: u32,
    n_head: u32,
    n_head_kv: u32,
    _pad0: u32,
    t0: u32,
    tn: u32,
    /// As [`ScoreParams`]' (0: no sliding window).
    window: u32,
    _pad1: u32,
}

/// How a batch's attention is cut into chunks of tokens, each chunk's probabilities
/// ([n_kv rounded up to 4, tokens, n_head]) written, normalised and used before the next's: the scratch
/// holds one chunk, not the batch (a batch of 512 at a context of 4096 would need
/// 8 MiB per head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunks {
    /// Tokens per chunk.
    pub tokens: u32,
    /// Chunks recorded: enough for the largest batch.
    pub count: u32,
}

impl Chunks {
    /// Chunks for batches of up to `max_batch` tokens whose probabilities for a context
    /// of `n_ctx` take at most `budget` bytes (and at least one token's).
    pub fn new(n_head: u32, n_ctx: u32, max_batch: u32, budget: u64) -> Chunks {
        let per_token = (n_head as u64 * probs_row(n_ctx) * 4).max(1);
        let tokens = (budget / per_token).clamp(1, max_batch.max(1) as u64) as u32;
        Chunks {
            tokens,
            count: max_batch.max(1).div_ceil(tokens),
        }
    }

    /// The whole batch of `n_tokens` in one chunk.
    pub fn one(n_tokens: u32) -> Chunks {
        Chunks {
            tokens: n_tokens.max(1),
            count: 1,
        }
    }

    /// Bytes of the probabilities scratch for a context of `n_ctx`.
    pub fn probs_bytes(&self, n_head: u32, n_ctx: u32) -> u64 {
        n_head as u64 * probs_row(n_ctx) * self.tokens as u64 * 4
    }
}

/// Probabilities per (token, head) row for `n_kv` cached positions: rounded up to whole
/// pairs of vec4s (`probs_stride` in common/step.wgsl).
pub fn probs_row(n_kv: u32) -> u64 {
    n_kv.next_multiple_of(8) as u64
}

impl Attention {
    /// Whether a batch's attention reads its operands from textures on `ctx`: where the
    /// device keeps matrices there ([`GpuContext::attention_in_textures`]) and the head
    /// size is divisible by 8, as eight halves of K from each head's start are one
    /// texel ([`AttnTextures`] also wants each texture to fit the device).
    pub fn reads_textures(&self, ctx: &GpuContext) -> bool {
        ctx.attention_in_textures() && self.head_dim % 8 == 0
    }

    /// Query heads per `attn_decode` workgroup. 1 where it reads storage buffers (GPUs:
    /// a workgroup per head spreads the step over the device). Where it reads K and V
    /// from textures (CPU-hosted drivers, whose cost is the loads), the most heads of
    /// one K/V head, up to [`MAX_DECODE_HEADS`], that leave a workgroup per driver
    /// thread: each key's and value's loads then serve them all.
    fn decode_heads(&self, tex: bool) -> u32 {
        if !tex || self.n_head_kv == 0 {
            return 1;
        }
        let cores = crate::gpu::context::driver_threads();
        let group = self.n_head / self.n_head_kv;
        (1..=MAX_DECODE_HEADS.min(group))
            .rev()
            .find(|&g| group % g == 0 && self.n_head / g >= cores)
            .unwrap_or(1)
    }

    /// Splits of each `attn_decode` workgroup's keys at long contexts ([`SPLIT_MIN_KV`])
    /// where it reads textures (CPU-hosted drivers): 1 where its workgroups of `heads`
    /// heads are a multiple of the driver's threads (one per core unless
    /// `LP_NUM_THREADS` says otherwise), else enough for twice as many workgroups as
    /// threads, so that no core idles while another works through a whole row
    /// (SmolLM2's three groups on two cores: six workgroups). GPUs keep one.
    fn decode_splits(&self, tex: bool, heads: u32) -> u32 {
        let cores = crate::gpu::context::driver_threads();
        let groups = self.n_head / heads.max(1);
        if !tex || self.n_ctx < SPLIT_MIN_KV || groups == 0 || groups % cores == 0 {
            return 1;
        }
        (2 * cores).div_ceil(groups).clamp(1, MAX_DECODE_SPLITS)
    }

    /// What `attn_decode`'s whole rows' build needs to lead a chain (`ops::chain`): a
    /// bound on a workgroup's loop trips, `heads` query heads over the cached
    /// positions, counted from the kernel's loops with a margin (each loop's trips plus
    /// its exit, unrolled ones too): per eight positions, the scores' four keys per lane
    /// and their `head_dim / 8` pairs of texels for each head, the softmax's two walks,
    /// and each lane's value rows over a texel of eight positions for each head. It
    /// serves steps up to [`DECODE_MAX_KV`] positions, or with `splits`, below
    /// [`SPLIT_MIN_KV`].
    fn decode_chainable(&self, ctx: &GpuContext, heads: u32, splits: bool) -> Chainable {
        let wg = ctx.fixed_subgroup().unwrap_or(1).max(1);
        let d4 = self.head_dim / 4;
        let hg = heads;
        // One trip of the scores' loop: its four keys, the pairs of texels (each over
        // the heads) and the mask's walk over the heads.
        let key_trip = 1 + 5 + (d4 / 2 + 1) * (hg + 2) + (hg + 1);
        // The lanes' walks over the vec4s of positions: the zeroing (windowed layers),
        // the scores and the softmax's two, 2 / WG trips per eight positions each.
        let walks = (hg + 1) + key_trip + 2 * hg;
        // The values: each lane's rows, over a texel of eight positions, each head.
        let rows = d4.div_ceil(wg) + 2;
        let per_8 = (2 * walks).div_ceil(wg) + rows * (hg + 2);
        let trips = 2 * walks + hg + 1 + rows * (2 * (hg + 2) + hg + 1) + 64;
        let max_kv = match splits {
            true => SPLIT_MIN_KV - 1,
            false => DECODE_MAX_KV,
        };
        Chainable {
            trips,
            kv: Some(KvTrips { per_8, max_kv }),
        }
    }

    /// Whether single tokens read q as a uniform and K and V from textures
    /// (`attn_decode_tex`), given a q buffer that binds as one
    /// (`mul_mat::reads_uniform`).
    fn decodes_from_textures(&self, ctx: &GpuContext) -> bool {
        self.reads_textures(ctx) && super::mul_mat::binds_x_view(ctx)
    }

    /// Bytes of one token's Q (f32) and of one position of the K cache (f16).
    fn q_row_bytes(&self) -> u64 {
        self.head_dim as u64 * self.n_head as u64 * 4
    }
    fn k_row_bytes(&self) -> u64 {
        self.head_dim as u64 * self.n_head_kv as u64 * 2
    }

    /// Bytes of one layer's K (or V) cache.
    fn cache_bytes(&self) -> u64 {
        super::kv_store::cache_bytes(self.head_dim * self.n_head_kv, self.n_ctx)
    }

    fn check(&self) -> Result<()> {
        if self.n_head_kv == 0 || self.n_head % self.n_head_kv != 0 || self.head_dim % 4 != 0 {
            return Err(Error::model(format!(
                "attention: {} heads over {} KV heads of size {} (need a whole group per KV head \
                 and a head size divisible by 4)",
                self.n_head, self.n_head_kv, self.head_dim
            )));
        }
        Ok(())
    }

    /// q: [head_dim, n_head, n_tokens]; caches as `kv_store` writes them;
    /// probs: [n_kv, chunks.tokens, n_head] scratch; out: [head_dim, n_head, n_tokens].
    /// Five dispatches per chunk, of which a step records three (scores, softmax,
    /// weighted sum; one- or four-token tiles); chunks past a step's batch record none.
    /// Where the device has it, one more for single-token steps (`attn_decode`), which
    /// then record nothing else. With `tex` (a layer's [`AttnTextures`]), batches read
    /// their operands from those textures, and single tokens K and V, copied there
    /// before the first kernel that reads them (`LayerTextures::cache_copies`).
    #[allow(clippy::too_many_arguments)]
    pub fn gpu(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        q: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        probs: &wgpu::Buffer,
        out: &wgpu::Buffer,
        chunks: Chunks,
        tex: Option<LayerTextures<'_>>,
    ) -> Result<Vec<Dispatch>> {
        self.check()?;
        let tex = tex.filter(|_| self.reads_textures(ctx));
        let bufs = [q, k_cache, v_cache, probs, out];
        let fused = self.decode_dispatch(ctx, step, bufs, chunks, tex)?;
        let mut d = Vec::new();
        for c in 0..chunks.count {
            d.extend(self.gpu_chunk(ctx, step, bufs, c, chunks, fused.is_some(), tex)?);
        }
        d.extend(fused.into_iter().flatten());
        Ok(d)
    }

    /// The batch scores of chunk `c` from `tex`, after the copies of this step's Q and
    /// of the caches into them when `c` is the first chunk.
    fn scores_from_textures(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        [q, k_cache, v_cache, probs]: [&wgpu::Buffer; 4],
        (sp, c): (&ScoreParams, u32),
        tex: LayerTextures<'_>,
        grid: impl Fn(&StepInfo) -> [u32; 3] + Send + Sync + 'static,
    ) -> Result<Dispatch> {
        let d = tex_dispatch(
            ctx,
            "attn_scores_t8_tex",
            step,
            sp,
            [tex.q, tex.k],
            probs,
            grid,
        )?;
        if c > 0 {
            return Ok(d);
        }
        let q_row = self.q_row_bytes();
        let mut copies = vec![tex.q.copy_range(q, move |s| 0..s.n_tokens as u64 * q_row)];
        copies.extend(tex.cache_copies(self, k_cache, v_cache));
        Ok(d.with_copies(copies))
    }

    /// The batch weighted sum of a chunk of `tn` tokens from `tex`, after the copy of
    /// the chunk's probabilities into it (the first chunk's scores copied V).
    fn out_from_textures(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        (probs, out): (&wgpu::Buffer, &wgpu::Buffer),
        (op, tn): (&OutParams, u32),
        tex: LayerTextures<'_>,
        grid: impl Fn(&StepInfo) -> [u32; 3] + Send + Sync + 'static,
    ) -> Result<Dispatch> {
        let d = tex_dispatch(
            ctx,
            "attn_out_t8_tex",
            step,
            op,
            [tex.probs, tex.v],
            out,
            grid,
        )?;
        let n_head = self.n_head as u64;
        let rows = move |s: &StepInfo| 0..n_head * tn as u64 * probs_row(s.n_kv) * 4;
        Ok(d.with_copies(vec![tex.probs.copy_range(probs, rows)]))
    }

    /// The single-token steps' one dispatch (`attn_decode.wgsl`) where the device runs
    /// it: a fixed subgroup size and five storage buffers per stage. It covers steps of
    /// up to [`DECODE_MAX_KV`] cached positions, which [`decode_fused`] tells apart.
    /// With `tex`, where `q` can be bound as a uniform (the models' activation buffers),
    /// it reads q as a uniform and K and V from `tex`, copied there first
    /// (`attn_decode_tex`): on lavapipe a storage load costs many times a uniform or texel
    /// load (docs/perf.md). Kept textures get the step's key and value either way.
    fn decode_dispatch(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        [q, k_cache, v_cache, probs, out]: [&wgpu::Buffer; 5],
        chunks: Chunks,
        tex: Option<LayerTextures<'_>>,
    ) -> Result<Option<Vec<Dispatch>>> {
        let kept = tex.filter(|t| t.kept());
        let tex =
            tex.filter(|_| self.decodes_from_textures(ctx) && super::mul_mat::reads_uniform(q));
        let heads = self.decode_heads(tex.is_some());
        let splits = self.decode_splits(tex.is_some(), heads);
        let Some(whole) = decode_pipeline(ctx, tex.is_some(), heads, 1)? else {
            return Ok(None);
        };
        let p = DecodeParams {
            head_dim: self.head_dim,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            window: self.window,
            scale: self.scale,
            _pad0: 0,
            tn: chunks.tokens,
            _pad1: 0,
        };
        let part_bytes = (self.n_head * splits * (self.head_dim / 4 + 1)) as u64 * 16;
        let part = crate::gpu::upload::storage(ctx, "attn_decode_part", part_bytes)?;
        // The whole rows, and with splits, the split build for long contexts: a step
        // runs one of them.
        let mut builds = vec![(whole, 1)];
        if splits > 1 {
            let split = decode_pipeline(ctx, tex.is_some(), heads, splits)?;
            builds.extend(split.map(|pipe| (pipe, splits)));
        }
        let has_splits = builds.len() > 1;
        let groups = self.n_head / heads;
        let mut dispatches = Vec::new();
        for (pipe, n) in builds {
            let grid = move |s: &StepInfo| {
                let on = decode_fused(s) && (!has_splits || decode_split(s) == (n > 1));
                [groups * n * on as u32, 1, 1]
            };
            let Some(t) = tex else {
                let bufs = [q, k_cache, v_cache, probs, out, &part];
                let d = dispatch(ctx, "attn_decode", pipe, step, &p, &bufs, grid)?;
                let copies = kept.map(|t| t.cache_copies(self, k_cache, v_cache));
                dispatches.push(d.with_copies(copies.unwrap_or_default()));
                continue;
            };
            let resources = vec![
                // The uniform q of common/attn_dec_texture.wgsl: the buffer's first bytes.
                wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: q,
                    offset: 0,
                    size: wgpu::BufferSize::new(super::mul_mat::X_UNIFORM_BYTES),
                }),
                wgpu::BindingResource::TextureView(&t.k.1),
                wgpu::BindingResource::TextureView(&t.v.1),
                probs.as_entire_binding(),
                out.as_entire_binding(),
                part.as_entire_binding(),
            ];
            let chainable = matches!(pipe, Pipe::Deferred(_)) && n == 1;
            let d = super::dispatch_bound(ctx, "attn_decode", pipe, step, &p, resources, grid)?;
            let d = d.with_copies(t.cache_copies(self, k_cache, v_cache));
            dispatches.push(match chainable {
                true => d.chainable(self.decode_chainable(ctx, heads, has_splits)),
                false => d,
            });
        }
        if has_splits {
            let join = op_pipeline_with(ctx, "attn_decode_join", splits)?;
            let n_head = self.n_head;
            let grid = move |s: &StepInfo| [n_head * decode_split(s) as u32, 1, 1];
            let bufs = [probs, out, &part];
            dispatches.push(dispatch(
                ctx,
                "attn_decode_join",
                join,
                step,
                &p,
                &bufs,
                grid,
            )?);
        }
        Ok(Some(dispatches))
    }

    /// The dispatches of chunk `c` (tokens c * tokens ..): buffers as in [`Self::gpu`].
    #[allow(clippy::too_many_arguments)]
    fn gpu_chunk(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        [q, k_cache, v_cache, probs, out]: [&wgpu::Buffer; 5],
        c: u32,
        chunks: Chunks,
        fused: bool,
        tex: Option<LayerTextures<'_>>,
    ) -> Result<[Dispatch; 5]> {
        let n_head = self.n_head;
        let (t0, tn) = (c * chunks.tokens, chunks.tokens);
        // The chunk's tokens in this step's batch; none past its end. The grid never
        // exceeds the chunk, so the kernels check only the batch's end (on llvmpipe a
        // second bound check made the scores kernel 30x slower).
        let rows = move |s: &StepInfo| s.n_tokens.saturating_sub(t0).min(tn);
        let sp = ScoreParams {
            head_dim: self.head_dim,
            n_head,
            n_head_kv: self.n_head_kv,
            window: self.window,
            scale: self.scale,
            t0,
            tn,
            _pad: 0,
        };
        // Single-token steps run the one-token tiles, batches the four-token ones; the
        // other dispatch of each pair has an empty grid and is not recorded.
        // Steps that `attn_decode` covers record none of these.
        let one: fn(&StepInfo) -> bool = if fused {
            |s: &StepInfo| s.n_tokens == 1 && !decode_fused(s)
        } else {
            |s: &StepInfo| s.n_tokens == 1
        };
        let not_fused = move |s: &StepInfo| !(fused && decode_fused(s)) as u32;
        let grid = move |tt: u32, on: fn(&StepInfo) -> bool| {
            move |s: &StepInfo| {
                let on = on(s) as u32;
                [
                    groups(s.n_kv, TILE_KEYS * WG) * on,
                    rows(s).div_ceil(tt),
                    n_head,
                ]
            }
        };
        let scores = |name: &str, tt: u32, on: fn(&StepInfo) -> bool| {
            let bufs = [q, k_cache, probs];
            let pipe = match tt {
                1 => single_pipeline(ctx, name, fused)?,
                _ => later_pipeline(ctx, name)?,
            };
            dispatch(ctx, name, pipe, step, &sp, &bufs, grid(tt, on))
        };
        let mut scores1 = scores("attn_scores", 1, one)?;
        // Kept textures get a single token's key and value where it reads the buffers.
        if let Some(t) = tex.filter(|t| t.kept() && c == 0) {
            scores1 = scores1.with_copies(t.cache_copies(self, k_cache, v_cache));
        }
        let batch = |s: &StepInfo| s.n_tokens != 1;
        let scores4 = match tex {
            Some(t) => {
                let bufs = [q, k_cache, v_cache, probs];
                let g = grid(TILE_TOKENS, batch);
                self.scores_from_textures(ctx, step, bufs, (&sp, c), t, g)?
            }
            None => scores("attn_scores_t8", TILE_TOKENS, batch)?,
        };
        let softmax = dispatch(
            ctx,
            "softmax",
            super::reduce_pipeline(ctx, "softmax", &[], self.n_ctx)?,
            step,
            &SoftmaxParams {
                n_head,
                t0,
                tn,
                window: self.window,
            },
            &[probs],
            move |s| [rows(s) * not_fused(s), n_head, 1],
        )?;
        let op = OutParams {
            head_dim: self.head_dim,
            n_head,
            n_head_kv: self.n_head_kv,
            _pad0: 0,
            t0,
            tn,
            window: self.window,
            _pad1: 0,
        };
        let hd = self.head_dim;
        let out_grid = move |tt: u32, on: fn(&StepInfo) -> bool| {
            move |s: &StepInfo| {
                let on = on(s) as u32;
                [groups(hd / 4 * rows(s).div_ceil(tt), WG) * on, 1, n_head]
            }
        };
        let weighted = |name: &str, tt: u32, on: fn(&StepInfo) -> bool| {
            let bufs = [probs, v_cache, out];
            let pipe = match tt {
                1 => single_pipeline(ctx, name, fused)?,
                _ => later_pipeline(ctx, name)?,
            };
            dispatch(ctx, name, pipe, step, &op, &bufs, out_grid(tt, on))
        };
        let out1 = weighted("attn_out", 1, one)?;
        let out4 = match tex {
            Some(t) => {
                let g = out_grid(OUT_TILE_TOKENS, batch);
                self.out_from_textures(ctx, step, (probs, out), (&op, tn), t, g)?
            }
            None => weighted("attn_out_t8", OUT_TILE_TOKENS, batch)?,
        };
        Ok([scores1, scores4, softmax, out1, out4])
    }

    /// CPU reference over f32 caches in the GPU's order (k: [head_dim, n_head_kv, n_ctx],
    /// v: [n_ctx, head_dim * n_head_kv]); `pos` is the first token's position and the
    /// caches already hold positions 0 .. pos + n_tokens.
    pub fn reference(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        out: &mut [f32],
        pos: u32,
        n_tokens: u32,
    ) {
        let (hd, nh, nkv) = (
            self.head_dim as usize,
            self.n_head as usize,
            self.n_head_kv as usize,
        );
        let group = nh / nkv;
        let n_kv = (pos + n_tokens) as usize;
        let mut s = vec![0f32; n_kv];
        for t in 0..n_tokens as usize {
            let qpos = pos as usize + t;
            for h in 0..nh {
                let hk = h / group;
                let qv = &q[(t * nh + h) * hd..][..hd];
                let mut m = f32::NEG_INFINITY;
                for (j, sj) in s.iter_mut().enumerate() {
                    let masked = j > qpos || (self.window > 0 && qpos - j >= self.window as usize);
                    *sj = if masked {
                        f32::NEG_INFINITY
                    } else {
                        let kv = &k_cache[(j * nkv + hk) * hd..][..hd];
                        qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * self.scale
                    };
                    m = m.max(*sj);
                }
                let mut sum = 0.0;
                for sj in s.iter_mut() {
                    *sj = (*sj - m).exp();
                    sum += *sj;
                }
                for d in 0..hd {
                    let vrow = &v_cache[(hk * hd + d) * self.n_ctx as usize..];
                    let acc: f32 = s.iter().zip(vrow).map(|(p, v)| p * v).sum();
                    out[(t * nh + h) * hd + d] = acc / sum;
                }
            }
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct CaptureParams {
    n_head: u32,
    n_ctx: u32,
    offset: u32,
    tn: u32,
}

/// Copy the last token's probabilities of one layer into `capture` ([n_ctx, n_head] at
/// float `offset`), zero past the cached positions; `probs` as [`Attention::gpu`] with
/// `chunks` left it.
#[allow(clippy::too_many_arguments)]
pub fn capture_gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    probs: &wgpu::Buffer,
    capture: &wgpu::Buffer,
    n_head: u32,
    n_ctx: u32,
    offset: u32,
    chunks: Chunks,
) -> Result<Dispatch> {
    let p = CaptureParams {
        n_head,
        n_ctx,
        offset,
        tn: chunks.tokens,
    };
    dispatch(
        ctx,
        "attn_capture",
        op_pipeline(ctx, "attn_capture")?,
        step,
        &p,
        &[probs, capture],
        move |_| [groups(n_ctx, WG), n_head, 1],
    )
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::{check_const, wgsl_mirror};

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::ScoreParams, "ops/attn_scores.wgsl", "Params", {
            head_dim, n_head, n_head_kv, window, scale, t0, tn
        });
        wgsl_mirror!(super::DecodeParams, "common/attn_dec_params.wgsl", "Params", {
            head_dim, n_head, n_head_kv, window, scale, tn
        });
        wgsl_mirror!(super::SoftmaxParams, "ops/softmax.wgsl", "Params", {
            n_head,
            t0,
            tn,
            window,
        });
        wgsl_mirror!(super::OutParams, "ops/attn_out.wgsl", "Params", {
            head_dim, n_head, n_head_kv, t0, tn, window
        });
        wgsl_mirror!(super::CaptureParams, "ops/attn_capture.wgsl", "Params", {
            n_head,
            n_ctx,
            offset,
            tn,
        });
        check_const(
            "ops/attn_decode_join.wgsl",
            "MAX_SPLITS",
            super::MAX_DECODE_SPLITS.into(),
        );
        check_const(
            "ops/attn_decode.wgsl",
            "MAX_HG",
            super::MAX_DECODE_HEADS.into(),
        );
    }
}
