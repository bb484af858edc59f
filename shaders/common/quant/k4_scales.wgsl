// The 6-bit scales and mins of Q4_K and Q5_K blocks (ggml get_scale_min_k4): 12 bytes
// after the block's f16 d and dmin, read as three words.

// (scale, min) of sub-block s from the three words of `scales`, without branches:
// s < 4 keeps the low 6 bits of bytes s and s + 4; s >= 4 joins a nibble of byte s + 4
// with the top 2 bits of bytes s - 4 (scale) and s (min).
fn k4_scale_min(s0: u32, s1: u32, s2: u32, s: u32) -> vec2<f32> {
    let lo = vec2<u32>(s0, s1) & vec2<u32>(0x3f3f3f3fu);
    let hi = (vec2<u32>(s2, s2 >> 4u) & vec2<u32>(0x0f0f0f0fu))
        | (((vec2<u32>(s0, s1) >> vec2<u32>(6u)) & vec2<u32>(0x03030303u)) << vec2<u32>(4u));
    let v = select(hi, lo, s < 4u);
    return vec2<f32>((v >> vec2<u32>((s & 3u) * 8u)) & vec2<u32>(0xffu));
}

// (dl, -ml) of chunk c (sub-block c % 8), from its block's header texel `h` (f16 d and
// dmin, then the scales' three words): a chunk's scale and offset for
// `mul_mat_ks1i`'s pairs (common/quant/q4_k_pairs.wgsl, q5_k_pairs.wgsl).
fn k4_pair_dm(h: vec4<u32>, c: u32) -> vec2<f32> {
    let dm = unpack2x16float(h.x);
    let sm = k4_scale_min(h.y, h.z, h.w, c & 7u);
    return vec2<f32>(dm.x * sm.x, -dm.y * sm.y);
}
