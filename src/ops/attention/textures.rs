//! The textures attention reads its operands from on CPU-hosted drivers, where a texel
//! load is one SIMD gather and a storage load a loop over the lanes and words (the
//! loads were half the scores kernel's time, docs/perf.md): this step's Q and a chunk's
//! probabilities, copied from their buffers before the kernels read them, and the K and
//! V caches, which the store kernels write into buffers and copies bring here.
//!
//! The caches' textures are kept per layer where they fit a budget: a batch step then
//! copies only the positions it stored, and a single token's key and value are written
//! there by the kernel that appends them to the cache (`kv_store::gpu_with_rope`, or
//! the end of the layer's Q/K/V product, `mul_mat::gpu_qkv_rope`), so that decoding
//! records no copies. Past the budget one set serves every layer (the layers run one
//! after another), and each layer's step copies all the positions it reads into it: at
//! 4096 positions that was a quarter of SmolLM2's decode step.

use super::{window_start, Attention, Chunks};
use crate::gpu::GpuContext;
use crate::ops::{StepInfo, TextureCopy};
use crate::Result;

/// Most bytes the caches' textures of all layers may take for [`CacheTextures::Kept`]:
/// they double the KV cache's memory, which is worth a faster long context up to here.
const KEPT_BUDGET: u64 = 1 << 30;

/// Where the caches' textures live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheTextures {
    /// One set for every layer, refilled by each layer's step with what it reads.
    Shared,
    /// A set for each of `n` layers from layer `first`, kept across steps: each batch
    /// copies only the positions it stores, and single tokens none where the store
    /// kernel writes them ([`LayerTextures::stored_by_store`]).
    Kept { first: u32, n: u32 },
}

impl CacheTextures {
    /// Kept for `layers` of `attn`'s shape where their textures take at most
    /// `KEPT_BUDGET`; else shared. Short contexts keep them too: a shared set's copies
    /// are few bytes there, but each copy command, and the compute pass it splits, cost
    /// a lavapipe decode step more than its bytes (docs/perf.md).
    pub fn for_layers(attn: &Attention, layers: std::ops::Range<u32>) -> CacheTextures {
        let n = layers.len() as u32;
        if 2 * n as u64 * attn.cache_bytes() > KEPT_BUDGET {
            return CacheTextures::Shared;
        }
        CacheTextures::Kept {
            first: layers.start,
            n,
        }
    }
}

/// A texture and its view.
pub(super) struct Tex(pub(super) wgpu::Texture, pub(super) wgpu::TextureView);

impl Tex {
    /// A texture holding `bytes` bytes row-major ([`crate::gpu::upload::scratch_texture`]).
    fn scratch(ctx: &GpuContext, label: &str, bytes: u64) -> Result<Tex> {
        Ok(Tex::of(crate::gpu::upload::scratch_texture(
            ctx, label, bytes,
        )?))
    }

    fn of(t: wgpu::Texture) -> Tex {
        let v = t.create_view(&Default::default());
        Tex(t, v)
    }

    /// A copy of bytes `range(step)` of `src` (whole texels) into the same bytes of
    /// this texture.
    pub(super) fn copy_range(
        &self,
        src: &wgpu::Buffer,
        range: impl Fn(&StepInfo) -> std::ops::Range<u64> + Send + Sync + 'static,
    ) -> TextureCopy {
        TextureCopy {
            src: src.clone(),
            dst: self.0.clone(),
            bytes: Box::new(range),
        }
    }
}

/// One layer's K and V cache textures, each holding its buffer's bytes as they are.
struct CacheSet {
    k: Tex,
    v: Tex,
}

/// Textures for the attention of batches of up to `max_batch` tokens; see the module.
pub struct AttnTextures {
    q: Tex,
    probs: Tex,
    /// One per layer from layer `first` where kept, else the one shared set.
    caches: Vec<CacheSet>,
    first: u32,
    kept: bool,
}

