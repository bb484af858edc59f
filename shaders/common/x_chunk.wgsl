// What the subgroup matmuls (`mul_mat_ks`, `mul_mat_ks1`) share: a workgroup's rows and
// output tokens, and the activations a chunk of 32 at a time, read through `xv`
// (`ops/mul_mat_xs.wgsl` or `ops/mul_mat_xu.wgsl`).

// Workgroup `wid`'s `wg_rows()` rows from r0 (nr of them exist; none when r0 >= p.n_rows),
// each kernel's own (a constant, or the host's choice in `mul_mat_ks1`), and
// its output tokens t0 .. n_out, counted from batch token `first` (the last token alone
// for `last_only`; tok0 .. tok0 + tok_n of them per dispatch, in windows of tok_win
// along z). The windows keep each workgroup's loop trips bounded: llvmpipe ends a
// loop nest after a fixed number of trips (its loop limiter), silently, so a workgroup
// that walks too many rows times tokens leaves outputs unwritten.
struct KsRows {
    r0: u32,
    nr: u32,
    first: u32,
    n_out: u32,
    t0: u32,
}

fn ks_rows(wid: vec3<u32>, nwg: vec3<u32>) -> KsRows {
    let r0 = (wid.y * nwg.x + wid.x) * wg_rows();
    let first = select(0u, step.n_tokens - 1u, p.last_only != 0u);
    let t0 = p.tok0 + wid.z * p.tok_win;
    let end = min(step.n_tokens - first, p.tok0 + min(p.tok_n, step.n_tokens));
    return KsRows(
        r0,
        min(wg_rows(), p.n_rows - min(r0, p.n_rows)),
        first,
        min(end, t0 + p.tok_win),
        t0,
    );
}

// Chunk c of output token t's activations.
fn x_chunk(first: u32, t: u32, c: u32) -> array<vec4<f32>, 8> {
    let i = c * 8u;
    return array<vec4<f32>, 8>(
        xv(first, t, i), xv(first, t, i + 1u), xv(first, t, i + 2u), xv(first, t, i + 3u),
        xv(first, t, i + 4u), xv(first, t, i + 5u), xv(first, t, i + 6u), xv(first, t, i + 7u),
    );
}

// The sum of a chunk's activations (for the decoders' `wdot32`).
fn x_sum(xc: array<vec4<f32>, 8>) -> f32 {
    let s = xc[0] + xc[1] + xc[2] + xc[3] + xc[4] + xc[5] + xc[6] + xc[7];
    return s.x + s.y + s.z + s.w;
}

// A decoded chunk dotted with a chunk of activations (tiles decode once per row).
fn vdot32(v: array<vec4<f32>, 8>, xc: array<vec4<f32>, 8>) -> f32 {
    var s = dot(v[0], xc[0]) + dot(v[1], xc[1]);
    s += dot(v[2], xc[2]) + dot(v[3], xc[3]);
    s += dot(v[4], xc[4]) + dot(v[5], xc[5]);
    s += dot(v[6], xc[6]) + dot(v[7], xc[7]);
    return s;
}
