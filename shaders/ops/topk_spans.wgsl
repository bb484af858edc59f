// Top-k sampling on the device, first pass: workgroup g writes the largest key of span
// g of the logits (`common/top_k.wgsl`).
//
// logits: [n] f32 read as words; maxima: [spans] keys

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<u32>;
@group(0) @binding(3) var<storage, read_write> maxima: array<u32>;

// A power of two (the tree below halves it).
override WG: u32 = 64u;

var<workgroup> best: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    // (Every kernel binds the step; one without tokens has no logits to sample.)
    if (step.n_tokens == 0u) {
        return;
    }
    let start = wid.x * p.span;
    let end = min(start + p.span, p.n);
    var m = 0u;
    for (var i = start + l; i < end; i += WG) {
        m = max(m, order_key(logits[i]));
    }
    best[l] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s) {
            best[l] = max(best[l], best[l + s]);
        }
        workgroupBarrier();
    }
    if (l == 0u) {
        maxima[wid.x] = best[0];
    }
}
