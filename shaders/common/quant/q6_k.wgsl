// Q6_K (ggml block_q6_K, 210 bytes): u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d.
// 256 values = two halves of 128 = 8 chunks of 32. Chunk s (half n = s / 4) covers
// sub-blocks 2s and 2s + 1 (16 values each). Its value l has low nibble
// (s / 2) % 2 of ql[64 n + 32 (s % 2) + l] and high bits 2 (s % 4) of qh[32 n + l]:
// q = (low | high << 4) - 32. value = d * scales[j] * q.
// Planar rows (src/gpu/layout.rs): every block's first 208 bytes (ql, qh, scales: 13
// aligned vec4s), then every block's d.

// vec4 index of the block holding chunk c, and the block's d.
fn q6k_block(row_byte: u32, c: u32) -> u32 {
    return (row_byte >> 4u) + (c >> 3u) * 13u;
}

fn q6k_d(row_byte: u32, c: u32) -> f32 {
    return w_f16(plane(row_byte, 256u, 208u) + (c >> 3u) * 2u);
}

// The chunk's 32 six-bit quants (before the -32), four per word, and its two scales.
struct Q6Chunk {
    q: array<u32, 8>,
    sc: vec2<f32>,
}

fn q6k_chunk(row_byte: u32, c: u32) -> Q6Chunk {
    let s = c & 7u;
    let n = s >> 2u;
    let bq = q6k_block(row_byte, c);
    let ql = wq8(bq + n * 4u + (s & 1u) * 2u);
    let qh = wq8(bq + 8u + n * 2u);
    // scales[2s], scales[2s + 1]: half of word s / 2 of the scales' vec4 (vec4 12).
    let sw = wu((bq + 12u) * 4u + (s >> 1u)) >> ((s & 1u) * 16u);
    let sl = ((s >> 1u) & 1u) * 4u;
    let sh = (s & 3u) * 2u;
    var o: Q6Chunk;
    for (var k = 0u; k < 8u; k++) {
        o.q[k] = ((ql[k] >> sl) & 0x0f0f0f0fu) | (((qh[k] >> sh) & 0x03030303u) << 4u);
    }
    o.sc = i8x4(sw).xy;
    return o;
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let ch = q6k_chunk(row_byte, c);
    let dl = q6k_d(row_byte, c) * ch.sc;
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        o[k] = (u8x4(ch.q[k]) - 32.0) * select(dl.y, dl.x, k < 4u);
    }
    return o;
}

// The six-bit quants read in place in their bytes (common/bytes.wgsl).
fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return x_times(xc, PLACE_BYTES);
}

// Per 16-value half h of the chunk: d sc_h sum_j (q_j - 32) x_j
// = d sc_h (sum_j q_j x_j - 32 xs_h), on activations from `x_pre`.
fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let s = c & 7u;
    let n = s >> 2u;
    let bq = q6k_block(row_byte, c);
    let ql = wq8(bq + n * 4u + (s & 1u) * 2u);
    let qh = wq8(bq + 8u + n * 2u);
    let a = q6k_halves(ql, qh, ((s >> 1u) & 1u) * 4u, (s & 3u) * 2u, xp);
    let sc = i8x4(wu((bq + 12u) * 4u + (s >> 1u)) >> ((s & 1u) * 16u)).xy;
    return q6k_d(row_byte, c) * dot(sc, q6k_centre(a, xp, xs));
}

// sum_j q_j x_j over each 16-value half of a chunk, its quants taken from its low-bit
// words `ql` (nibble at sl) and high-bit words `qh` (bits at sh); activations from
// `x_pre`.
fn q6k_halves(
    ql: array<u32, 8>,
    qh: array<u32, 8>,
    sl: u32,
    sh: u32,
    xp: array<vec4<f32>, 8>,
) -> vec2<f32> {
    var a = vec2<f32>();
    for (var k = 0u; k < 8u; k++) {
        let q = ((ql[k] >> sl) & 0x0f0f0f0fu) | (((qh[k] >> sh) & 0x03030303u) << 4u);
        let v = dot(bytes_placed(q), xp[k]);
        a += select(vec2<f32>(0.0, v), vec2<f32>(v, 0.0), k < 4u);
    }
    return a;
}

// The halves' sums of (q_j - 32) x_j from those of q_j x_j (`a`): minus 32 times each
// half's activation sum (`xs` the chunk's; the first half's from the activations
// `x_pre` left, scaled back exactly, by powers of two).
fn q6k_centre(a: vec2<f32>, xp: array<vec4<f32>, 8>, xs: f32) -> vec2<f32> {
    let x4 = (xp[0] + xp[1] + xp[2] + xp[3]) / PLACE_BYTES;
    let xs0 = x4.x + x4.y + x4.z + x4.w;
    return a - 32.0 * vec2<f32>(xs0, xs - xs0);
}

// Chunks s and s + 1 (s even) share their high bits' words, their scales' word and d:
// loaded once, the pair takes 6 vec4 loads and 2 words instead of 8 and 4
// (`wdot64_blk`, and `wdot64_pre` in dot64_block.wgsl). A lane whose run of chunk
// pairs lies in one block reads the block's part once per row (the walk `kblock` in
// ops/mul_mat_ks1.wgsl): the texel of the block's sixteen scales, and d.
struct KBlock {
    sc: vec4<u32>,
    d: f32,
}

fn k_block(row_byte: u32, c: u32) -> KBlock {
    return KBlock(wq(q6k_block(row_byte, c) + 12u), q6k_d(row_byte, c));
}

// Pair c2's dot, its scales and d from `blk`. Activations from `x_pre`.
fn wdot64_blk(
    row_byte: u32,
    c2: u32,
    blk: KBlock,
    xa: array<vec4<f32>, 8>,
    xb: array<vec4<f32>, 8>,
    sa: f32,
    sb: f32,
) -> f32 {
    let c = 2u * c2;
    let s = c & 7u;
    let n = s >> 2u;
    let bq = q6k_block(row_byte, c);
    let la = wq8(bq + n * 4u);
    let lb = wq8(bq + n * 4u + 2u);
    let qh = wq8(bq + 8u + n * 2u);
    // scales[2s .. 2s + 3]: chunk s's two, then chunk s + 1's.
    let sc = i8x4(blk.sc[s >> 1u]);
    let sl = ((s >> 1u) & 1u) * 4u;
    let sh = (s & 3u) * 2u;
    let a = q6k_halves(la, qh, sl, sh, xa);
    let b = q6k_halves(lb, qh, sl, sh + 2u, xb);
    let ha = q6k_centre(a, xa, sa);
    let hb = q6k_centre(b, xb, sb);
    return blk.d * (dot(sc.xy, ha) + dot(sc.zw, hb));
}
