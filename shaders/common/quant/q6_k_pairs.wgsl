// Q6_K chunks of two rows for common/quant/pairs.wgsl: the fields hold the six-bit
// quants less 32, signed. A chunk is two sub-blocks of 16 with a scale each, so each
// half's fields are added apart (8 products of at most 32 x 127 per field, within its
// 16 bits), and `d` = (d sc_lo, d sc_hi) of row A, then of row B.

struct PairChunk {
    q: array<vec4<u32>, 8>,
    d: vec4<f32>,
}

// The packed quants of chunk s (of its block) of both rows, from their ql and qh
// words: the nibbles of ql at shift 4 ((s / 2) % 2), two bits of each qh byte at shift
// 2 (s % 4) (`high_pair_q` in pairs.wgsl).
fn q6k_pair_q(la: array<u32, 8>, lb: array<u32, 8>, ha: array<u32, 8>, hb: array<u32, 8>, s: u32) -> array<vec4<u32>, 8> {
    return high_pair_q(la, lb, ha, hb, ((s >> 1u) & 1u) * 4u, (s & 3u) * 2u, 0x03030303u);
}

// (d sc_lo, d sc_hi) of chunk s of a block, from the scales' word `sw` holding its two
// (scales 4 (s / 2) .. 4 (s / 2) + 3) and the block's d.
fn q6k_pair_d(sw: u32, s: u32, d: f32) -> vec2<f32> {
    return d * i8x4(sw >> ((s & 1u) * 16u)).xy;
}

fn pair_chunk(rb_a: u32, rb_b: u32, c: u32) -> PairChunk {
    let s = c & 7u;
    let n = s >> 2u;
    let ba = q6k_block(rb_a, c);
    let bb = q6k_block(rb_b, c);
    let ql = n * 4u + (s & 1u) * 2u;
    let qh = 8u + n * 2u;
    let q = q6k_pair_q(wq8(ba + ql), wq8(bb + ql), wq8(ba + qh), wq8(bb + qh), s);
    let sa = wu((ba + 12u) * 4u + (s >> 1u));
    let sb = wu((bb + 12u) * 4u + (s >> 1u));
    let d = vec4<f32>(q6k_pair_d(sa, s, q6k_d(rb_a, c)), q6k_pair_d(sb, s, q6k_d(rb_b, c)));
    return PairChunk(q, d);
}

// Chunks c and c + 1 (c even) of both rows: their qh bytes, their scales' word and the
// block's d are the same, each loaded once (region `chunk_pairs` in ops/mul_mat_ks1i.wgsl).
fn pair_chunks(rb_a: u32, rb_b: u32, c: u32) -> PairChunks {
    let s = c & 7u;
    let n = s >> 2u;
    let ba = q6k_block(rb_a, c);
    let bb = q6k_block(rb_b, c);
    let ha = wq8(ba + 8u + n * 2u);
    let hb = wq8(bb + 8u + n * 2u);
    let ql = n * 4u;
    let sa = wu((ba + 12u) * 4u + (s >> 1u));
    let sb = wu((bb + 12u) * 4u + (s >> 1u));
    let da = q6k_d(rb_a, c);
    let db = q6k_d(rb_b, c);
    return PairChunks(
        PairChunk(
            q6k_pair_q(wq8(ba + ql), wq8(bb + ql), ha, hb, s),
            vec4<f32>(q6k_pair_d(sa, s, da), q6k_pair_d(sb, s, db)),
        ),
        PairChunk(
            q6k_pair_q(wq8(ba + ql + 2u), wq8(bb + ql + 2u), ha, hb, s + 1u),
            vec4<f32>(q6k_pair_d(sa, s + 1u, da), q6k_pair_d(sb, s + 1u, db)),
        ),
    );
}

// Chunk `q` of two rows dotted with 8-bit activations `a`: the integer sums of the
// first half for rows A and B, then of the second half.
fn pair_dot_halves(q: array<vec4<u32>, 8>, a: array<vec4<u32>, 8>) -> vec4<f32> {
    let lo = q[0] * a[0] + q[1] * a[1] + q[2] * a[2] + q[3] * a[3];
    let hi = q[4] * a[4] + q[5] * a[5] + q[6] * a[6] + q[7] * a[7];
    return vec4<f32>(
        fields(lo.x + lo.y) + fields(lo.z + lo.w),
        fields(hi.x + hi.y) + fields(hi.z + hi.w),
    );
}

// The unpacked chunk `w` of rows A and B dotted with four tokens' slot s
// (ops/mul_mat_ks1i.wgsl): d_x (d sc_lo sum_lo q a + d sc_hi sum_hi q a) per row and
// token.
fn pair4_dot(w: PairChunk, s: QSlot4) -> Pair4 {
    let f0 = pair_dot_halves(w.q, s.a0);
    let f1 = pair_dot_halves(w.q, s.a1);
    let f2 = pair_dot_halves(w.q, s.a2);
    let f3 = pair_dot_halves(w.q, s.a3);
    let sd = s.on * s.d;
    let a = vec4<f32>(f0.x, f1.x, f2.x, f3.x) * w.d.x + vec4<f32>(f0.z, f1.z, f2.z, f3.z) * w.d.y;
    let b = vec4<f32>(f0.y, f1.y, f2.y, f3.y) * w.d.z + vec4<f32>(f0.w, f1.w, f2.w, f3.w) * w.d.w;
    return Pair4(a * sd, b * sd);
}
