// Greedy sampling on the device: workgroup g finds the largest of logits
// g * span .. (g + 1) * span and writes its key and index, so a step reads back a few
// words per workgroup instead of every logit. The host picks the best of those.
//
// The same order as the host's `sampling::argmax`: NaN counts as -inf, -0 equals +0,
// and ties go to the lowest index. Logits are compared as order-preserving u32 keys, so
// no device flushes denormals or reorders NaNs differently.
//
// logits: [n] f32; out: [groups] (key, index)

struct Params {
    n: u32,
    span: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<vec2<u32>>;

// A power of two (the tree below halves it).
override WG: u32 = 64u;

var<workgroup> best_key: array<u32, WG>;
var<workgroup> best_idx: array<u32, WG>;

// Larger floats give larger keys; NaN and -inf share the smallest key a logit can have,
// 0x007fffff, so the key 0 loses to every logit.
fn key(v: f32) -> u32 {
    var b = bitcast<u32>(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        b = 0xff800000u; // NaN: -inf
    }
    if (b == 0x80000000u) {
        b = 0u; // -0: +0
    }
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// Whether (ka, ia) comes before (kb, ib): the larger key, then the lower index.
fn better(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    // (Every kernel binds the step; one without tokens has no logits to sample.)
    if (step.n_tokens == 0u) {
        return;
    }
    let start = wid.x * p.span;
    let end = min(start + p.span, p.n);
    var bk = 0u;
    var bi = 0xffffffffu;
    // Each lane's indices increase, so a strictly larger key keeps the first of ties.
    for (var i = start + l; i < end; i += WG) {
        let k = key(logits[i]);
        if (k > bk) {
            bk = k;
            bi = i;
        }
    }
    best_key[l] = bk;
    best_idx[l] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s && better(best_key[l + s], best_idx[l + s], best_key[l], best_idx[l])) {
            best_key[l] = best_key[l + s];
            best_idx[l] = best_idx[l + s];
        }
        workgroupBarrier();
    }
    if (l == 0u) {
        out[wid.x] = vec2<u32>(best_key[0], best_idx[0]);
    }
}
