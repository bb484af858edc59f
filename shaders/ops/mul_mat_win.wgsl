// y = W x, one invocation per output row like `mul_mat`, but the row is fetched in
// windows of NV vec4<u32> loads into a private array that the weight type's
// `decode32` then reads. CPU-hosted drivers (lavapipe) pay for every storage load per
// lane and per 32-bit component, with a bounds check and a branch each, so one vec4
// load per 16 bytes costs far less than the scattered, often straddling u32 loads
// the decoders make; private-array reads are plain register/stack accesses there.
//
// The decoders read the weights through `wu` / `wq` (common/w_storage.wgsl); here they
// read the private window `w` and the offsets are relative to it. Activations come through
// `xv`, from storage (`mul_mat_xs.wgsl`) or from a uniform copy (`mul_mat_xu.wgsl`).
// Output tokens tok0 .. tok0 + tok_n of the batch are produced (all of them for the
// storage source; one uniform-buffer load of them for the uniform source).
//
// Params: common/mul_mat_params.wgsl.
//
// W: [n_cols, n_rows] (this binding holds rows row0 .. row0 + n_rows of the tensor)
// x: [n_cols, n_tokens] f32, column stride x_stride (in vec4s)
// y: [y_stride, n_tokens] f32; row r of this part lands at y[t * y_stride + row0 + r]
//    (or in y1 / y2 for fused products: `store_out`)

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> wv: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// The window: NV vec4s starting at the 16-byte boundary at or before the window's
// first byte; NV covers that misalignment, the window and the word after it (the
// straddling reads of `w_u32`).
var<private> w: array<u32, 64>;

fn wu(i: u32) -> u32 {
    return w[i];
}

fn wq(i: u32) -> vec4<u32> {
    let j = 4u * i;
    return vec4<u32>(w[j], w[j + 1u], w[j + 2u], w[j + 3u]);
}

override WG: u32 = 64u;
override NV: u32 = 16u;
// Tokens per pass over the row: W is read once per TILE tokens.
const TILE: u32 = 8u;

// Fill the window with the bytes from `byte` on; returns `byte`'s offset in it.
fn load_window(byte: u32) -> u32 {
    let a = byte >> 4u;
    for (var k = 0u; k < NV; k++) {
        let v = wv[a + k];
        w[4u * k] = v.x;
        w[4u * k + 1u] = v.y;
        w[4u * k + 2u] = v.z;
        w[4u * k + 3u] = v.w;
    }
    return byte & 15u;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= p.n_rows) {
        return;
    }
    let rb = r * p.row_bytes;
    let n_chunks = p.n_cols / 32u;
    let first = select(0u, step.n_tokens - 1u, p.last_only != 0u);
    let n_out = min(step.n_tokens - first, p.tok0 + p.tok_n);
    for (var t0 = p.tok0; t0 < n_out; t0 += TILE) {
        let nt = min(TILE, n_out - t0);
        var acc = array<f32, TILE>();
        var win = 0u;
        for (var c0 = 0u; c0 < n_chunks; c0 += p.win_chunks) {
            let o = load_window(rb + win * p.win_bytes);
            win += 1u;
            let n_c = min(p.win_chunks, n_chunks - c0);
            for (var c = 0u; c < n_c; c++) {
                let v = decode32(o, c);
                for (var t = 0u; t < nt; t++) {
                    let tt = t0 + t;
                    let xb = (c0 + c) * 8u;
                    var s = dot(v[0], xv(first, tt, xb)) + dot(v[1], xv(first, tt, xb + 1u));
                    s += dot(v[2], xv(first, tt, xb + 2u)) + dot(v[3], xv(first, tt, xb + 3u));
                    s += dot(v[4], xv(first, tt, xb + 4u)) + dot(v[5], xv(first, tt, xb + 5u));
                    s += dot(v[6], xv(first, tt, xb + 6u)) + dot(v[7], xv(first, tt, xb + 7u));
                    acc[t] += s;
                }
            }
        }
        for (var t = 0u; t < nt; t++) {
            store_out(t0 + t, p.row0 + r, acc[t]);
        }
    }
}
