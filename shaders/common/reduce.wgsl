// Workgroup-wide reductions through a `partial: array<f32, REDUCE_MAX_WG>` workgroup
// array that the including kernel declares (WG lanes of it used). Every invocation of the workgroup must call these.

// The largest workgroup these serve (`ops::reduce_lanes`): the size of `partial`.
const REDUCE_MAX_WG: u32 = 256u;

fn workgroup_sum(li: u32, v: f32) -> f32 {
    partial[li] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            partial[li] += partial[li + s];
        }
        workgroupBarrier();
    }
    let r = partial[0];
    workgroupBarrier();
    return r;
}

fn workgroup_max(li: u32, v: f32) -> f32 {
    partial[li] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            partial[li] = max(partial[li], partial[li + s]);
        }
        workgroupBarrier();
    }
    let r = partial[0];
    workgroupBarrier();
    return r;
}
