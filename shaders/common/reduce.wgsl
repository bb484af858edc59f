// Workgroup-wide reductions through a `partial: array<f32, WG>` workgroup array that the
// including kernel declares. Every invocation of the workgroup must call these.

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
