// mul_mat for GPUs, ROWS rows per workgroup: invocation l walks chunks l, l + WG, ...
// of the workgroup's four rows, so that neighbouring invocations read neighbouring
// blocks (coalesced) and each chunk of activations, loaded once, serves the four rows.
// A lane's partial sums are one vec4 per token of the tile, its components the rows:
// no private array indexed by a loop variable, which a GPU compiler may put in memory.
// `subgroupAdd` sums the lanes; where a workgroup is more than one subgroup, a tree in
// workgroup memory sums the subgroups.
//
// Against `mul_mat_wg` / `mul_mat_sg` (one row per workgroup, its sums reduced once
// per row and the activations loaded once per row), a workgroup here does four rows'
// work for one reduction and one activation load.
//
// Params: common/mul_mat_params.wgsl; the workgroup's rows and output tokens, and the
// activations a chunk at a time through `xv` (ops/mul_mat_xs.wgsl), as `mul_mat_ks`
// takes them (common/x_chunk.wgsl). The single-token build has the GLU store
// (`store4`).
//
// W: [n_cols, n_rows] (this binding holds rows row0 .. row0 + n_rows of the tensor)
// y: [y_stride, n_tokens] f32; row r of this part lands at y[t * y_stride + row0 + r]
//    (or in y1 / y2 for fused products: `store_out`)

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// Invocations per workgroup (`ops::mul_mat::mr_lanes`): the subgroup size where it is
// fixed, with SG_WHOLE; else 64, reduced through workgroup memory; either, two or four
// times over on GPUs for products of few, long rows (not SG_WHOLE then).
override WG: u32 = 64u;
// Whether a workgroup is exactly one subgroup, so `subgroupAdd` alone sums it.
override SG_WHOLE: bool = false;
// Rows per workgroup: the four components of a lane's sums.
const ROWS: u32 = 4u;
fn wg_rows() -> u32 {
    return ROWS;
}
// Tokens per pass over the rows (a row is read once per TILE tokens): 4, or 1 in the
// single-token build, which then holds one token's sums and activations.
override TILE: u32 = 4u;
// Workgroup arrays have constant sizes; WG may not exceed this.
const MAX_WG: u32 = 256u;

var<workgroup> red: array<vec4<f32>, MAX_WG>;

// The byte offsets of the workgroup's four rows; rows past the part's end repeat its
// last row (their sums are not stored). With the GLU store, rows g and g + 1 of gate
// and the same two of up (`glu_pair`).
fn row_bytes4(r0: u32) -> vec4<u32> {
    if (p.glu != 0u) {
        let n_ff = p.y_stride;
        let g = glu_pair(r0);
        let g1 = min(g + 1u, n_ff - 1u);
        return vec4<u32>(g, g1, n_ff + g, n_ff + g1) * p.row_bytes;
    }
    let last = p.n_rows - 1u;
    let r = min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    return r * p.row_bytes;
}

// The GLU store (`p.glu`, a fused gate/up product of single tokens, its y_stride rows
// of gate then as many of up): the workgroup of rows r0 .. r0 + 3 takes gate rows
// g = r0 / 2 and g + 1 and the same rows of up, and stores act(gate) * up for the two.
fn glu_pair(r0: u32) -> u32 {
    return r0 / 2u;
}

// Chunk c of the four rows dotted with the activations `xc`, made ready for the weight
// type's dot once for the four (`x_pre`, common/bytes.wgsl).
fn dot4(rb: vec4<u32>, c: u32, xc: array<vec4<f32>, 8>) -> vec4<f32> {
    let xs = x_sum(xc);
    let xp = x_pre(xc, c);
    return vec4<f32>(
        wdot32_pre(rb.x, c, xp, xs),
        wdot32_pre(rb.y, c, xp, xs),
        wdot32_pre(rb.z, c, xp, xs),
        wdot32_pre(rb.w, c, xp, xs),
    );
}

// The workgroup's total of every lane's `a` (every lane gets it). Called in uniform
// control flow.
fn total(a: vec4<f32>, l: u32, sl: u32) -> vec4<f32> {
    let s = subgroupAdd(a);
    if (SG_WHOLE) {
        return s;
    }
    // One slot per invocation, kept by the first lane of each subgroup: the spec does
    // not promise that subgroups follow local_invocation_index.
    red[l] = select(vec4<f32>(), s, sl == 0u);
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (l < k) {
            red[l] += red[l + k];
        }
        workgroupBarrier();
    }
    let tot = red[0];
    // Every lane has read the total before the slots are written again.
    workgroupBarrier();
    return tot;
}

// Lanes 0 .. nr - 1 store the workgroup's rows of token t; with the GLU store, lanes 0
// and 1 its two activations.
fn store4(t: u32, rows: KsRows, tot: vec4<f32>, l: u32) {
    if (p.glu != 0u) {
        let g = glu_pair(rows.r0) + l;
        if (l < 2u && g < p.y_stride) {
            let gu = select(tot.yw, tot.xz, l == 0u);
            store_y(t * p.y_stride + g, glu_act(p.glu - 1u, gu.x) * gu.y);
        }
        return;
    }
    if (l < rows.nr) {
        store_out(t, p.row0 + rows.r0 + l, tot[l]);
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) l: u32,
    @builtin(subgroup_invocation_id) sl: u32,
) {
    // Uniform per workgroup, so returning here keeps the barriers below uniform.
    let rows = ks_rows(wid, nwg);
    if (rows.nr == 0u) {
        return;
    }
    let rb = row_bytes4(rows.r0);
    let n_chunks = p.n_cols / 32u;
    for (var t0 = p.tok0; t0 < rows.n_out; t0 += TILE) {
        let nt = min(TILE, rows.n_out - t0);
        var a0 = vec4<f32>();
        var a1 = vec4<f32>();
        var a2 = vec4<f32>();
        var a3 = vec4<f32>();
        for (var c = l; c < n_chunks; c += WG) {
            a0 += dot4(rb, c, x_chunk(rows.first, t0, c));
            if (TILE > 1u && nt > 1u) {
                a1 += dot4(rb, c, x_chunk(rows.first, t0 + 1u, c));
            }
            if (TILE > 2u && nt > 2u) {
                a2 += dot4(rb, c, x_chunk(rows.first, t0 + 2u, c));
            }
            if (TILE > 3u && nt > 3u) {
                a3 += dot4(rb, c, x_chunk(rows.first, t0 + 3u, c));
            }
        }
        store4(t0, rows, total(a0, l, sl), l);
        if (TILE > 1u && nt > 1u) {
            store4(t0 + 1u, rows, total(a1, l, sl), l);
        }
        if (TILE > 2u && nt > 2u) {
            store4(t0 + 2u, rows, total(a2, l, sl), l);
        }
        if (TILE > 3u && nt > 3u) {
            store4(t0 + 3u, rows, total(a3, l, sl), l);
        }
    }
}
