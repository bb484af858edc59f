// Q5_K chunks of two rows for common/quant/pairs.wgsl: chunk c is sub-block c % 8 of
// its block, as Q4_K's (common/quant/q4_k_pairs.wgsl) with a fifth bit per quant (bit
// c % 8 of qh[j]); value dl q - ml. The fields hold the quants less 16 (16 products of
// 0 .. 31 would overflow them), which PAIR_OFF adds back; offset -ml.

const PAIR_OFF: f32 = 16.0;

// The packed quants of chunk c of both rows from their blocks' qh (`ha`, `hb`) and
// sub-block pair's nibbles (`qa`, `qb`), eight words each: the nibbles at shift
// 4 (c % 2), the fifth bit bit c % 8 of each qh byte (`high_pair_q` in pairs.wgsl).
fn k5_pair_q(qa: array<u32, 8>, qb: array<u32, 8>, ha: array<u32, 8>, hb: array<u32, 8>, c: u32) -> array<vec4<u32>, 8> {
    return high_pair_q(qa, qb, ha, hb, (c & 1u) * 4u, c & 7u, 0x01010101u);
}

fn pair_chunk(rb_a: u32, rb_b: u32, c: u32) -> PairChunk {
    let ba = q5k_block(rb_a, c);
    let bb = q5k_block(rb_b, c);
    let off = 3u + ((c & 7u) >> 1u) * 2u;
    let q = k5_pair_q(wq8(ba + off), wq8(bb + off), wq8(ba + 1u), wq8(bb + 1u), c);
    return PairChunk(q, vec4<f32>(k4_pair_dm(wq(ba), c), k4_pair_dm(wq(bb), c)));
}

// Chunks c and c + 1 (c even) of both rows: the low and high nibbles of the same 32
// bytes and bits c % 8 and c % 8 + 1 of the same qh, each loaded once, with one load of
// each block's header (region `chunk_pairs` in ops/mul_mat_ks1i.wgsl).
fn pair_chunks(rb_a: u32, rb_b: u32, c: u32) -> PairChunks {
    let ba = q5k_block(rb_a, c);
    let bb = q5k_block(rb_b, c);
    let off = 3u + ((c & 7u) >> 1u) * 2u;
    let qa = wq8(ba + off);
    let qb = wq8(bb + off);
    let ha = wq8(ba + 1u);
    let hb = wq8(bb + 1u);
    let hda = wq(ba);
    let hdb = wq(bb);
    return PairChunks(
        PairChunk(
            k5_pair_q(qa, qb, ha, hb, c),
            vec4<f32>(k4_pair_dm(hda, c), k4_pair_dm(hdb, c)),
        ),
        PairChunk(
            k5_pair_q(qa, qb, ha, hb, c + 1u),
            vec4<f32>(k4_pair_dm(hda, c + 1u), k4_pair_dm(hdb, c + 1u)),
        ),
    );
}
