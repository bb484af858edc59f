// Q5_K (ggml block_q5_K, 176 bytes): f16 d; f16 dmin; u8 scales[12]; u8 qh[32];
// u8 qs[128]. Scales and low nibbles as Q4_K; the fifth bit of value l of sub-block s
// is bit s of qh[l]. value = d * sc * q - dmin * m.
// 176 is a multiple of 4, so every block is word aligned and read with plain loads.
// `k4_scale_min` is in k4_scales.wgsl, shared with Q4_K.

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let s = c & 7u;
    let bw = (row_byte + (c >> 3u) * 176u) >> 2u;
    let dm = unpack2x16float(w[bw]);
    let sm = k4_scale_min(w[bw + 1u], w[bw + 2u], w[bw + 3u], s);
    let dl = dm.x * sm.x;
    let ml = dm.y * sm.y;
    let hw = bw + 4u;
    let qw = bw + 12u + (s >> 1u) * 8u;
    let sh = (s & 1u) * 4u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let q = ((w[qw + k] >> sh) & 0x0f0f0f0fu) | (((w[hw + k] >> s) & 0x01010101u) << 4u);
        o[k] = u8x4(q) * dl - ml;
    }
    return o;
}

// sum_j (dl q_j - ml) x_j = dl sum_j q_j x_j - ml xs.
fn wdot32(row_byte: u32, c: u32, xc: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let s = c & 7u;
    let bw = (row_byte + (c >> 3u) * 176u) >> 2u;
    let dm = unpack2x16float(w[bw]);
    let sm = k4_scale_min(w[bw + 1u], w[bw + 2u], w[bw + 3u], s);
    let hw = bw + 4u;
    let qw = bw + 12u + (s >> 1u) * 8u;
    let sh = (s & 1u) * 4u;
    var acc = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let q = ((w[qw + k] >> sh) & 0x0f0f0f0fu) | (((w[hw + k] >> s) & 0x01010101u) << 4u);
        acc += dot(u8x4(q), xc[k]);
    }
    return dm.x * sm.x * acc - dm.y * sm.y * xs;
}

// Chunks 2 c2 and 2 c2 + 1 share their 32 bytes of nibbles and the fifth-bit words:
// one load of them, the header and the scales serves both.
fn wdot64(
    row_byte: u32,
    c2: u32,
    xa: array<vec4<f32>, 8>,
    xb: array<vec4<f32>, 8>,
    sa: f32,
    sb: f32,
) -> f32 {
    let s = (2u * c2) & 7u;
    let bw = (row_byte + (c2 >> 2u) * 176u) >> 2u;
    let dm = unpack2x16float(w[bw]);
    let s0 = w[bw + 1u];
    let s1 = w[bw + 2u];
    let s2 = w[bw + 3u];
    let ma = k4_scale_min(s0, s1, s2, s);
    let mb = k4_scale_min(s0, s1, s2, s + 1u);
    let hw = bw + 4u;
    let qw = bw + 12u + (s >> 1u) * 8u;
    var a = 0.0;
    var b = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let q = w[qw + k];
        let h = w[hw + k] >> s;
        a += dot(u8x4((q & 0x0f0f0f0fu) | ((h & 0x01010101u) << 4u)), xa[k]);
        b += dot(u8x4(((q >> 4u) & 0x0f0f0f0fu) | ((h & 0x02020202u) << 3u)), xb[k]);
    }
    return dm.x * (ma.x * a + mb.x * b) - dm.y * (ma.y * sa + mb.y * sb);
}
