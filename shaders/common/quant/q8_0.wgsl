// Q8_0 (ggml block_q8_0, 34 bytes): f16 d; i8 qs[32]; value = q * d.
// Planar rows (src/gpu/layout.rs): every block's 32 quants (two aligned vec4s), then
// every block's d. The quants are held offset by 128, as unsigned bytes (q + 128, the
// file's byte with its top bit flipped: `gpu::layout::write_row`).

fn q8_0_d(row_byte: u32, c: u32) -> f32 {
    return w_f16(plane(row_byte, 32u, 32u) + c * 2u);
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let d = q8_0_d(row_byte, c);
    let q = wq8((row_byte >> 4u) + c * 2u);
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        o[k] = (u8x4(q[k]) - 128.0) * d;
    }
    return o;
}

// sum_j q_j d x_j = d (sum_j (q_j + 128) x_j - 128 xs): the quants are held offset
// (above) and read in place in their bytes (common/bytes.wgsl), the activations from
// `x_pre`, so a byte takes one operation (a mask, or the top byte's shift) where a
// signed quant takes two to reach its word's top byte. Measured on lavapipe
// (docs/perf.md): Gemma 3's decode 1.04x, its Q8_0 head most of it.
fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return x_times(xc, PLACE_BYTES);
}

fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let q = wq8((row_byte >> 4u) + c * 2u);
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        s += dot(bytes_placed(q[k]), xp[k]);
    }
    return (s - 128.0 * xs) * q8_0_d(row_byte, c);
}
