// The parameters and buffers of both RoPE-and-append kernels (ops/rope_store.wgsl, and
// ops/rope_store_norm.wgsl with the heads' norms first); the parameters:
// common/rope_store_params.wgsl.
//
// q: [head_dim, n_heads, n_tokens] f32; k_new, v_new: [kv_dim, n_tokens] f32 (K left
// unrotated); k_cache, v_cache: as in kv_store.wgsl.

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: RopeStoreParams;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_new: array<f32>;
@group(0) @binding(4) var<storage, read> v_new: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<u32>;
