// What the subgroup matmuls (`mul_mat_ks`, `mul_mat_ks1`) share: a workgroup's rows and
// output tokens, and the activations a chunk of 32 at a time, read through `xv`
// (`ops/mul_mat_xs.wgsl` or `ops/mul_mat_xu.wgsl`).

// Workgroup `wid`'s `wg_rows()` rows from r0 (nr of them exist; none when r0 >= p.n_rows),
// each kernel's own (a constant, or the host's choice in `mul_mat_ks1`), and
// its output tokens t0 .. n_out, counted from batch token `first` (the last token alone
// for `last_only`; tok0 .. tok0 + tok_n of them per dispatch, in windows of at most
// tok_win along z). The windows keep each workgroup's loop trips bounded: llvmpipe ends
// a loop nest after a fixed number of trips (its loop limiter), silently, so a
// workgroup that walks too many rows times tokens leaves outputs unwritten.
//
// The host sizes the grid for windows of tok_win (`ops::mul_mat::ks_tok_win`); the
// windows here share the dispatch's tokens evenly instead, in multiples of 8 (whole
// tiles of four and of eight but in the last), so that a batch a little past a whole
// window is not one full window and one nearly empty: llvmpipe deals a dispatch's
// workgroups to its threads in runs, and 36 tokens in windows of 32 and 4 ran
// `ffn_down` at half its rate at 32 tokens (docs/perf.md).
fn window(n: u32, windows: u32) -> u32 {
    let even = ((n + windows - 1u) / windows + 7u) / 8u * 8u;
    return min(p.tok_win, max(even, 8u));
}

struct KsRows {
    r0: u32,
    nr: u32,
    first: u32,
    n_out: u32,
    t0: u32,
}

// The grid is (groups of rows, folded over x and y) by (windows along z); workgroups are
// numbered here with the windows innermost, so that a run of consecutive workgroups
// (x fastest, as llvmpipe deals them) is all the windows of one group of rows, then of
// the next: each thread gets whole groups of rows, whatever the windows hold.
fn ks_rows(wid: vec3<u32>, nwg: vec3<u32>) -> KsRows {
    let l = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    let r0 = l / nwg.z * wg_rows();
    let first = select(0u, step.n_tokens - 1u, p.last_only != 0u);
    let end = min(step.n_tokens - first, p.tok0 + min(p.tok_n, step.n_tokens));
    let win = window(end - min(p.tok0, end), nwg.z);
    let t0 = p.tok0 + l % nwg.z * win;
    return KsRows(
        r0,
        min(wg_rows(), p.n_rows - min(r0, p.n_rows)),
        first,
        min(end, t0 + win),
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
