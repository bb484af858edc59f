// mul_mat with the row's chunks split across one subgroup: a workgroup is exactly one
// subgroup of WG lanes and owns ROWS consecutive rows. Lane l decodes chunks l, l + WG,
// ... of each of its rows, so the chunk of activations it loads serves all ROWS rows;
// the lanes' partial sums are then added with subgroupAdd (no workgroup memory, no
// barrier). On CPU-hosted drivers every storage load is a per-lane loop, so loading
// each activation once per ROWS rows is what makes this fast there.
//
// W: [n_cols, n_rows] (this binding holds rows row0 .. row0 + n_rows of the tensor)
// x: [n_cols, n_tokens] f32, column stride x_stride (in vec4s)
// y: [y_stride, n_tokens] f32; row r of this part lands at y[t * y_stride + row0 + r]

struct Params {
    n_rows: u32,    // rows in this part
    n_cols: u32,    // elements per row (a multiple of 32)
    row_bytes: u32, // bytes per row of W
    row0: u32,      // first row of this part within the whole tensor
    x_stride: u32,  // vec4s between activation columns
    y_stride: u32,  // floats between output columns
    last_only: u32, // 1: only the batch's last token, written as column 0 (logits)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// Lanes per workgroup: the device's subgroup size, so one workgroup is one subgroup.
override WG: u32 = 8u;
// Rows per workgroup.
const ROWS: u32 = 8u;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) l: u32,
) {
    // Uniform per workgroup, so every lane reaches the subgroupAdd below.
    let r0 = (wid.y * nwg.x + wid.x) * ROWS;
    if (r0 >= p.n_rows) {
        return;
    }
    let nr = min(ROWS, p.n_rows - r0);
    let n_chunks = p.n_cols / 32u;
    let first = select(0u, step.n_tokens - 1u, p.last_only != 0u);
    let n_out = step.n_tokens - first;
    for (var t = 0u; t < n_out; t++) {
        var acc = array<f32, ROWS>();
        let xt = (first + t) * p.x_stride;
        for (var c = l; c < n_chunks; c += WG) {
            let xb = xt + c * 8u;
            let x0 = x[xb];
            let x1 = x[xb + 1u];
            let x2 = x[xb + 2u];
            let x3 = x[xb + 3u];
            let x4 = x[xb + 4u];
            let x5 = x[xb + 5u];
            let x6 = x[xb + 6u];
            let x7 = x[xb + 7u];
            for (var i = 0u; i < nr; i++) {
                let v = decode32((r0 + i) * p.row_bytes, c);
                var s = dot(v[0], x0) + dot(v[1], x1);
                s += dot(v[2], x2) + dot(v[3], x3);
                s += dot(v[4], x4) + dot(v[5], x5);
                s += dot(v[6], x6) + dot(v[7], x7);
                acc[i] += s;
            }
        }
        for (var i = 0u; i < ROWS; i++) {
            let s = subgroupAdd(acc[i]);
            if (l == 0u && i < nr) {
                y[t * p.y_stride + p.row0 + r0 + i] = s;
            }
        }
    }
}
