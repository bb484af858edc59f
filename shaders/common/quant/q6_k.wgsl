// Q6_K (ggml block_q6_K, 210 bytes): u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d.
// 256 values = two halves of 128 = 8 chunks of 32. Chunk s (half n = s / 4) covers
// sub-blocks 2s and 2s + 1 (16 values each). Its value l has low nibble
// (s / 2) % 2 of ql[64 n + 32 (s % 2) + l] and high bits 2 (s % 4) of qh[32 n + l]:
// q = (low | high << 4) - 32. value = d * scales[j] * q.
// 210 is not a multiple of 4: blocks start on even bytes, so reads straddle words.

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let s = c & 7u;
    let n = s >> 2u;
    let b = row_byte + (c >> 3u) * 210u;
    let sc = i8x4(w_u32(b + 192u + s * 2u));
    let dl = w_f16(b + 208u) * sc.xy;
    let ql = w_u32x8(b + n * 64u + (s & 1u) * 32u);
    let qh = w_u32x8(b + 128u + n * 32u);
    let sl = ((s >> 1u) & 1u) * 4u;
    let sh = (s & 3u) * 2u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let q = ((ql[k] >> sl) & 0x0f0f0f0fu) | (((qh[k] >> sh) & 0x03030303u) << 4u);
        o[k] = (u8x4(q) - 32.0) * select(dl.y, dl.x, k < 4u);
    }
    return o;
}

// Per 16-value half h of the chunk: d sc_h sum_j (q_j - 32) x_j
// = d sc_h (sum_j q_j x_j - 32 xs_h).
fn wdot32(row_byte: u32, c: u32, xc: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let s = c & 7u;
    let n = s >> 2u;
    let b = row_byte + (c >> 3u) * 210u;
    let sc = i8x4(w_u32(b + 192u + s * 2u));
    let ql = w_u32x8(b + n * 64u + (s & 1u) * 32u);
    let qh = w_u32x8(b + 128u + n * 32u);
    let sl = ((s >> 1u) & 1u) * 4u;
    let sh = (s & 3u) * 2u;
    var a = vec2<f32>();
    for (var k = 0u; k < 8u; k++) {
        let q = ((ql[k] >> sl) & 0x0f0f0f0fu) | (((qh[k] >> sh) & 0x03030303u) << 4u);
        let v = dot(u8x4(q), xc[k]);
        a += select(vec2<f32>(0.0, v), vec2<f32>(v, 0.0), k < 4u);
    }
    let x4 = xc[0] + xc[1] + xc[2] + xc[3];
    let xs0 = x4.x + x4.y + x4.z + x4.w;
    let xh = vec2<f32>(xs0, xs - xs0);
    return w_f16(b + 208u) * dot(sc.xy, a - 32.0 * xh);
}
