// Q4_1 (ggml block_q4_1, 20 bytes): f16 d; f16 m; u8 qs[16].
// Element j = (qs[j] & 15) * d + m, element j + 16 = (qs[j] >> 4) * d + m.
// The block is 5 whole words, so it is read with aligned loads.

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = (row_byte + c * 20u) >> 2u;
    let dm = unpack2x16float(w[b]);
    let q0 = w[b + 1u];
    let q1 = w[b + 2u];
    let q2 = w[b + 3u];
    let q3 = w[b + 4u];
    return array<vec4<f32>, 8>(
        lo4(q0) * dm.x + dm.y, lo4(q1) * dm.x + dm.y, lo4(q2) * dm.x + dm.y, lo4(q3) * dm.x + dm.y,
        hi4(q0) * dm.x + dm.y, hi4(q1) * dm.x + dm.y, hi4(q2) * dm.x + dm.y, hi4(q3) * dm.x + dm.y,
    );
}

// sum_j (q_j d + m) x_j = d sum_j q_j x_j + m xs.
fn wdot32(row_byte: u32, c: u32, xc: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let b = (row_byte + c * 20u) >> 2u;
    let dm = unpack2x16float(w[b]);
    var s = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = w[b + 1u + k];
        s += dot(lo4(q), xc[k]) + dot(hi4(q), xc[k + 4u]);
    }
    return s * dm.x + xs * dm.y;
}
