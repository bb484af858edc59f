// Q8_0 (ggml block_q8_0, 34 bytes): f16 d; i8 qs[32]; value = q * d.
// Planar rows (src/gpu/layout.rs): every block's 32 quants (two aligned vec4s), then
// every block's d.

fn q8_0_d(row_byte: u32, c: u32) -> f32 {
    return w_f16(plane(row_byte, 32u, 32u) + c * 2u);
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let d = q8_0_d(row_byte, c);
    let q = wq8((row_byte >> 4u) + c * 2u);
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        o[k] = i8x4(q[k]) * d;
    }
    return o;
}

// sum_j q_j d x_j = d sum_j q_j x_j: the scale leaves the inner sum.
fn wdot32(row_byte: u32, c: u32, xc: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let q = wq8((row_byte >> 4u) + c * 2u);
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        s += dot(i8x4(q[k]), xc[k]);
    }
    return s * q8_0_d(row_byte, c);
}
