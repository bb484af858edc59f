// mul_mat for batches on GPUs: a tiled matrix product through workgroup memory. A
// workgroup owns BM rows and BN tokens; per step of BK elements, half its invocations
// decode the rows' two chunks into `ws` while the other half copy the tokens'
// activations into `xs`, and then every invocation multiplies four rows by four tokens
// out of workgroup memory. Each weight byte is read once per BN tokens (against four
// for `mul_mat_mr`'s tiles) and each activation once per BM rows, so a batch's product
// becomes arithmetic instead of memory traffic.
//
// Params: common/mul_mat_params.wgsl; output tokens p.tok0 .. p.tok0 + p.tok_n of the
// batch (never `last_only`: single tokens run `mul_mat_mr`).
//
// W: [n_cols, n_rows] (this binding holds rows row0 .. row0 + n_rows of the tensor)
// x: [n_cols, n_tokens] (`xv`, ops/mul_mat_xs.wgsl)
// y: [y_stride, n_tokens] f32; row r of this part lands at y[t * y_stride + row0 + r]
//    (or in y1 / y2 for fused products: `store_out`)

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// Rows and tokens per workgroup, and elements per step (two chunks of 32).
const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 64u;
// Invocations: 16 x 16, each four rows by four tokens (`ops::mul_mat::MM_WG`).
const WG: u32 = 256u;

// Element k of rows 4g .. 4g + 3 at [k * BM / 4 + g], and of tokens 4g .. 4g + 3 in
// `xs` the same way: an invocation's four rows (or tokens) are one vec4 load.
var<workgroup> ws: array<vec4<f32>, 1024>;
var<workgroup> xs: array<vec4<f32>, 1024>;

// The workgroup's output tokens: t0 .. n_out of the batch.
struct Tokens {
    t0: u32,
    n_out: u32,
}

fn tokens(wid: vec3<u32>) -> Tokens {
    let n_out = min(step.n_tokens, p.tok0 + min(p.tok_n, step.n_tokens));
    return Tokens(p.tok0 + wid.y * BN, n_out);
}

// Invocation l < 128 decodes chunk c0 + (l & 1) of the workgroup's row l / 2 (the last
// row again past the part's end; zeros past the row's end) into `ws`.
fn load_w(r0: u32, c0: u32, l: u32) {
    let r = l >> 1u;
    let h = l & 1u;
    let c = c0 + h;
    let row = min(r0 + r, p.n_rows - 1u);
    var v: array<vec4<f32>, 8>;
    if (c < p.n_cols / 32u) {
        v = decode32(row * p.row_bytes, c);
    }
    let g = r >> 2u;
    let e = r & 3u;
    for (var i = 0u; i < 8u; i++) {
        let k = (h * 32u + i * 4u) * (BM / 4u) + g;
        ws[k][e] = v[i].x;
        ws[k + BM / 4u][e] = v[i].y;
        ws[k + 2u * BM / 4u][e] = v[i].z;
        ws[k + 3u * BM / 4u][e] = v[i].w;
    }
}

// Invocation l >= 128 copies chunk c0 + (l & 1) of token (l - 128) / 2's activations
// (the last token again past the batch's end; zeros past the row's end) into `xs`.
fn load_x(tk: Tokens, c0: u32, l: u32) {
    let j = l - 128u;
    let t = j >> 1u;
    let h = j & 1u;
    let c = c0 + h;
    let tok = min(tk.t0 + t, tk.n_out - 1u);
    let live = c < p.n_cols / 32u;
    let g = t >> 2u;
    let e = t & 3u;
    for (var i = 0u; i < 8u; i++) {
        var v = vec4<f32>();
        if (live) {
            v = xv(0u, tok, c * 8u + i);
        }
        let k = (h * 32u + i * 4u) * (BN / 4u) + g;
        xs[k][e] = v.x;
        xs[k + BN / 4u][e] = v.y;
        xs[k + 2u * BN / 4u][e] = v.z;
        xs[k + 3u * BN / 4u][e] = v.w;
    }
}

// Token t's sums of rows r .. r + 3, those in the part and the batch.
fn store4(tk: Tokens, t: u32, r: u32, v: vec4<f32>) {
    if (t >= tk.n_out) {
        return;
    }
    for (var i = 0u; i < 4u; i++) {
        if (r + i < p.n_rows) {
            store_out(t, p.row0 + r + i, v[i]);
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let r0 = wid.x * BM;
    let tk = tokens(wid);
    // Uniform per workgroup, so returning keeps the barriers below uniform.
    if (r0 >= p.n_rows || tk.t0 >= tk.n_out) {
        return;
    }
    // This invocation's rows 4 ty .. and tokens 4 tx .. of the tile.
    let tx = l % 16u;
    let ty = l / 16u;
    var a0 = vec4<f32>();
    var a1 = vec4<f32>();
    var a2 = vec4<f32>();
    var a3 = vec4<f32>();
    for (var c0 = 0u; c0 < p.n_cols / 32u; c0 += 2u) {
        if (l < 128u) {
            load_w(r0, c0, l);
        } else {
            load_x(tk, c0, l);
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let a = ws[k * (BM / 4u) + ty];
            let b = xs[k * (BN / 4u) + tx];
            a0 += a * b.x;
            a1 += a * b.y;
            a2 += a * b.z;
            a3 += a * b.w;
        }
        // Every invocation is done with the tiles before they are written again.
        workgroupBarrier();
    }
    let t = tk.t0 + tx * 4u;
    let r = r0 + ty * 4u;
    store4(tk, t, r, a0);
    store4(tk, t + 1u, r, a1);
    store4(tk, t + 2u, r, a2);
    store4(tk, t + 3u, r, a3);
}
