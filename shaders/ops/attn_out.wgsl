// Attention output: o[d, h, t] = sum_j probs[j, t, h] * v[d, h / group, j] for the chunk
// of tokens t0 .. t0 + tn. Keys after a query's position have probability 0; a tile
// stops at its last token's position.
//
// One invocation per tile of 4 dimensions x TT tokens of one head, so each probability
// load serves 4 dimensions and each V load TT tokens (CPU-hosted drivers pay per load,
// per lane). TT is 1 for single-token steps and 4 for batches.
//
// probs: [n_kv, tn, n_head] (row t - t0); v_cache: [stride, head_dim * n_head_kv] f16, two
// halves per u32 (transposed, stride = n_ctx rounded up to even, as kv_store writes it)
// out: [head_dim, n_head, n_tokens] f32 (as vec4s; head_dim is a multiple of 4)

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
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;

override WG: u32 = 64u;
// TT, the tokens per tile, comes before this file (gpu::shaders).

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    // x runs over (4 dimensions, TT tokens) tiles, dimensions first, so a workgroup is
    // filled whatever the head size.
    let n_dg = p.head_dim / 4u;
    let d0 = (gid.x % n_dg) * 4u;
    let r0 = (gid.x / n_dg) * TT;
    let h = gid.z;
    let t_end = min(step.n_tokens, p.t0 + p.tn);
    if (p.t0 + r0 >= t_end) {
        return;
    }
    let hkv = h / (p.n_head / p.n_head_kv);
    var pb: array<u32, TT>;
    for (var k = 0u; k < TT; k++) {
        pb[k] = (h * p.tn + min(r0 + k, t_end - 1u - p.t0)) * step.n_kv;
    }
    // u32 index of (dimension d0 + i, key 0); the stride is even.
    let vb = (hkv * p.head_dim + d0) * (p.stride / 2u);
    let vs = p.stride / 2u;
    // Keys up to the tile's last token's position.
    let n = min(step.pos + min(p.t0 + r0 + TT, t_end), step.n_kv);
    var acc: array<vec4<f32>, TT>;
    for (var j = 0u; j + 1u < n; j += 2u) {
        let jw = j / 2u;
        let a = unpack2x16float(v_cache[vb + jw]);
        let b = unpack2x16float(v_cache[vb + vs + jw]);
        let c = unpack2x16float(v_cache[vb + 2u * vs + jw]);
        let e = unpack2x16float(v_cache[vb + 3u * vs + jw]);
        let v0 = vec4<f32>(a.x, b.x, c.x, e.x);
        let v1 = vec4<f32>(a.y, b.y, c.y, e.y);
        for (var k = 0u; k < TT; k++) {
            acc[k] += probs[pb[k] + j] * v0 + probs[pb[k] + j + 1u] * v1;
        }
    }
    if ((n & 1u) != 0u) {
        let jw = (n - 1u) / 2u;
        let v0 = vec4<f32>(
            unpack2x16float(v_cache[vb + jw]).x,
            unpack2x16float(v_cache[vb + vs + jw]).x,
            unpack2x16float(v_cache[vb + 2u * vs + jw]).x,
            unpack2x16float(v_cache[vb + 3u * vs + jw]).x,
        );
        for (var k = 0u; k < TT; k++) {
            acc[k] += probs[pb[k] + n - 1u] * v0;
        }
    }
    for (var k = 0u; k < TT; k++) {
        let t = p.t0 + r0 + k;
        if (t < t_end) {
            out[((t * p.n_head + h) * p.head_dim + d0) / 4u] = acc[k];
        }
    }
}
