//! Appending a batch's keys and values to the KV cache (`shaders/ops/kv_store.wgsl`),
//! or that with the layer's RoPE in the same dispatch (`shaders/ops/rope_store.wgsl`).
//!
//! The cache holds f16 values, two per u32: half the memory of f32 and what llama.cpp
//! keeps by default, read back to f32 inside the attention kernels.

use super::rope::Rope;
use super::{
    dispatch, dispatch_bound, groups, op_pipeline, op_pipeline_with_region, Dispatch, StepInfo, WG,
};
use crate::gpu::upload::{is_vector_uniform, VECTOR_UNIFORM_BYTES};
use crate::gpu::GpuContext;
use crate::{Error, Result};

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub kv_dim: u32,
    pub _pad: [u32; 3],
}

/// Positions the caches hold room for: the context rounded up to 128, at least the
/// whole blocks of eight positions the V cache is laid out in
/// (shaders/common/v_layout.wgsl), which attention reads a texel at a time.
pub fn cache_positions(n_ctx: u32) -> u32 {
    n_ctx.next_multiple_of(128)
}

/// Bytes of one layer's K (or V) cache for `n_ctx` positions of `kv_dim` values.
pub fn cache_bytes(kv_dim: u32, n_ctx: u32) -> u64 {
    kv_dim as u64 * cache_positions(n_ctx) as u64 * 2
}

/// k_new, v_new: [kv_dim, n_tokens] f32; k_cache: [kv_dim, n_ctx] f16; v_cache: f16 in
/// blocks of eight positions, each block's texels value row by value row
/// (shaders/common/v_layout.wgsl; both packed in pairs, see [`pack_caches`]).
#[allow(clippy::too_many_arguments)]
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    k_new: &wgpu::Buffer,
    v_new: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    kv_dim: u32,
    n_ctx: u32,
) -> Result<Dispatch> {
    check_caches([k_cache, v_cache], kv_dim, n_ctx)?;
    let pipe = op_pipeline(ctx, "kv_store")?;
    let p = Params {
        kv_dim,
        _pad: [0; 3],
    };
    // y covers the batch's tokens (keys) and the V pairs it touches (at most as many).
    dispatch(
        ctx,
        "kv_store",
        pipe,
        step,
        &p,
        &[k_new, v_new, k_cache, v_cache],
        move |s| [groups(kv_dim, WG), s.n_tokens, 1],
    )
}

/// Whether the caches pack pairs of `kv_dim` values and hold `n_ctx` positions: the
/// kernels write where the step's positions say, which the host keeps below `n_ctx`.
fn check_caches(caches: [&wgpu::Buffer; 2], kv_dim: u32, n_ctx: u32) -> Result<()> {
    if kv_dim % 2 != 0 {
        return Err(Error::model(format!(
            "KV cache: {kv_dim} values per position (the f16 cache packs pairs; need an even count)"
        )));
    }
    let need = cache_bytes(kv_dim, n_ctx);
    if let Some(c) = caches.iter().find(|c| c.size() < need) {
        return Err(Error::gpu(format!(
            "KV cache: a buffer of {} bytes for {n_ctx} positions of {kv_dim} values ({need} bytes)",
            c.size()
        )));
    }
    Ok(())
}

/// Parameters of `rope_store`, `rope_store_norm` and the RoPE at the end of
/// `mul_mat_ks1nr` (common/ks1_rope.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RopeStoreParams {
    /// Q's rotation, as `rope` takes it (its second tensor's heads unused).
    rope: super::rope::Params,
    kv_dim: u32,
    _pad: u32,
    /// The epsilon of the heads' norms (`rope_store_norm` and `mul_mat_ks1nr`).
    eps: f32,
    /// 1 where V is a product of its own, whose output `mul_mat_ks1nr` appends (unread
    /// by the `rope_store` kernels).
    v_apart: u32,
}

