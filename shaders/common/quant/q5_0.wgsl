// Q5_0 (ggml block_q5_0, 22 bytes): f16 d; u8 qh[4]; u8 qs[16].
// Bit j of qh is the fifth bit of element j; value = (q - 16) * d.

// Fifth bits for elements j..j+3 (from bit j of qh) as 0 or 16 in each byte.
fn q5_high(qh: u32, j: u32) -> vec4<f32> {
    let bits = (qh >> j) & 0xfu;
    return vec4<f32>(vec4<u32>(bits & 1u, (bits >> 1u) & 1u, (bits >> 2u) & 1u, bits >> 3u) * 16u);
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row_byte + c * 22u;
    let d = w_f16(b);
    let v = w_u32x5(b + 2u);
    let qh = v[0];
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = v[k + 1u];
        o[k] = (lo4(q) + q5_high(qh, 4u * k) - 16.0) * d;
        o[k + 4u] = (hi4(q) + q5_high(qh, 16u + 4u * k) - 16.0) * d;
    }
    return o;
}

// sum_j (q_j - 16) d x_j = d (sum_j q_j x_j - 16 xs).
fn wdot32(row_byte: u32, c: u32, xc: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let b = row_byte + c * 22u;
    let v = w_u32x5(b + 2u);
    var s = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = v[k + 1u];
        s += dot(lo4(q) + q5_high(v[0], 4u * k), xc[k]);
        s += dot(hi4(q) + q5_high(v[0], 16u + 4u * k), xc[k + 4u]);
    }
    return (s - 16.0 * xs) * w_f16(b);
}
