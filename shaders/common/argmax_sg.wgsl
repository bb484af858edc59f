// The best (key, index) pair of a workgroup of `argmax_sg` (ops/argmax.wgsl), whose
// workgroup is one subgroup: the largest key, then the lowest index among the lanes
// holding it. Two subgroup operations, where the tree of common/argmax_tree.wgsl costs
// a CPU-hosted driver a switch between coroutines per barrier and lane group.

fn workgroup_best(l: u32, k: u32, i: u32) -> vec2<u32> {
    let m = subgroupMax(k);
    return vec2<u32>(m, subgroupMin(select(0xffffffffu, i, k == m)));
}
