// F32 weights: a 32-element chunk is 128 bytes.

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let base = (row_byte + c * 128u) >> 2u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let i = base + k * 4u;
        o[k] = bitcast<vec4<f32>>(vec4<u32>(wu(i), wu(i + 1u), wu(i + 2u), wu(i + 3u)));
    }
    return o;
}