impl AttnTextures {
    /// Textures for batches of up to `max_batch` tokens of `attn`'s heads over its
    /// cache of `attn.n_ctx` positions, with probabilities in `chunks`, and the caches'
    /// as `caches` says, where `attn` reads its operands from textures on this device
    /// ([`Attention::reads_textures`]) and each fits a texture; None elsewhere.
    pub fn new(
        ctx: &GpuContext,
        attn: &Attention,
        max_batch: u32,
        chunks: Chunks,
        caches: CacheTextures,
    ) -> Result<Option<AttnTextures>> {
        if !attn.reads_textures(ctx) {
            return Ok(None);
        }
        let probs = chunks.probs_bytes(attn.n_head, attn.n_ctx);
        let q_bytes = max_batch as u64 * attn.q_row_bytes();
        // Where one would pass the device's largest texture, the buffers serve.
        let biggest = attn.cache_bytes().max(probs).max(q_bytes);
        if !crate::gpu::upload::scratch_fits(ctx, biggest) {
            return Ok(None);
        }
        let (first, sets, kept) = match caches {
            CacheTextures::Shared => (0, 1, false),
            CacheTextures::Kept { first, n } => (first, n, true),
        };
        let caches = (first..first + sets)
            .map(|il| {
                Ok(CacheSet {
                    k: Tex::scratch(ctx, &format!("attn_k_tex.{il}"), attn.cache_bytes())?,
                    v: Tex::scratch(ctx, &format!("attn_v_tex.{il}"), attn.cache_bytes())?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Some(AttnTextures {
            q: Tex::scratch(ctx, "attn_q_tex", q_bytes)?,
            probs: Tex::scratch(ctx, "attn_probs_tex", probs)?,
            caches,
            first,
            kept,
        }))
    }

    /// Layer `il`'s view: its own caches' textures where kept, else the shared ones.
    pub fn layer(&self, il: usize) -> Option<LayerTextures<'_>> {
        let set = match self.kept {
            true => self.caches.get(il.checked_sub(self.first as usize)?)?,
            false => self.caches.first()?,
        };
        Some(LayerTextures {
            q: &self.q,
            probs: &self.probs,
            k: &set.k,
            v: &set.v,
            kept: self.kept,
            stored: false,
        })
    }
}

/// The textures one layer's attention reads ([`AttnTextures::layer`]).
#[derive(Clone, Copy)]
pub struct LayerTextures<'a> {
    pub(super) q: &'a Tex,
    pub(super) probs: &'a Tex,
    pub(super) k: &'a Tex,
    pub(super) v: &'a Tex,
    kept: bool,
    /// Whether the store kernel writes single tokens' keys and values into the kept
    /// textures itself ([`LayerTextures::stored_by_store`]).
    stored: bool,
}

impl<'a> LayerTextures<'a> {
    /// Whether the caches' textures are this layer's own, kept across steps: then every
    /// step must copy what it stores, whichever kernels read this step.
    pub(super) fn kept(&self) -> bool {
        self.kept
    }

    /// The kept textures' views, for the kernel that appends a single token's key and
    /// value to write them into (`kv_store::CacheAppend`); None where the textures are
    /// shared.
    pub fn cache_views(&self) -> Option<crate::ops::kv_store::CacheViews<'a>> {
        self.kept.then_some(crate::ops::kv_store::CacheViews {
            k: &self.k.1,
            v: &self.v.1,
        })
    }

    /// These textures, the store kernel having written single tokens into them
    /// ([`LayerTextures::cache_views`]): single-token steps then copy nothing.
    pub fn stored_by_store(self) -> Self {
        LayerTextures {
            stored: self.kept,
            ..self
        }
    }

    /// The copies that bring a step's keys and values into the caches' textures from
    /// their buffers: where kept, the positions the step stored; where shared, all the
    /// step reads, from the block of eight positions that holds the first key its first
    /// token sees (the kernels read none before it).
    pub(super) fn cache_copies(
        &self,
        attn: &Attention,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
    ) -> Vec<TextureCopy> {
        let (kept, window, stored) = (self.kept, attn.window, self.stored);
        // Where the store kernel wrote a single token, nothing is left to copy.
        let none = move |s: &StepInfo| stored && s.n_tokens == 1;
        let end = move |s: &StepInfo| if none(s) { s.pos } else { s.n_kv };
        let first8 = move |s: &StepInfo| match kept {
            true => s.pos / 8,
            false => window_start(window, s.pos) / 8,
        };
        let k_row = attn.k_row_bytes();
        let k = match kept {
            // Whole texels: a key row is a multiple of 16 bytes (`reads_textures`).
            true => self.k.copy_range(k_cache, move |s| {
                s.pos as u64 * k_row..end(s) as u64 * k_row
            }),
            false => self.k.copy_range(k_cache, move |s| {
                first8(s) as u64 * 8 * k_row..s.n_kv as u64 * k_row
            }),
        };
        // V's blocks of eight positions (shaders/common/v_layout.wgsl), a key row's
        // bytes per position: the blocks that hold the positions copied.
        let block = 8 * k_row;
        let v = self.v.copy_range(v_cache, move |s| match none(s) {
            true => 0..0,
            false => first8(s) as u64 * block..s.n_kv.div_ceil(8) as u64 * block,
        });
        vec![k, v]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm2(n_ctx: u32) -> Attention {
        Attention {
            head_dim: 64,
            n_head: 9,
            n_head_kv: 3,
            n_ctx,
            window: 0,
            scale: 0.125,
        }
    }

    #[test]
    fn contexts_keep_a_set_per_layer_within_the_budget() {
        let kept = CacheTextures::Kept { first: 2, n: 28 };
        assert_eq!(CacheTextures::for_layers(&smollm2(4096), 2..30), kept);
        assert_eq!(CacheTextures::for_layers(&smollm2(256), 2..30), kept);
        // 30 layers at 128k positions: 2 x 30 x 48 MiB, past the budget.
        let long = smollm2(1 << 17);
        assert_eq!(
            CacheTextures::for_layers(&long, 0..30),
            CacheTextures::Shared
        );
    }
}
