// The parameters and buffers of both RoPE-and-append kernels (ops/rope_store.wgsl, and
// ops/rope_store_norm.wgsl with the heads' norms first): Rust `kv_store::RopeStoreParams`.
//
// q: [head_dim, n_heads, n_tokens] f32; k_new, v_new: [kv_dim, n_tokens] f32 (K left
// unrotated); k_cache, v_cache: as in kv_store.wgsl.

struct Params {
    // As rope.wgsl's (Rust `rope::Params`).
    head_dim: u32,
    n_heads: u32, // Q's heads
    n_rot: u32,
    mode: u32,
    freq_base: f32,
    freq_scale: f32,
    _heads2: u32, // unused here
    _pad0: u32,
    kv_dim: u32,
    stride: u32, // V row length in halves (even)
    eps: f32,    // the heads' norms' epsilon (rope_store_norm only)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_new: array<f32>;
@group(0) @binding(4) var<storage, read> v_new: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<u32>;