/// Where and how a layer's keys and values join its cache after their product: RoPE
/// (after the heads' norms, given `norms`) and the layer's caches, with its kept
/// textures where the attention reads those. [`gpu_with_rope`] runs it as a dispatch;
/// `ops::mul_mat::gpu_qkv_rope` at the end of the Q/K/V product.
#[derive(Clone, Copy)]
pub struct CacheAppend<'a> {
    pub rope: &'a Rope,
    /// K and V caches ([`gpu`]'s layouts).
    pub caches: [&'a wgpu::Buffer; 2],
    /// Values per position (kv_dim) and the positions the caches hold (n_ctx).
    pub dims: (u32, u32),
    pub norms: Option<QkNorms<'a>>,
    pub tex: Option<CacheViews<'a>>,
}

impl CacheAppend<'_> {
    /// Whether the caches hold whole heads of even length, and `norms`, where given,
    /// can be bound on `ctx`.
    pub(crate) fn check(&self, ctx: &GpuContext) -> Result<()> {
        let (kv_dim, hd) = (self.dims.0, self.rope.head_dim);
        check_caches(self.caches, kv_dim, self.dims.1)?;
        if kv_dim % hd.max(1) != 0 || hd % 2 != 0 {
            return Err(Error::model(format!(
                "KV cache: {kv_dim} values per position are not whole heads of {hd}"
            )));
        }
        let Some(norms) = self.norms else {
            return Ok(());
        };
        if !qk_norms_available(ctx, hd) {
            return Err(Error::Unsupported(format!(
                "Q/K norms folded into RoPE on {} (heads of {hd})",
                ctx.info.name
            )));
        }
        for (what, w) in [("Q", norms.q), ("K", norms.k)] {
            if !is_vector_uniform(w) {
                return Err(Error::gpu(format!(
                    "the {what} norm's weight must be a uniform buffer of at least {VECTOR_UNIFORM_BYTES} bytes (gpu::upload::vector_init), got {} bytes",
                    w.size()
                )));
            }
        }
        Ok(())
    }

    /// The kernels' parameters; `v_apart` as [`RopeStoreParams::v_apart`].
    pub(crate) fn params(&self, v_apart: bool) -> RopeStoreParams {
        RopeStoreParams {
            rope: self.rope.params(),
            kv_dim: self.dims.0,
            _pad: 0,
            eps: self.norms.map_or(0.0, |n| n.eps),
            v_apart: v_apart as u32,
        }
    }
}

/// Storage buffers `rope_store` binds.
const ROPE_STORE_BUFFERS: u32 = 5;

/// Whether `ctx` runs [`gpu_with_rope`]; devices that bind fewer storage buffers per
/// stage run `rope` and [`gpu`] apart.
pub fn rope_store_available(ctx: &GpuContext) -> bool {
    ctx.limits.max_storage_buffers_per_shader_stage >= ROPE_STORE_BUFFERS
}

/// The per-head RMS norms of Q and K that [`gpu_with_rope`] may run first (Gemma 3's
/// q_norm and k_norm): their weights, [head_dim] f32 each in a uniform-capable buffer
/// of [`VECTOR_UNIFORM_BYTES`] (`gpu::upload::vector_init`).
#[derive(Clone, Copy)]
pub struct QkNorms<'a> {
    pub q: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
    pub eps: f32,
}

/// Whether `ctx` runs [`gpu_with_rope`] with [`QkNorms`] of heads of `head_dim`.
pub fn qk_norms_available(ctx: &GpuContext, head_dim: u32) -> bool {
    rope_store_available(ctx)
        && ctx.limits.max_uniform_buffers_per_shader_stage >= 4
        && ctx.limits.max_uniform_buffer_binding_size >= VECTOR_UNIFORM_BYTES
        && head_dim as u64 * 4 <= VECTOR_UNIFORM_BYTES
}

