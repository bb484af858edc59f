// The parameters of RoPE with the KV cache append (Rust `kv_store::RopeStoreParams`):
// `p` of ops/rope_store.wgsl and ops/rope_store_norm.wgsl (common/rope_store_io.wgsl),
// `rp` of the end of `mul_mat_ks1nr` (common/ks1_rope.wgsl).

struct RopeStoreParams {
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
    _pad1: u32,
    eps: f32,     // the heads' norms' epsilon (rope_store_norm, mul_mat_ks1nr)
    v_apart: u32, // 1: V is a product of its own (mul_mat_ks1nr only)
}
