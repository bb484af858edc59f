// A layer's RoPE and its append to the KV cache in one dispatch (`rope` and `kv_store`
// in two): Q is rotated in place, K is rotated on its way into the cache (each
// invocation reads the unrotated pair partners it needs, so no invocation waits for
// another), and V is stored as `kv_store` stores it.
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
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_new: array<f32>;
@group(0) @binding(4) var<storage, read> v_new: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<u32>;

override WG: u32 = 64u;

// Element d (of a head starting at `base` in k_new) after the rotation at `pos`.
fn k_rotated(base: u32, d: u32, pos: u32) -> f32 {
    if (d >= p.n_rot) {
        return k_new[base + d];
    }
    let half_rot = p.n_rot / 2u;
    let i = select(d / 2u, d % half_rot, p.mode == 2u);
    let ab = rope_pair(i, p.n_rot, p.mode);
    let cs = rope_cs(pos, i, p.n_rot, p.freq_base, p.freq_scale);
    let x0 = k_new[base + ab.x];
    let x1 = k_new[base + ab.y];
    return select(x0 * cs.y + x1 * cs.x, x0 * cs.x - x1 * cs.y, d == ab.x);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    // Invocation g rotates Q's pair g and stores K/V value g, where they exist: one
    // range for both, as CPU-hosted drivers run both sides of every branch.
    let g = gid.x;
    let t = gid.y;
    let half_rot = p.n_rot / 2u;
    if (g < half_rot * p.n_heads && t < step.n_tokens) {
        let i = g % half_rot;
        let cs = rope_cs(step.pos + t, i, p.n_rot, p.freq_base, p.freq_scale);
        let ab = (t * p.n_heads + g / half_rot) * p.head_dim + rope_pair(i, p.n_rot, p.mode);
        let x0 = q[ab.x];
        let x1 = q[ab.y];
        q[ab.x] = x0 * cs.x - x1 * cs.y;
        q[ab.y] = x0 * cs.y + x1 * cs.x;
    }
    if (g >= p.kv_dim) {
        return;
    }
    if (t < step.n_tokens && (g & 1u) == 0u) {
        let d = g % p.head_dim;
        let base = t * p.kv_dim + g - d;
        let pos = step.pos + t;
        let k2 = vec2<f32>(k_rotated(base, d, pos), k_rotated(base, d + 1u, pos));
        k_cache[(pos * p.kv_dim + g) / 2u] = pack2x16float(k2);
    }
    store_v(g, t, p.kv_dim, p.stride);
}
