// Q2_K (ggml block_q2_K, 84 bytes): u8 scales[16]; u8 qs[64]; f16 d; f16 dmin.
// 256 values = 8 chunks of 32. Chunk s covers sub-blocks 2s and 2s + 1 (16 values each,
// scale in the low nibble of scales[j], min in the high); its quant l is bits 2(s % 4)
// of qs[32 (s / 4) + l]. value = d * sc * q - dmin * m.
// 84 is a multiple of 4, so every block is word aligned and read with plain loads.

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let s = c & 7u;
    let bw = (row_byte + (c >> 3u) * 84u) >> 2u;
    let dm = unpack2x16float(wu(bw + 20u));
    // The two scale bytes of this chunk, 2s and 2s + 1.
    let sc = (wu(bw + (s >> 1u)) >> ((s & 1u) * 16u)) & 0xffffu;
    let dl = dm.x * vec2<f32>(f32(sc & 0xfu), f32((sc >> 8u) & 0xfu));
    let ml = dm.y * vec2<f32>(f32((sc >> 4u) & 0xfu), f32(sc >> 12u));
    let qw = bw + 4u + (s >> 2u) * 8u;
    let sh = (s & 3u) * 2u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        o[k] = u8x4((wu(qw + k) >> sh) & 0x03030303u) * dl.x - ml.x;
        o[k + 4u] = u8x4((wu(qw + 4u + k) >> sh) & 0x03030303u) * dl.y - ml.y;
    }
    return o;
}
