// Activations of the subgroup matmuls (`mul_mat_ks`, `mul_mat_ks1`) a chunk of 32 at a
// time, read through `xv` (`ops/mul_mat_xs.wgsl` or `ops/mul_mat_xu.wgsl`).

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
