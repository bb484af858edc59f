// Q4_K chunks of two rows for common/quant/pairs.wgsl: chunk c is sub-block c % 8 of
// its block, whose quant j is the low (even c) or high (odd c) nibble of byte j of the
// sub-block pair's 32 bytes, and whose value is dl q - ml (dl = d x its 6-bit scale, ml
// = dmin x its 6-bit min): quants 0 .. 15, offset -ml.

const PAIR_OFF: f32 = 0.0;

// Elements 4k .. 4k + 3 of both rows from word k of each (`a`, `b`, already shifted so
// that the chunk's nibbles are the low ones of their bytes): byte i's nibble of row A in
// the low field of component i, row B's in the high field.
fn k4_pair_word(a: u32, b: u32) -> vec4<u32> {
    return pair_bytes(a, b) & vec4<u32>(0x000f000fu);
}

fn pair_chunk(rb_a: u32, rb_b: u32, c: u32) -> PairChunk {
    let ba = q4k_block(rb_a, c);
    let bb = q4k_block(rb_b, c);
    let off = 1u + ((c & 7u) >> 1u) * 2u;
    let sh = vec4<u32>((c & 1u) * 4u);
    let a0 = wq(ba + off) >> sh;
    let a1 = wq(ba + off + 1u) >> sh;
    let b0 = wq(bb + off) >> sh;
    let b1 = wq(bb + off + 1u) >> sh;
    let q = array<vec4<u32>, 8>(
        k4_pair_word(a0.x, b0.x), k4_pair_word(a0.y, b0.y),
        k4_pair_word(a0.z, b0.z), k4_pair_word(a0.w, b0.w),
        k4_pair_word(a1.x, b1.x), k4_pair_word(a1.y, b1.y),
        k4_pair_word(a1.z, b1.z), k4_pair_word(a1.w, b1.w),
    );
    return PairChunk(q, vec4<f32>(k4_pair_dm(wq(ba), c), k4_pair_dm(wq(bb), c)));
}

// Chunks c and c + 1 (c even) of both rows: the low and high nibbles of the same 32
// bytes, loaded once, with one load of each block's header (region `chunk_pairs` in
// ops/mul_mat_ks1i.wgsl).
fn pair_chunks(rb_a: u32, rb_b: u32, c: u32) -> PairChunks {
    let ba = q4k_block(rb_a, c);
    let bb = q4k_block(rb_b, c);
    let off = 1u + ((c & 7u) >> 1u) * 2u;
    let a0 = wq(ba + off);
    let a1 = wq(ba + off + 1u);
    let b0 = wq(bb + off);
    let b1 = wq(bb + off + 1u);
    let f = vec4<u32>(4u);
    let c0 = a0 >> f;
    let c1 = a1 >> f;
    let d0 = b0 >> f;
    let d1 = b1 >> f;
    let lo = array<vec4<u32>, 8>(
        k4_pair_word(a0.x, b0.x), k4_pair_word(a0.y, b0.y),
        k4_pair_word(a0.z, b0.z), k4_pair_word(a0.w, b0.w),
        k4_pair_word(a1.x, b1.x), k4_pair_word(a1.y, b1.y),
        k4_pair_word(a1.z, b1.z), k4_pair_word(a1.w, b1.w),
    );
    let hi = array<vec4<u32>, 8>(
        k4_pair_word(c0.x, d0.x), k4_pair_word(c0.y, d0.y),
        k4_pair_word(c0.z, d0.z), k4_pair_word(c0.w, d0.w),
        k4_pair_word(c1.x, d1.x), k4_pair_word(c1.y, d1.y),
        k4_pair_word(c1.z, d1.z), k4_pair_word(c1.w, d1.w),
    );
    let ha = wq(ba);
    let hb = wq(bb);
    return PairChunks(
        PairChunk(lo, vec4<f32>(k4_pair_dm(ha, c), k4_pair_dm(hb, c))),
        PairChunk(hi, vec4<f32>(k4_pair_dm(ha, c + 1u), k4_pair_dm(hb, c + 1u))),
    );
}
