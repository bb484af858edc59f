// Q5_K (ggml block_q5_K, 176 bytes): f16 d; f16 dmin; u8 scales[12]; u8 qh[32];
// u8 qs[128]. Scales and low nibbles as Q4_K; the fifth bit of value l of sub-block s
// is bit s of qh[l]. value = d * sc * q - dmin * m.
// 176 is 11 x 16 and rows are whole blocks, so every block is 16-byte aligned: the
// header (d, dmin, scales) is one vec4, qh two more and a sub-block pair's nibbles two.
// `k4_scale_min` is in k4_scales.wgsl, shared with Q4_K.

// vec4 index of the block holding chunk c (8 chunks per block).
fn q5k_block(row_byte: u32, c: u32) -> u32 {
    return (row_byte + (c >> 3u) * 176u) >> 4u;
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let s = c & 7u;
    let bq = q5k_block(row_byte, c);
    let hd = wq(bq);
    let dm = unpack2x16float(hd.x);
    let sm = k4_scale_min(hd.y, hd.z, hd.w, s);
    let dl = dm.x * sm.x;
    let ml = dm.y * sm.y;
    let qh = wq8(bq + 1u);
    let qs = wq8(bq + 3u + (s >> 1u) * 2u);
    let sh = (s & 1u) * 4u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let q = ((qs[k] >> sh) & 0x0f0f0f0fu) | (((qh[k] >> s) & 0x01010101u) << 4u);
        o[k] = u8x4(q) * dl - ml;
    }
    return o;
}

// sum_j (dl q_j - ml) x_j = dl sum_j q_j x_j - ml xs, on activations from `x_pre`, the
// five-bit quants read in place in their bytes (common/bytes.wgsl).
fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return x_times(xc, PLACE_BYTES);
}

fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let s = c & 7u;
    let bq = q5k_block(row_byte, c);
    let hd = wq(bq);
    let dm = unpack2x16float(hd.x);
    let sm = k4_scale_min(hd.y, hd.z, hd.w, s);
    let qh = wq8(bq + 1u);
    let qs = wq8(bq + 3u + (s >> 1u) * 2u);
    let sh = (s & 1u) * 4u;
    var acc = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let q = ((qs[k] >> sh) & 0x0f0f0f0fu) | (((qh[k] >> s) & 0x01010101u) << 4u);
        acc += dot(bytes_placed(q), xp[k]);
    }
    return dm.x * sm.x * acc - dm.y * sm.y * xs;
}

// Chunks 2 c2 and 2 c2 + 1 share their 32 bytes of nibbles and the fifth-bit words:
// one load of them, the header and the scales serves both (`wdot64_blk`, and
// `wdot64_pre` in dot64_block.wgsl). A lane whose run of chunk pairs lies in one block
// reads the block's part once per row (the walk `kblock` in ops/mul_mat_ks1.wgsl): the header
// texel (d, dmin, scales) and the fifth bits' 32 bytes, which all its chunks share.
struct KBlock {
    h: vec4<u32>,
    qh: array<u32, 8>,
}

fn k_block(row_byte: u32, c: u32) -> KBlock {
    let bq = q5k_block(row_byte, c);
    return KBlock(wq(bq), wq8(bq + 1u));
}

// `wdot64_pre` with the block's header and fifth bits from `blk`.
fn wdot64_blk(
    row_byte: u32,
    c2: u32,
    blk: KBlock,
    xa: array<vec4<f32>, 8>,
    xb: array<vec4<f32>, 8>,
    sa: f32,
    sb: f32,
) -> f32 {
    let s = (2u * c2) & 7u;
    let bq = q5k_block(row_byte, 2u * c2);
    let hd = blk.h;
    let dm = unpack2x16float(hd.x);
    let ma = k4_scale_min(hd.y, hd.z, hd.w, s);
    let mb = k4_scale_min(hd.y, hd.z, hd.w, s + 1u);
    let qs = wq8(bq + 3u + (s >> 1u) * 2u);
    var a = 0.0;
    var b = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let q = qs[k];
        let h = blk.qh[k] >> s;
        a += dot(bytes_placed((q & 0x0f0f0f0fu) | ((h & 0x01010101u) << 4u)), xa[k]);
        b += dot(bytes_placed(((q >> 4u) & 0x0f0f0f0fu) | ((h & 0x02020202u) << 3u)), xb[k]);
    }
    return dm.x * (ma.x * a + mb.x * b) - dm.y * (ma.y * sa + mb.y * sb);
}
