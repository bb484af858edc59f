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

// sum_j q_j d x_j = d sum_j q_j x_j: the scale leaves the inner sum. Each quant is
// moved to its word's top byte, where it reads as q * 2^24 with its sign (one or two
// operations, against two and a sign extension to extract it); the power leaves the
// sum with the scale, and the sum is bit for bit that of the quants themselves.
fn wdot32(row_byte: u32, c: u32, xc: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let q = wq8((row_byte >> 4u) + c * 2u);
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let v = q[k];
        let top = vec4<u32>(v << 24u, (v << 16u) & 0xff000000u, (v << 8u) & 0xff000000u, v & 0xff000000u);
        s += dot(vec4<f32>(vec4<i32>(top)), xc[k]);
    }
    return s * (q8_0_d(row_byte, c) * (1.0 / 16777216.0));
}
