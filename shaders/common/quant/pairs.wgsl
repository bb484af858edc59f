// Two rows' quants packed for integer dot products (`mul_mat_ks1i`): a u32 holds the
// same element of row A in its low 16 bits and of row B in its high 16 bits, so one
// 32-bit multiply by an 8-bit activation gives both rows' products, and one add
// accumulates both. A field's sum of 16 products of quants of at most 16 in magnitude
// (five bits less 16, or nibbles) by activations of at most 127 is at most 32512,
// within a signed 16-bit field, which `fields` relies on; so is one of 8 products of
// quants of at most 32 (Q6_K's six bits less 32).
//
// `pair_chunk(rb_a, rb_b, c)`, per type (common/quant/*_pairs.wgsl), gives chunk c of
// rows rb_a and rb_b (byte offsets) as a `PairChunk`, whose q[i] holds elements 4i ..
// 4i + 3 (the activations' vec4 i), and `pair4_dot` dots it with four tokens' slot:
// common/quant/pair_scale.wgsl for the types with one scale (and offset) per chunk and
// row, the type's own file otherwise.

// Chunks c and c + 1 (c even) of two rows, for the types whose neighbouring chunks share
// their bytes (`pair_chunks`, `CHUNK_PAIRS` in ops/mul_mat_ks1i.wgsl).
struct PairChunks {
    lo: PairChunk,
    hi: PairChunk,
}

// The 32 nibbles of a Q4_0 / Q4_1 / Q5_x chunk of rows A and B (the 16 bytes `qa` and
// `qb`; element j is the low nibble of byte j, element j + 16 its high nibble) as
// packed fields 0 .. 15.
fn pair_nibbles(qa: vec4<u32>, qb: vec4<u32>) -> array<vec4<u32>, 8> {
    let m = vec4<u32>(0x000f000fu);
    // Bytes 0 and 1 of each word of both rows, then bytes 2 and 3.
    let lw = (qa & vec4<u32>(0xffffu)) | (qb << vec4<u32>(16u));
    let hw = (qa >> vec4<u32>(16u)) | (qb & vec4<u32>(0xffff0000u));
    let v0 = vec4<u32>(lw.x, lw.x >> 8u, hw.x, hw.x >> 8u);
    let v1 = vec4<u32>(lw.y, lw.y >> 8u, hw.y, hw.y >> 8u);
    let v2 = vec4<u32>(lw.z, lw.z >> 8u, hw.z, hw.z >> 8u);
    let v3 = vec4<u32>(lw.w, lw.w >> 8u, hw.w, hw.w >> 8u);
    let f = vec4<u32>(4u);
    return array<vec4<u32>, 8>(
        v0 & m, v1 & m, v2 & m, v3 & m,
        (v0 >> f) & m, (v1 >> f) & m, (v2 >> f) & m, (v3 >> f) & m,
    );
}

// Five-bit quants of rows A and B less 16 (Q5_0 / Q5_1), signed in their fields: the
// nibbles, less 16 where element j's fifth bit (bit j of `qha` / `qhb`) is clear. The
// complemented bits reach bit 4 of each field by one shift per element and a mask.
fn pair_q5(qa: vec4<u32>, qb: vec4<u32>, qha: u32, qhb: u32) -> array<vec4<u32>, 8> {
    let n = pair_nibbles(qa, qb);
    let m = vec4<u32>(0x00100010u);
    // Elements 0 .. 15 of both rows (row A's in bits 0 .. 15), then 16 .. 31.
    let lo = vec4<u32>(~((qha & 0xffffu) | (qhb << 16u)));
    let hi = vec4<u32>(~((qha >> 16u) | (qhb & 0xffff0000u)));
    // Element 4k + i's bit sits at 4k + i: shifting right by 4k - 4 + i takes it to bit
    // 4, and for k = 0 the bits are first moved up by 4.
    let i = vec4<u32>(0u, 1u, 2u, 3u);
    let up = vec4<u32>(4u);
    return array<vec4<u32>, 8>(
        n[0] - (((lo << up) >> i) & m),
        n[1] - ((lo >> i) & m),
        n[2] - ((lo >> (i + 4u)) & m),
        n[3] - ((lo >> (i + 8u)) & m),
        n[4] - (((hi << up) >> i) & m),
        n[5] - ((hi >> i) & m),
        n[6] - ((hi >> (i + 4u)) & m),
        n[7] - ((hi >> (i + 8u)) & m),
    );
}

// A packed sum of at most 16 products per field as the two fields' signed values:
// the low field is the sign-extended low half, and what is left is the high field
// times 65536 exactly.
fn fields(s: u32) -> vec2<f32> {
    let lo = bitcast<i32>(s << 16u) >> 16u;
    let hi = (bitcast<i32>(s) - lo) >> 16u;
    return vec2<f32>(f32(lo), f32(hi));
}
