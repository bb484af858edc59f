// Two rows' quants packed for integer dot products (`mul_mat_ks1i`): a u32 holds the
// same element of row A in its low 16 bits and of row B in its high 16 bits, so one
// 32-bit multiply by an 8-bit activation gives both rows' products, and one add
// accumulates both. A field's sum of 16 products of quants of at most 16 in magnitude
// (five bits less 16, or nibbles) by activations of at most 127 is at most 32512,
// within a signed 16-bit field, which `fields` relies on.
//
// `pair_chunk(rb_a, rb_b, c)`, per type (common/quant/*_pairs.wgsl), gives chunk c of
// rows rb_a and rb_b (byte offsets): q[i] holds elements 4i .. 4i + 3 (the activations'
// vec4 i), and dm = (d_a, m_a, d_b, m_b), so that element j of row X is
// d_X (q_j + PAIR_OFF) + m_X.

struct PairChunk {
    q: array<vec4<u32>, 8>,
    dm: vec4<f32>,
}

// The 32 nibbles of a Q4_0 / Q4_1 / Q5_x chunk of rows A and B (the 16 bytes `qa` and
// `qb`; element j is the low nibble of byte j, element j + 16 its high nibble) as
// packed fields 0 .. 15.
fn pair_nibbles(qa: vec4<u32>, qb: vec4<u32>) -> array<vec4<u32>, 8> {
    let m = vec4<u32>(0x000f000fu);
    var o: array<vec4<u32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        // Bytes 0 and 1 of word k of both rows, then bytes 2 and 3.
        let lw = (qa[k] & 0xffffu) | (qb[k] << 16u);
        let hw = (qa[k] >> 16u) | (qb[k] & 0xffff0000u);
        let v = vec4<u32>(lw, lw >> 8u, hw, hw >> 8u);
        o[k] = v & m;
        o[k + 4u] = (v >> vec4<u32>(4u)) & m;
    }
    return o;
}

// Five-bit quants of rows A and B less 16 (Q5_0 / Q5_1), signed in their fields: the
// nibbles, less 16 where element j's fifth bit (bit j of `qha` / `qhb`) is clear. The
// complemented bits reach bit 4 of each field by one shift per element and a mask.
fn pair_q5(qa: vec4<u32>, qb: vec4<u32>, qha: u32, qhb: u32) -> array<vec4<u32>, 8> {
    let n = pair_nibbles(qa, qb);
    let m = vec4<u32>(0x00100010u);
    // Elements 0 .. 15 of both rows (row A's in bits 0 .. 15), then 16 .. 31.
    let lo = ~((qha & 0xffffu) | (qhb << 16u));
    let hi = ~((qha >> 16u) | (qhb & 0xffff0000u));
    var o: array<vec4<u32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        // Element 4k + i's bit sits at 4k + i, or at 4 + i once moved up by 4 for k = 0:
        // shifting right by 4k - 4 + i (by i for k = 0) takes it to bit 4.
        let up = select(0u, 4u, k == 0u);
        let sh = vec4<u32>(4u * max(k, 1u) - 4u) + vec4<u32>(0u, 1u, 2u, 3u);
        o[k] = n[k] - ((vec4<u32>(lo << up) >> sh) & m);
        o[k + 4u] = n[k + 4u] - ((vec4<u32>(hi << up) >> sh) & m);
    }
    return o;
}

// A packed sum of at most 16 products per field as the two fields' signed values:
// the low field is the sign-extended low half, and what is left is the high field
// times 65536 exactly.
fn fields(s: u32) -> vec2<f32> {
    let lo = bitcast<i32>(s << 16u) >> 16u;
    let hi = (bitcast<i32>(s) - lo) >> 16u;
    return vec2<f32>(f32(lo), f32(hi));
}

// Chunk `q` of two rows dotted with a chunk of 8-bit activations `a` (as u32s): the
// integer sums for rows A and B. Each of acc's components takes 8 products per field,
// and two of them are added before `fields`.
fn pair_dot(q: array<vec4<u32>, 8>, a: array<vec4<u32>, 8>) -> vec2<f32> {
    var acc = q[0] * a[0];
    for (var i = 1u; i < 8u; i++) {
        acc += q[i] * a[i];
    }
    return fields(acc.x + acc.y) + fields(acc.z + acc.w);
}
