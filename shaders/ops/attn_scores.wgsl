// Attention scores: s[j, t, h] = scale * q[:, h, t] . k[:, h / group, j], with the causal
// mask (key position after the query's) and the sliding window (query minus key
// position >= window) set to -inf. One invocation per (key j, token t, head h), for the
// tokens t0 .. t0 + tn of the batch (a chunk: a batch's scores need not fit at once).
//
// q: [head_dim, n_head, n_tokens]; k_cache: [head_dim, n_head_kv, n_ctx] f16, four
// halves per vec2<u32> (head_dim is a multiple of 4)
// scores: [n_kv, tn, n_head] f32 (row stride step.n_kv), row t - t0

struct Params {
    head_dim: u32,
    n_head: u32,
    n_head_kv: u32,
    window: u32, // 0: no sliding window
    scale: f32,
    t0: u32, // the chunk's first token
    tn: u32, // tokens per chunk
    _pad: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let t = p.t0 + gid.y;
    let h = gid.z;
    if (j >= step.n_kv || t >= step.n_tokens) {
        return;
    }
    let out = (h * p.tn + gid.y) * step.n_kv + j;
    let qpos = step.pos + t;
    if (j > qpos || (p.window > 0u && qpos - j >= p.window)) {
        scores[out] = -1.0e30;
        return;
    }
    let hkv = h / (p.n_head / p.n_head_kv);
    let d4 = p.head_dim / 4u;
    let qb = (t * p.n_head + h) * d4;
    let kb = (j * p.n_head_kv + hkv) * d4;
    var s = 0.0;
    for (var i = 0u; i < d4; i++) {
        let k4 = k_cache[kb + i];
        let kf = vec4<f32>(unpack2x16float(k4.x), unpack2x16float(k4.y));
        s += dot(q[qb + i], kf);
    }
    scores[out] = s * p.scale;
}
