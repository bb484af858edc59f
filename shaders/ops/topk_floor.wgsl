// Top-k sampling on the device, second pass, one workgroup: the floor is the k-th
// largest of the spans' maxima (k as the step wants it). k spans hold a logit at or
// above it, so at least k logits are, and with them the k best. Also empties the
// candidate list that the third pass (`topk_gather`) appends to.
//
// maxima: [spans] keys; found: the list's count and floor, then the listed tokens'
// keys and the (key, id) pairs (`Found`, common/top_k.wgsl)

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> want: Want;
@group(0) @binding(3) var<storage, read> maxima: array<u32>;
@group(0) @binding(4) var<storage, read_write> found: Found;

// 64 lanes, a size every device runs (GLES 3.1 promises 128 invocations), each lane
// taking every 64th span. A power of two dividing MAX_SPANS.
const WG: u32 = 64u;

var<workgroup> m: array<u32, MAX_SPANS>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) l: u32) {
    if (step.n_tokens == 0u) {
        return;
    }
    for (var s = l; s < MAX_SPANS; s += WG) {
        m[s] = select(0u, maxima[min(s, p.spans - 1u)], s < p.spans);
    }
    workgroupBarrier();
    for (var s = l; s < p.spans; s += WG) {
        // Span s's maximum is the k-th largest if fewer than k are above it and at
        // least k at or above it; of equal maxima the first span's writes it.
        let v = m[s];
        var above = 0u;
        var at_least = 0u;
        var first = true;
        for (var j = 0u; j < p.spans; j++) {
            let w = m[j];
            above += u32(w > v);
            at_least += u32(w >= v);
            first = first && !(w == v && j < s);
        }
        if (first && above < want.k && want.k <= at_least) {
            found.floor = v;
        }
    }
    if (l == 0u) {
        atomicStore(&found.count, 0u);
    }
}
