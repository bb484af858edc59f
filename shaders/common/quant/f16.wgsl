// F16 weights: a 32-element chunk is 64 bytes.

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let base = (row_byte + c * 64u) >> 2u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let i = base + k * 2u;
        o[k] = vec4<f32>(unpack2x16float(w[i]), unpack2x16float(w[i + 1u]));
    }
    return o;
}
