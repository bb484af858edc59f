// Workgroup-wide reductions for workgroups of exactly one subgroup (WG is the device's
// fixed subgroup size): one subgroup operation each, with no workgroup memory and no
// barrier. CPU-hosted drivers run every barrier as a switch between coroutines, which
// made a 64-lane tree reduction most of a norm's or a softmax's time there.
// Same signatures as common/reduce.wgsl; the `partial` array goes unused.

// The size of the kernels' `partial`, which these leave unused.
const REDUCE_MAX_WG: u32 = 256u;

fn workgroup_sum(li: u32, v: f32) -> f32 {
    return subgroupAdd(v);
}

fn workgroup_max(li: u32, v: f32) -> f32 {
    return subgroupMax(v);
}
