// Row-wise softmax in place over the attention scores, one workgroup per (token, head) row
// of a chunk of tokens t0 .. t0 + tn. Masked entries hold -1e30 and come out as 0.
//
// scores: [n_kv, tn, n_head] f32

struct Params {
    n_head: u32,
    t0: u32,
    tn: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> scores: array<f32>;

const WG: u32 = 64u;
var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.x;
    let h = wid.y;
    if (p.t0 + t >= step.n_tokens || h >= p.n_head) {
        return;
    }
    let n = step.n_kv;
    let base = (h * p.tn + t) * n;
    var m = -3.0e38;
    for (var j = li; j < n; j += WG) {
        m = max(m, scores[base + j]);
    }
    m = workgroup_max(li, m);
    var s = 0.0;
    for (var j = li; j < n; j += WG) {
        let e = exp(scores[base + j] - m);
        scores[base + j] = e;
        s += e;
    }
    s = workgroup_sum(li, s);
    let inv = 1.0 / s;
    for (var j = li; j < n; j += WG) {
        scores[base + j] *= inv;
    }
}
