// Q3_K (ggml block_q3_K, 110 bytes): u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d.
// 256 values = 8 chunks of 32. Chunk s covers sub-blocks 2s and 2s + 1 (16 values
// each). Its value l has low bits 2(s % 4) of qs[32 (s / 4) + l] and third bit s of
// hmask[l] (clear means minus 4): q = (low | high << 2) - 4. Scale j (6 bits, stored
// +32) has its low nibble in byte j % 8 (nibble j / 8) and its top 2 bits at bits
// 2 (j / 4) of byte 8 + j % 4. value = d * (sc - 32) * q.
// 110 is not a multiple of 4: blocks start on even bytes, so reads straddle words.

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let s = c & 7u;
    let b = row_byte + (c >> 3u) * 110u;
    // Low nibbles of scales 2s, 2s + 1 and their top bits, as two bytes each.
    let lo = (w_u32(b + 96u + (s & 3u) * 2u) >> ((s >> 2u) * 4u)) & 0x0f0fu;
    let hi = (w_u32(b + 104u + (s & 1u) * 2u) >> ((s >> 1u) * 2u)) & 0x0303u;
    let sc = lo | (hi << 4u);
    let dl = w_f16(b + 108u) * (vec2<f32>(f32(sc & 0xffu), f32(sc >> 8u)) - 32.0);
    let hm = w_u32x8(b);
    let qs = w_u32x8(b + 32u + (s >> 2u) * 32u);
    let sh = (s & 3u) * 2u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let q = ((qs[k] >> sh) & 0x03030303u) | (((hm[k] >> s) & 0x01010101u) << 2u);
        o[k] = (u8x4(q) - 4.0) * select(dl.y, dl.x, k < 4u);
    }
    return o;
}
