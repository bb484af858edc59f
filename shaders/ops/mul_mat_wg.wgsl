// mul_mat, one workgroup per row, partial sums added in workgroup memory (portable: no
// subgroup operations). Body: mul_mat_row.wgsl.

var<workgroup> red: array<vec4<f32>, MAX_WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) l: u32,
) {
    // Uniform per workgroup, so returning here keeps the barriers below uniform.
    let r = row_of(wid, nwg);
    if (r >= p.n_rows) {
        return;
    }
    let n_out = step.n_tokens - first_token();
    for (var t0 = 0u; t0 < n_out; t0 += TILE) {
        let nt = min(TILE, n_out - t0);
        red[l] = partial(r, t0, nt, l);
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (l < s) {
                red[l] += red[l + s];
            }
            workgroupBarrier();
        }
        if (l == 0u) {
            store(r, t0, nt, red[0]);
        }
        workgroupBarrier();
    }
}
