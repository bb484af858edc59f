// mul_mat, one workgroup per row, partial sums added with subgroupAdd and the
// per-subgroup totals in workgroup memory. Body: mul_mat_row.wgsl.

var<workgroup> red: array<vec4<f32>, MAX_WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) l: u32,
    @builtin(subgroup_invocation_id) sl: u32,
) {
    // Uniform per workgroup, so returning here keeps the barriers below uniform.
    let r = row_of(wid, nwg);
    if (r >= p.n_rows) {
        return;
    }
    let n_out = step.n_tokens - first_token();
    for (var t0 = 0u; t0 < n_out; t0 += TILE) {
        let nt = min(TILE, n_out - t0);
        let s = subgroupAdd(partial(r, t0, nt, l));
        // One lane per subgroup keeps its subgroup's total. Slots are indexed by the
        // invocation, not by l / subgroup_size, since the spec does not promise that
        // subgroups are laid out in local_invocation_index order.
        red[l] = select(vec4<f32>(), s, sl == 0u);
        workgroupBarrier();
        if (l == 0u) {
            var tot = vec4<f32>();
            for (var i = 0u; i < WG; i++) {
                tot += red[i];
            }
            store(r, t0, nt, tot);
        }
        workgroupBarrier();
    }
}
