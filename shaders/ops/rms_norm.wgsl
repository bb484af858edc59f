// RMS normalisation of rows, times a weight: y = x / sqrt(mean(x^2) + eps) * w, or
// y += that with ACC (a post-norm into the residual stream).
// One workgroup per row; rows are `rows_per_token` per token (1 for the residual stream,
// n_head for per-head Q/K norms).
//
// A lane takes elements li, li + WG, ... four to a trip, all four loaded before any is
// used: on a GPU a norm is a few chains of loads per lane, each waiting on memory, and
// four loads in flight wait once.
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

// Lanes per workgroup (`ops::reduce_pipeline`): up to REDUCE_MAX_WG, or one subgroup
// with common/reduce_sg.wgsl.
override WG: u32 = 64u;
override ACC: bool = false;
var<workgroup> partial: array<f32, REDUCE_MAX_WG>;

// The four indices of a trip from i.
fn trip(i: u32) -> vec4<u32> {
    return vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u) * WG;
}

// Row `base`'s elements at `idx` (0 past the row's end).
fn x4(base: u32, idx: vec4<u32>) -> vec4<f32> {
    let j = min(idx, vec4<u32>(p.n - 1u));
    let v = vec4<f32>(x[base + j.x], x[base + j.y], x[base + j.z], x[base + j.w]);
    return select(vec4<f32>(), v, idx < vec4<u32>(p.n));
}

fn w4(idx: vec4<u32>) -> vec4<f32> {
    let j = min(idx, vec4<u32>(p.n - 1u));
    return vec4<f32>(wt[j.x], wt[j.y], wt[j.z], wt[j.w]);
}

// Element i of row `base`, kept where it is in the row.
fn store(base: u32, i: u32, v: f32) {
    if (i < p.n) {
        if (ACC) {
            y[base + i] += v;
        } else {
            y[base + i] = v;
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.y * p.rows_per_token + wid.x;
    if (wid.y >= step.n_tokens) {
        return;
    }
    let base = row * p.n;
    var s = 0.0;
    for (var i = li; i < p.n; i += 4u * WG) {
        let v = x4(base, trip(i));
        s += dot(v, v);
    }
    let total = workgroup_sum(li, s);
    let inv = inverseSqrt(total / f32(p.n) + p.eps);
    for (var i = li; i < p.n; i += 4u * WG) {
        let idx = trip(i);
        let v = x4(base, idx) * inv * w4(idx);
        store(base, idx.x, v.x);
        store(base, idx.y, v.y);
        store(base, idx.z, v.z);
        store(base, idx.w, v.w);
    }
}
