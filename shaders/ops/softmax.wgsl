// Row-wise softmax in place over the attention scores, one workgroup per (token, head) row
// of a chunk of tokens t0 .. t0 + tn. Masked entries hold -1e30 and come out as 0; rows
// are whole vec4s (probs_stride), read and written as such. Only the vec4s that hold a
// key the query sees (common/attn_mask.wgsl: from `window` behind its position up to
// it) are read; the rest of the row is written as zeros. In a causal prompt that is
// half the row on average, and a sliding window's rows hold `window` keys.
//
// scores: [probs_stride(), tn, n_head] f32

struct Params {
    n_head: u32,
    t0: u32,
    tn: u32,
    // As `attn_scores`' (0: no sliding window).
    window: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> scores: array<vec4<f32>>;

// Lanes per workgroup (`ops::reduce_pipeline`): up to REDUCE_MAX_WG, or one subgroup
// with common/reduce_sg.wgsl.
override WG: u32 = 64u;
var<workgroup> partial: array<f32, REDUCE_MAX_WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.x;
    let h = wid.y;
    if (p.t0 + t >= step.n_tokens || h >= p.n_head) {
        return;
    }
    let n = probs_stride() / 4u;
    let base = (h * p.tn + t) * n;
    // The vec4s [a, b) hold every key the query at qpos sees.
    let qpos = step.pos + p.t0 + t;
    let windowed = p.window > 0u && qpos + 1u > p.window;
    let a = select(0u, qpos + 1u - p.window, windowed) / 4u;
    let b = min(qpos / 4u + 1u, n);
    for (var j = li; j < a; j += WG) {
        scores[base + j] = vec4<f32>();
    }
    for (var j = b + li; j < n; j += WG) {
        scores[base + j] = vec4<f32>();
    }
    var m4 = vec4<f32>(-3.0e38);
    for (var j = a + li; j < b; j += WG) {
        m4 = max(m4, scores[base + j]);
    }
    let m = workgroup_max(li, max(max(m4.x, m4.y), max(m4.z, m4.w)));
    var s4 = vec4<f32>();
    for (var j = a + li; j < b; j += WG) {
        let e = exp(scores[base + j] - m);
        scores[base + j] = e;
        s4 += e;
    }
    let s = workgroup_sum(li, s4.x + s4.y + s4.z + s4.w);
    let inv = 1.0 / s;
    for (var j = a + li; j < b; j += WG) {
        scores[base + j] *= inv;
    }
}
