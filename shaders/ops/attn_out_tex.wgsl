// `attn_out` for batches whose probabilities and V cache were copied into textures
// (`ops::attention::AttnTextures`): o[d, h, t] = sum_j probs[j, t, h] * v[d, h / group, j]
// over the same tiles of 4 dimensions x TT tokens, eight keys at a time, so that each
// load is one whole texel (on CPU-hosted drivers one SIMD gather, where a storage load
// is a loop over the lanes and their words).
//
// probs_tex: the probabilities [probs_stride(), tn, n_head] f32, one vec4 per texel;
// v_tex: the transposed V cache [stride, head_dim * n_head_kv] f16, eight positions per
// texel (stride is a multiple of 8); both in their buffers' byte order, row-major
// through texels TEX_W wide. out: [head_dim, n_head, n_tokens] f32.

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
@group(0) @binding(2) var probs_tex: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(3) var v_tex: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;

override WG: u32 = 64u;
// TT, the tokens per tile, comes before this file (gpu::shaders).

// log2 of TEX_W (`gpu::upload::TEX_SHIFT`).
const PV_TEX_SHIFT: u32 = 12u;

fn pv_texel(t: texture_storage_2d<rgba32uint, read>, i: u32) -> vec4<u32> {
    return textureLoad(t, vec2<u32>(i & ((1u << PV_TEX_SHIFT) - 1u), i >> PV_TEX_SHIFT));
}

// Eight positions of one value row (texel i): the first four and the last four.
fn v8(i: u32) -> array<vec4<f32>, 2> {
    let w = pv_texel(v_tex, i);
    return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    // As attn_out.wgsl: x runs over (4 dimensions, TT tokens) tiles, dimensions first.
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
    // Texel of (dimension d0, positions 0 .. 7) and the distance between dimensions.
    let vs = p.stride / 8u;
    let vb = (hkv * p.head_dim + d0) * vs;
    // Whole vec4s of keys up to the tile's last token's position.
    let n = (min(step.pos + min(p.t0 + r0 + TT, t_end), step.n_kv) + 3u) / 4u;
    var acc: array<vec4<f32>, TT>;
    for (var m = 0u; 2u * m < n; m++) {
        let w0 = v8(vb + m);
        let w1 = v8(vb + vs + m);
        let w2 = v8(vb + 2u * vs + m);
        let w3 = v8(vb + 3u * vs + m);
        // One column per dimension, as attn_v.wgsl's `v_block`.
        let lo = mat4x4<f32>(w0[0], w1[0], w2[0], w3[0]);
        let hi = mat4x4<f32>(w0[1], w1[1], w2[1], w3[1]);
        // Past the row's last vec4 of keys lies the next row: its weight is zero.
        let has_hi = 2u * m + 1u < n;
        for (var k = 0u; k < TT; k++) {
            let pl = bitcast<vec4<f32>>(pv_texel(probs_tex, pb[k] + 2u * m));
            let ph = bitcast<vec4<f32>>(pv_texel(probs_tex, pb[k] + 2u * m + 1u));
            acc[k] += pl * lo + select(vec4<f32>(), ph, has_hi) * hi;
        }
    }
    for (var k = 0u; k < TT; k++) {
        let t = p.t0 + r0 + k;
        if (t < t_end) {
            out[((t * p.n_head + h) * p.head_dim + d0) / 4u] = acc[k];
        }
    }
}
