// F16 weights: a 32-element chunk is 64 bytes, four aligned vec4s (rows are whole
// chunks, so every chunk starts on a 16-byte boundary).

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let base = (row_byte >> 4u) + c * 4u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let v = wq(base + k);
        o[2u * k] = vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
        o[2u * k + 1u] = vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w));
    }
    return o;
}
