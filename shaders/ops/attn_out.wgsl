// Attention output: o[d, h, t] = sum_j probs[j, t, h] * v[d, h / group, j], one invocation
// per (d, token, head), for the chunk of tokens t0 .. t0 + tn. Keys after the query's
// position have probability 0 and are skipped.
//
// probs: [n_kv, tn, n_head] (row t - t0); v_cache: [stride, head_dim * n_head_kv] f16, two
// halves per u32 (transposed, stride = n_ctx rounded up to even, as kv_store writes it)
// out: [head_dim, n_head, n_tokens] f32

struct Params {
    head_dim: u32,
    n_head: u32,
    n_head_kv: u32,
    stride: u32,
    t0: u32,
    tn: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> probs: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let d = gid.x;
    let t = p.t0 + gid.y;
    let h = gid.z;
    if (d >= p.head_dim || t >= step.n_tokens) {
        return;
    }
    let hkv = h / (p.n_head / p.n_head_kv);
    let pb = (h * p.tn + gid.y) * step.n_kv;
    let vb = (hkv * p.head_dim + d) * p.stride / 2u;
    let n = min(step.pos + t + 1u, step.n_kv);
    var s = 0.0;
    for (var j = 0u; j + 1u < n; j += 2u) {
        let v2 = unpack2x16float(v_cache[vb + j / 2u]);
        s += probs[pb + j] * v2.x + probs[pb + j + 1u] * v2.y;
    }
    if ((n & 1u) != 0u) {
        s += probs[pb + n - 1u] * unpack2x16float(v_cache[vb + (n - 1u) / 2u]).x;
    }
    out[(t * p.n_head + h) * p.head_dim + d] = s;
}