/// `rope` on q (`rope`'s heads, in place) and on k, with k and v appended to the
/// caches as [`gpu`] appends them, in one dispatch (`append`). k_new is left unrotated:
/// the rotated keys go to the cache only. With norms, each head of q and k is
/// normalised first (`rms_norm` over the head, times its weight): q in place, k on its
/// way into the cache. With `batches_only`, steps of one token run nothing (the layer's
/// Q/K/V product did it: `ops::mul_mat::gpu_qkv_rope`).
pub fn gpu_with_rope(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    q: &wgpu::Buffer,
    [k_new, v_new]: [&wgpu::Buffer; 2],
    append: &CacheAppend<'_>,
    batches_only: bool,
) -> Result<Dispatch> {
    append.check(ctx)?;
    let (rope, [k_cache, v_cache], tex) = (append.rope, append.caches, append.tex);
    let kv_dim = append.dims.0;
    let p = append.params(false);
    let tokens = move |s: &StepInfo| match batches_only && s.n_tokens == 1 {
        true => 0,
        false => s.n_tokens,
    };
    let bufs = [q, k_new, v_new, k_cache, v_cache];
    let region = ("tex", tex.is_some());
    let Some(norms) = append.norms else {
        let n = (rope.n_rot / 2 * rope.n_heads).max(kv_dim);
        let pipe = op_pipeline_with_region(ctx, "rope_store", region)?;
        let resources = bindings(&bufs, tex);
        return dispatch_bound(ctx, "rope_store", pipe, step, &p, resources, move |s| {
            [groups(n, WG), tokens(s), 1]
        });
    };
    // One workgroup per head of Q and of K.
    let heads = rope.n_heads + kv_dim / rope.head_dim;
    let pipe =
        super::reduce_pipeline_with(ctx, "rope_store_norm", &[], rope.head_dim, Some(region))?;
    let bufs = [q, k_new, v_new, k_cache, v_cache, norms.q, norms.k];
    let resources = bindings(&bufs, tex);
    dispatch_bound(
        ctx,
        "rope_store_norm",
        pipe,
        step,
        &p,
        resources,
        move |s| [heads, tokens(s), 1],
    )
}

/// A layer's kept K and V cache textures, which [`gpu_with_rope`] writes a single
/// token's key and value into as well as its buffers (`ops::attention::LayerTextures`):
/// the step then copies nothing into them.
#[derive(Clone, Copy)]
pub struct CacheViews<'a> {
    pub k: &'a wgpu::TextureView,
    pub v: &'a wgpu::TextureView,
}

/// `buffers` from binding 2 on, then the textures' views where given.
fn bindings<'a>(
    buffers: &[&'a wgpu::Buffer],
    tex: Option<CacheViews<'a>>,
) -> Vec<wgpu::BindingResource<'a>> {
    let mut r: Vec<_> = buffers.iter().map(|b| b.as_entire_binding()).collect();
    if let Some(t) = tex {
        r.push(wgpu::BindingResource::TextureView(t.k));
        r.push(wgpu::BindingResource::TextureView(t.v));
    }
    r
}

/// The GPU layouts of caches holding positions 0..n: k and v are [kv_dim, n] f32;
/// returns (K, V) as packed f16 words, sized for `n_ctx` positions (tests, tools).
pub fn pack_caches(k: &[f32], v: &[f32], kv_dim: usize, n_ctx: u32) -> (Vec<u32>, Vec<u32>) {
    let words = (cache_bytes(kv_dim as u32, n_ctx) / 4) as usize;
    let mut kh = vec![0u16; words * 2];
    let mut vh = vec![0u16; words * 2];
    for (j, kv) in k.chunks_exact(kv_dim).enumerate() {
        for (i, &x) in kv.iter().enumerate() {
            kh[j * kv_dim + i] = half::f16::from_f32(x).to_bits();
        }
    }
    for (j, vv) in v.chunks_exact(kv_dim).enumerate() {
        for (i, &x) in vv.iter().enumerate() {
            // shaders/common/v_layout.wgsl: eight halves per (block, row) texel.
            vh[(j / 8 * kv_dim + i) * 8 + j % 8] = half::f16::from_f32(x).to_bits();
        }
    }
    let pack = |h: Vec<u16>| {
        h.chunks_exact(2)
            .map(|p| p[0] as u32 | (p[1] as u32) << 16)
            .collect()
    };
    (pack(kh), pack(vh))
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::wgsl_mirror;

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::Params, "ops/kv_store.wgsl", "Params", { kv_dim });
        let file = "common/rope_store_params.wgsl";
        wgsl_mirror!(super::RopeStoreParams, file, "RopeStoreParams", {
            head_dim: rope.head_dim,
            n_heads: rope.n_heads,
            n_rot: rope.n_rot,
            mode: rope.mode,
            freq_base: rope.freq_base,
            freq_scale: rope.freq_scale,
            kv_dim,
            eps,
            v_apart,
        });
    }
}
