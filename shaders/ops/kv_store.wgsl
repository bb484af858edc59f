// Append this batch's keys and values to the layer's KV cache.
// The V cache is stored transposed so that attention's weighted sum walks each value
// row contiguously.
//
// k_new, v_new: [kv_dim, n_tokens] f32 (kv_dim = head_dim * n_head_kv)
// k_cache: [kv_dim, n_ctx] f32; v_cache: [n_ctx, kv_dim] f32 (transposed)

struct Params {
    kv_dim: u32,
    n_ctx: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> k_new: array<f32>;
@group(0) @binding(3) var<storage, read> v_new: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.kv_dim || t >= step.n_tokens) {
        return;
    }
    let pos = step.pos + t;
    k_cache[pos * p.kv_dim + i] = k_new[t * p.kv_dim + i];
    v_cache[i * p.n_ctx + pos] = v_new[t * p.kv_dim + i];
}
