// Append this batch's keys and values to the layer's KV cache, stored as f16 pairs
// packed in u32 (half the memory and bandwidth of f32, as llama.cpp's default cache;
// packing needs no f16 shader support). The V cache holds each value row's positions
// eight to a texel, in blocks of eight positions (common/v_layout.wgsl), so that
// attention's weighted sum reads eight positions of a row at once.
//
// k_new, v_new: [kv_dim, n_tokens] f32 (kv_dim = head_dim * n_head_kv, even)
// k_cache: [kv_dim, n_ctx] f16; v_cache: f16 in blocks of eight positions, two halves
// per u32, the lower index in the low half.
//
// One invocation per (i, u): u < n_tokens with i even stores keys i, i + 1 of token u;
// every i stores the V pair of positions 2 (pos / 2 + u), + 1 when it is touched by
// this batch, keeping a half from an earlier step where the pair straddles batches.

struct Params {
    kv_dim: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> k_new: array<f32>;
@group(0) @binding(3) var<storage, read> v_new: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let u = gid.y;
    if (i >= p.kv_dim) {
        return;
    }
    if (u < step.n_tokens && (i & 1u) == 0u) {
        let src = u * p.kv_dim + i;
        let k2 = vec2<f32>(k_new[src], k_new[src + 1u]);
        k_cache[((step.pos + u) * p.kv_dim + i) / 2u] = pack2x16float(k2);
    }
    store_v(i, u, p.kv_dim);
}
