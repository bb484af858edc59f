// Q4_1 (ggml block_q4_1, 20 bytes): f16 d; f16 m; u8 qs[16].
// Element j = (qs[j] & 15) * d + m, element j + 16 = (qs[j] >> 4) * d + m.

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row_byte + c * 20u;
    let dm = unpack2x16float(w_u32(b));
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = w_u32(b + 4u + 4u * k);
        o[k] = lo4(q) * dm.x + dm.y;
        o[k + 4u] = hi4(q) * dm.x + dm.y;
    }
    return o;
}
