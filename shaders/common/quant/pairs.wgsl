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
// their bytes (`pair_chunks`, region `chunk_pairs` in ops/mul_mat_ks1i.wgsl).
struct PairChunks {
    lo: PairChunk,
    hi: PairChunk,
}

// Bytes 4k .. 4k + 3 of rows A and B from their word k (`a`, `b`): byte i of row A in
// the low half of component i, row B's in the high half, each in the half's low byte
// (the bits above it the next byte's, which the callers mask off).
fn pair_bytes(a: u32, b: u32) -> vec4<u32> {
    let lw = (a & 0xffffu) | (b << 16u);
    let hw = (a >> 16u) | (b & 0xffff0000u);
    return vec4<u32>(lw, lw >> 8u, hw, hw >> 8u);
}

// Word k's four quants of one row (one per byte) whose low four bits are the nibbles
// of `lo` at shift `sl` and whose bits above are the bits of `hi` at shift `sh` under
// `hmask` (Q5_K: one bit a byte, 0x01010101; Q6_K: two, 0x03030303).
fn high_quants(lo: u32, hi: u32, sl: u32, sh: u32, hmask: u32) -> u32 {
    return ((lo >> sl) & 0x0f0f0f0fu) | (((hi >> sh) & hmask) << 4u);
}

// Elements 4k .. 4k + 3 of rows A and B of `high_quants` (from their word k of
// nibbles, `la` and `lb`, and of high bits, `ha` and `hb`), less half their range (16
// for five bits, 32 for six), so that a field's sums stay within its 16 bits (each
// type's file says how many): row A's in the low field of component i, row B's in the
// high one. The borrow of a negative low field
// comes out of the high one, and `fields` gives both back.
fn high_pair_word(la: u32, ha: u32, lb: u32, hb: u32, sl: u32, sh: u32, hmask: u32) -> vec4<u32> {
    let m = ((hmask & 0xffu) << 4u) | 0x0fu;
    let a = high_quants(la, ha, sl, sh, hmask);
    let b = high_quants(lb, hb, sl, sh, hmask);
    return (pair_bytes(a, b) & vec4<u32>(m * 0x10001u)) - vec4<u32>((m + 1u) / 2u * 0x10001u);
}

// The packed quants of a chunk of rows A and B whose quants are `high_quants`: its
// eight words of `high_pair_word` (an array built whole, not a private array the
// driver would index lane by lane).
fn high_pair_q(la: array<u32, 8>, lb: array<u32, 8>, ha: array<u32, 8>, hb: array<u32, 8>, sl: u32, sh: u32, hmask: u32) -> array<vec4<u32>, 8> {
    return array<vec4<u32>, 8>(
        high_pair_word(la[0], ha[0], lb[0], hb[0], sl, sh, hmask),
        high_pair_word(la[1], ha[1], lb[1], hb[1], sl, sh, hmask),
        high_pair_word(la[2], ha[2], lb[2], hb[2], sl, sh, hmask),
        high_pair_word(la[3], ha[3], lb[3], hb[3], sl, sh, hmask),
        high_pair_word(la[4], ha[4], lb[4], hb[4], sl, sh, hmask),
        high_pair_word(la[5], ha[5], lb[5], hb[5], sl, sh, hmask),
        high_pair_word(la[6], ha[6], lb[6], hb[6], sl, sh, hmask),
        high_pair_word(la[7], ha[7], lb[7], hb[7], sl, sh, hmask),
    );
}

// The 32 nibbles of a Q4_0 / Q4_1 / Q5_x chunk of rows A and B (the 16 bytes `qa` and
// `qb`; element j is the low nibble of byte j, element j + 16 its high nibble) as
// packed fields 0 .. 15.
fn pair_nibbles(qa: vec4<u32>, qb: vec4<u32>) -> array<vec4<u32>, 8> {
    let m = vec4<u32>(0x000f000fu);
    let v0 = pair_bytes(qa.x, qb.x);
    let v1 = pair_bytes(qa.y, qb.y);
    let v2 = pair_bytes(qa.z, qb.z);
    let v3 = pair_bytes(qa.w, qb.w);
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
