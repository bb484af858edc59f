// Q4_K (ggml block_q4_K, 144 bytes): f16 d; f16 dmin; u8 scales[12]; u8 qs[128].
// 256 values = 8 sub-blocks of 32, one per chunk. Sub-block s has a 6-bit scale and
// min packed in `scales` (ggml get_scale_min_k4); its quant l is the low (s even) or
// high (s odd) nibble of qs[32 (s / 2) + l]. value = d * sc * q - dmin * m.
// 144 is 9 x 16 and rows are whole blocks, so every block is 16-byte aligned: the
// header (d, dmin, scales) is one vec4 and a sub-block pair's nibbles two more.
// `k4_scale_min` is in k4_scales.wgsl, shared with Q5_K.

// vec4 index of the block holding chunk c (8 chunks per block).
fn q4k_block(row_byte: u32, c: u32) -> u32 {
    return (row_byte + (c >> 3u) * 144u) >> 4u;
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let s = c & 7u;
    let bq = q4k_block(row_byte, c);
    let h = wq(bq);
    let dm = unpack2x16float(h.x);
    let sm = k4_scale_min(h.y, h.z, h.w, s);
    let dl = dm.x * sm.x;
    let ml = dm.y * sm.y;
    let q = wq8(bq + 1u + (s >> 1u) * 2u);
    let sh = (s & 1u) * 4u;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        o[k] = u8x4((q[k] >> sh) & 0x0f0f0f0fu) * dl - ml;
    }
    return o;
}

// sum_j (dl q_j - ml) x_j = dl sum_j q_j x_j - ml xs, on activations from `x_pre`, the
// nibbles read in place (common/bytes.wgsl): the low ones of an even chunk, the high
// ones of an odd chunk, whose top one is shifted down to bit 24 like the low one (hence
// `PLACE_HI4K`).
const PLACE_HI4K = vec4<f32>(1.0 / 16.0, 1.0 / 4096.0, 1.0 / 1048576.0, 1.0 / 16777216.0);

fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return x_times(xc, select(PLACE_LO4, PLACE_HI4K, (c & 1u) == 1u));
}

// The low (sh 0) or high (sh 4) nibbles of the four bytes of `v`, in place.
fn k4_placed(v: u32, sh: u32) -> vec4<f32> {
    let m = vec3<u32>(0xfu, 0xf00u, 0xf0000u) << vec3<u32>(sh);
    return vec4<f32>(vec4<i32>(vec4<u32>(v & m.x, v & m.y, v & m.z, (v >> sh) & 0xf000000u)));
}

fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let s = c & 7u;
    let bq = q4k_block(row_byte, c);
    let h = wq(bq);
    let dm = unpack2x16float(h.x);
    let sm = k4_scale_min(h.y, h.z, h.w, s);
    let q = wq8(bq + 1u + (s >> 1u) * 2u);
    let sh = (s & 1u) * 4u;
    var acc = 0.0;
    for (var k = 0u; k < 8u; k++) {
        acc += dot(k4_placed(q[k], sh), xp[k]);
    }
    return dm.x * sm.x * acc - dm.y * sm.y * xs;
}

// Chunks 2 c2 and 2 c2 + 1 are the low and high nibbles of the same 32 bytes: one
// load of them, the header and the scales serves both (`wdot64_blk`, and `wdot64_pre`
// in dot64_block.wgsl). A lane whose run of chunk pairs lies in one block reads the
// block's part once per row (the walk `kblock` in ops/mul_mat_ks1.wgsl): the header texel (d,
// dmin, scales).
struct KBlock {
    h: vec4<u32>,
}

fn k_block(row_byte: u32, c: u32) -> KBlock {
    return KBlock(wq(q4k_block(row_byte, c)));
}

// `wdot64_pre` with the block's header from `blk`.
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
    let bq = q4k_block(row_byte, 2u * c2);
    let h = blk.h;
    let dm = unpack2x16float(h.x);
    let ma = k4_scale_min(h.y, h.z, h.w, s);
    let mb = k4_scale_min(h.y, h.z, h.w, s + 1u);
    let q = wq8(bq + 1u + (s >> 1u) * 2u);
    var a = 0.0;
    var b = 0.0;
    for (var k = 0u; k < 8u; k++) {
        a += dot(k4_placed(q[k], 0u), xa[k]);
        b += dot(k4_placed(q[k], 4u), xb[k]);
    }
    return dm.x * (ma.x * a + mb.x * b) - dm.y * (ma.y * sa + mb.y * sb);
}
