// Top-k sampling on the device, third pass: every logit whose key is at or above the
// floor (`topk_floor`) goes into the candidate list with its id, in no particular
// order; the host sorts them. A span whose maximum is below the floor has none. The
// count goes on past `cap` when the list is full, so the host sees that it overflowed.
// One more workgroup writes the keys of the tokens the step listed.
//
// logits: [n] f32 read as words; maxima: [spans] keys; found: count, floor, the listed
// tokens' keys, then the (key, id) pairs (`Found`, common/top_k.wgsl)

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<u32>;
@group(0) @binding(3) var<storage, read> want: Want;
@group(0) @binding(4) var<storage, read> maxima: array<u32>;
@group(0) @binding(5) var<storage, read_write> found: Found;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    if (step.n_tokens == 0u) {
        return;
    }
    if (wid.x == p.spans) {
        for (var i = l; i < min(want.n_listed, MAX_LISTED); i += WG) {
            found.listed[i] = order_key(logits[min(want.ids[i], p.n - 1u)]);
        }
        return;
    }
    let floor = found.floor;
    if (maxima[wid.x] < floor) {
        return;
    }
    let start = wid.x * p.span;
    let end = min(start + p.span, p.n);
    for (var i = start + l; i < end; i += WG) {
        let key = order_key(logits[i]);
        if (key >= floor) {
            let slot = atomicAdd(&found.count, 1u);
            if (slot < p.cap) {
                found.pairs[slot] = vec2<u32>(key, i);
            }
        }
    }
}
