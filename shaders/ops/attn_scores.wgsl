// Attention scores: s[j, t, h] = scale * q[:, h, t] . k[:, h / group, j], with the causal
// mask (key position after the query's) and the sliding window (query minus key
// position >= window) set to -inf, for the tokens t0 .. t0 + tn of the batch (a chunk: a
// batch's scores need not fit at once).
//
// One invocation per tile of TK keys x TT tokens of one head: each q and k load serves
// the whole tile (CPU-hosted drivers pay per load, per lane). A tile whose keys all lie
// after its tokens' positions or before their sliding windows writes nothing: the
// softmax reads only the keys a token sees and writes zeros over the rest of its row.
// TT is 1 for single-token steps (a tile of several tokens would be wasted there) and 8
// for batches.
//
// Q and K come through `q4`/`q8` and `k4`/`k8` (common/attn_qk_buffer.wgsl, or
// common/attn_qk_texture.wgsl for the batch build that reads them from textures),
// eight dimensions at a time and four for a head size that is an odd multiple of 4.
// q: [head_dim, n_head, n_tokens]; k_cache: [head_dim, n_head_kv, n_ctx] f16
// scores: [probs_stride(), tn, n_head] f32, row t - t0; of the vec4s that hold a key a
// token sees, the entries it does not see hold the mask; the rest of the row is left to
// the softmax

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
@group(0) @binding(4) var<storage, read_write> scores: array<vec4<f32>>;

override WG: u32 = 64u;
// Keys per tile, one vec4 of a row of scores; TT, the tokens per tile, comes before
// this file (gpu::shaders).
const TK: u32 = 4u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j0 = gid.x * TK;
    let r0 = gid.y * TT; // first row of the tile within the chunk
    let h = gid.z;
    let t_end = min(step.n_tokens, p.t0 + p.tn); // the chunk's end in this batch
    if (j0 >= step.n_kv || p.t0 + r0 >= t_end) {
        return;
    }
    // Keys after the tile's last token, or before the sliding window of its first (whose
    // window starts earliest), are masked for all of its tokens, and lie outside the
    // vec4s the softmax reads for any of them (it writes their zeros): nothing to do.
    let last_pos = step.pos + min(p.t0 + r0 + TT, t_end) - 1u;
    if (j0 > last_pos || j0 + TK <= window_start(step.pos + p.t0 + r0)) {
        return;
    }
    let hkv = h / (p.n_head / p.n_head_kv);
    let d4 = p.head_dim / 4u;
    // Rows and keys past the ends read the last valid one and are not written.
    var qb: array<u32, TT>;
    for (var k = 0u; k < TT; k++) {
        qb[k] = (min(p.t0 + r0 + k, t_end - 1u) * p.n_head + h) * d4;
    }
    var kb: array<u32, TK>;
    for (var k = 0u; k < TK; k++) {
        kb[k] = (min(j0 + k, step.n_kv - 1u) * p.n_head_kv + hkv) * d4;
    }
    // acc[row]: the row's dot products with the tile's four keys, one per component,
    // so that each row's scores leave as one vec4 store (a storage store is a loop
    // over the lanes on CPU-hosted drivers).
    var acc: array<vec4<f32>, TT>;
    for (var i = 0u; i + 1u < d4; i += 2u) {
        let k0 = k8(kb[0] + i);
        let k1 = k8(kb[1] + i);
        let k2 = k8(kb[2] + i);
        let k3 = k8(kb[3] + i);
        for (var k = 0u; k < TT; k++) {
            let q = q8(qb[k] + i);
            acc[k] += vec4<f32>(
                dot(q[0], k0[0]) + dot(q[1], k0[1]),
                dot(q[0], k1[0]) + dot(q[1], k1[1]),
                dot(q[0], k2[0]) + dot(q[1], k2[1]),
                dot(q[0], k3[0]) + dot(q[1], k3[1]),
            );
        }
    }
    if ((d4 & 1u) != 0u) {
        let i = d4 - 1u;
        let kf = mat4x4<f32>(k4(kb[0] + i), k4(kb[1] + i), k4(kb[2] + i), k4(kb[3] + i));
        for (var k = 0u; k < TT; k++) {
            acc[k] += q4(qb[k] + i) * kf;
        }
    }
    // The tile's keys are a whole vec4 of the row (j0 is a multiple of 4, and the row's
    // stride of 8 covers n_kv).
    let stride = probs_stride();
    let j = vec4<u32>(j0, j0 + 1u, j0 + 2u, j0 + 3u);
    for (var k = 0u; k < TT; k++) {
        let t = p.t0 + r0 + k;
        if (t < t_end) {
            let qpos = step.pos + t;
            let row = (h * p.tn + r0 + k) * stride;
            let m = vec4<bool>(masked(j.x, qpos), masked(j.y, qpos), masked(j.z, qpos), masked(j.w, qpos));
            scores[(row + j0) / 4u] = select(acc[k] * p.scale, vec4<f32>(-1.0e30), m);
        }
    }
}
