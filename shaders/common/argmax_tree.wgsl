// The best (key, index) pair of a workgroup of `argmax` (ops/argmax.wgsl): a tree in
// workgroup memory, WG a power of two. Every lane must call it; lane 0's result is the
// workgroup's.

var<workgroup> best_key: array<u32, WG>;
var<workgroup> best_idx: array<u32, WG>;

// Whether (ka, ia) comes before (kb, ib): the larger key, then the lower index.
fn better(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

fn workgroup_best(l: u32, k: u32, i: u32) -> vec2<u32> {
    best_key[l] = k;
    best_idx[l] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s && better(best_key[l + s], best_idx[l + s], best_key[l], best_idx[l])) {
            best_key[l] = best_key[l + s];
            best_idx[l] = best_idx[l + s];
        }
        workgroupBarrier();
    }
    return vec2<u32>(best_key[0], best_idx[0]);
}
