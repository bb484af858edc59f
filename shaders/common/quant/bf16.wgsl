// BF16 weights: the upper half of an f32. A 32-element chunk is 64 bytes.

fn bf16x2(v: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(v << 16u, v & 0xffff0000u));
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let base = (row_byte + c * 64u) >> 2u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let i = base + k * 2u;
        o[k] = vec4<f32>(bf16x2(wu(i)), bf16x2(wu(i + 1u)));
    }
    return o;
}
