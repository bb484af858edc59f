// Q8_0 (ggml block_q8_0, 34 bytes): f16 d; i8 qs[32]; value = q * d.
// The quants start 2 bytes into the block, so they are read as one run of words.

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row_byte + c * 34u;
    let d = w_f16(b);
    let q = w_u32x8(b + 2u);
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        o[k] = i8x4(q[k]) * d;
    }
    return o;
}

// sum_j q_j d x_j = d sum_j q_j x_j: the scale leaves the inner sum.
fn wdot32(row_byte: u32, c: u32, xc: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let b = row_byte + c * 34u;
    let q = w_u32x8(b + 2u);
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        s += dot(i8x4(q[k]), xc[k]);
    }
    return s * w_f16(b);
}
