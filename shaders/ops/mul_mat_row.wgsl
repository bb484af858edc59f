// Shared part of the row-per-workgroup mul_mat variants (`mul_mat_sg`, `mul_mat_wg`):
// one workgroup per output row; invocation l of the workgroup decodes chunks
// l, l + WG, l + 2 WG, ... of the row, so neighbouring invocations read neighbouring
// blocks (coalesced on a GPU), then the workgroup adds up its partial sums.
//
// Params: common/mul_mat_params.wgsl.
//
// W: [n_cols, n_rows] (this binding holds rows row0 .. row0 + n_rows of the tensor)
// x: [n_cols, n_tokens] f32, column stride x_stride (in vec4s)
// y: [y_stride, n_tokens] f32; row r of this part lands at y[t * y_stride + row0 + r]
//    (or in y1 / y2 for fused products: `store_out`)

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

override WG: u32 = 64u;
// Tokens handled per pass over the row: a row is read once per TILE tokens.
const TILE: u32 = 4u;
// Workgroup arrays have constant sizes; WG may not exceed this.
const MAX_WG: u32 = 256u;

// The row a workgroup owns: grids wider than the per-dimension limit fold into y.
fn row_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// First token column and how many columns this dispatch produces.
fn first_token() -> u32 {
    return select(0u, step.n_tokens - 1u, p.last_only != 0u);
}

// This invocation's share of row r dotted with tokens first + t0 .. first + t0 + nt.
fn partial(r: u32, t0: u32, nt: u32, l: u32) -> vec4<f32> {
    let rb = r * p.row_bytes;
    let n_chunks = p.n_cols / 32u;
    let first = first_token();
    var acc = vec4<f32>();
    for (var c = l; c < n_chunks; c += WG) {
        let v = decode32(rb, c);
        for (var t = 0u; t < nt; t++) {
            let xb = (first + t0 + t) * p.x_stride + c * 8u;
            var s = dot(v[0], x[xb]) + dot(v[1], x[xb + 1u]);
            s += dot(v[2], x[xb + 2u]) + dot(v[3], x[xb + 3u]);
            s += dot(v[4], x[xb + 4u]) + dot(v[5], x[xb + 5u]);
            s += dot(v[6], x[xb + 6u]) + dot(v[7], x[xb + 7u]);
            acc[t] += s;
        }
    }
    return acc;
}

fn store(r: u32, t0: u32, nt: u32, s: vec4<f32>) {
    for (var t = 0u; t < nt; t++) {
        store_out(t0 + t, p.row0 + r, s[t]);
    }
}
