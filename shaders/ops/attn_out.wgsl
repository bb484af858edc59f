// Attention output: o[d, h, t] = sum_j probs[j, t, h] * v[d, h / group, j] for the chunk
// of tokens t0 .. t0 + tn. Keys after a query's position have probability 0; a tile
// stops at its last token's position, rounded up to a whole vec4 of keys (the
// probabilities past n_kv are 0 too).
//
// One invocation per tile of 4 dimensions x TT tokens of one head, eight keys at a
// time: each pair of vec4s of probabilities serves 4 dimensions and each eight
// positions of V TT tokens (CPU-hosted drivers pay per load, per lane). TT is 1 for
// single-token steps and 8 for batches.
//
// The probabilities and V come through `p4` and `v8` (common/attn_pv_buffer.wgsl, or
// common/attn_pv_texture.wgsl for the batch build that reads them from textures).
// probs: [probs_stride(), tn, n_head] (row t - t0); v_cache: f16 in blocks of eight
// positions (common/v_layout.wgsl), n_ctx rounded up to 128 (`kv_store::cache_positions`);
// out: [head_dim, n_head, n_tokens] f32 (as vec4s; head_dim is a multiple of 4)

struct Params {
    head_dim: u32,
    n_head: u32,
    n_head_kv: u32,
    _pad0: u32,
    t0: u32,
    tn: u32,
    window: u32, // as `attn_scores`' (0: no sliding window)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
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
    let n4 = probs_stride() / 4u;
    var pb: array<u32, TT>;
    for (var k = 0u; k < TT; k++) {
        pb[k] = (h * p.tn + min(r0 + k, t_end - 1u - p.t0)) * n4;
    }
    // The value row of dimension d0 (the next three follow it).
    let vr = hkv * p.head_dim + d0;
    // Whole vec4s of keys up to the tile's last token's position.
    let n = (min(step.pos + min(p.t0 + r0 + TT, t_end), step.n_kv) + 3u) / 4u;
    var acc: array<vec4<f32>, TT>;
    // From the block of eight keys that holds the first one the tile's first token sees
    // (common/attn_mask.wgsl): a sliding window's earlier keys weigh 0 for all its tokens.
    for (var m = window_start(step.pos + p.t0 + r0) / 8u; 2u * m < n; m++) {
        let w0 = v8(vr, m);
        let w1 = v8(vr + 1u, m);
        let w2 = v8(vr + 2u, m);
        let w3 = v8(vr + 3u, m);
        // One column per dimension, so that probabilities times it weigh all four.
        let lo = mat4x4<f32>(w0[0], w1[0], w2[0], w3[0]);
        let hi = mat4x4<f32>(w0[1], w1[1], w2[1], w3[1]);
        // Past the row's last vec4 of keys lies the next row: its weight is zero.
        let has_hi = 2u * m + 1u < n;
        for (var k = 0u; k < TT; k++) {
            let ph = select(vec4<f32>(), p4(pb[k] + 2u * m + 1u), has_hi);
            acc[k] += p4(pb[k] + 2u * m) * lo + ph * hi;
        }
    }
    for (var k = 0u; k < TT; k++) {
        let t = p.t0 + r0 + k;
        if (t < t_end) {
            out[((t * p.n_head + h) * p.head_dim + d0) / 4u] = acc[k];
        }
    }
}
