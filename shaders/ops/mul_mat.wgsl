// y = W x for a quantized weight matrix, one invocation per output row.
//
// Each invocation walks its own row of W from start to end, decoding 32 weights at a
// time (`decode32`, from the weight type's decoder prepended to this file) and dotting
// them with up to TILE activation columns, so a row is read once per TILE tokens.
// This contiguous per-invocation walk is what CPU-hosted drivers (lavapipe) read fastest.
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
const TILE: u32 = 4u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= p.n_rows) {
        return;
    }
    let rb = r * p.row_bytes;
    let n_chunks = p.n_cols / 32u;
    let first = select(0u, step.n_tokens - 1u, p.last_only != 0u);
    let n_out = step.n_tokens - first;
    for (var t0 = 0u; t0 < n_out; t0 += TILE) {
        let nt = min(TILE, n_out - t0);
        var acc = array<f32, TILE>();
        for (var c = 0u; c < n_chunks; c++) {
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
        for (var t = 0u; t < nt; t++) {
            store_out(t0 + t, p.row0 + r, acc[t]);
        }
    }
}
