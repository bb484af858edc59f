// RMS normalisation of rows, times a weight: y = x / sqrt(mean(x^2) + eps) * w, or
// y += that with ACC (a post-norm into the residual stream).
// One workgroup per row; rows are `rows_per_token` per token (1 for the residual stream,
// n_head for per-head Q/K norms).
//
// x, y: [n, rows_per_token, n_tokens] f32; w: [n] f32

struct Params {
    n: u32,
    rows_per_token: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> wt: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// Lanes per workgroup: 64, or one subgroup with common/reduce_sg.wgsl.
override WG: u32 = 64u;
override ACC: bool = false;
var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.y * p.rows_per_token + wid.x;
    if (wid.y >= step.n_tokens) {
        return;
    }
    let base = row * p.n;
    var s = 0.0;
    for (var i = li; i < p.n; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    let total = workgroup_sum(li, s);
    let inv = inverseSqrt(total / f32(p.n) + p.eps);
    for (var i = li; i < p.n; i += WG) {
        let v = x[base + i] * inv * wt[i];
        if (ACC) {
            y[base + i] += v;
        } else {
            y[base + i] = v;
        }
    }
}
