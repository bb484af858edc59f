// mul_mat for batches on the types whose chunks pack two rows into 32-bit integer
// products (Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants; common/quant/pairs.wgsl):
// `mul_mat_ks1`'s tiles of four tokens (or eight, `TILE` below), with integer dot
// products. Each lane quantizes its slots of the four tokens' activations to 8 bits
// per chunk of 32, as ggml's Q8_0 / Q8_1 do for the small-block types on the CPU
// (scale absmax / 127 kept as an f16, the sum of the quants times the scale for the
// offset term; ggml's Q8_K for the K-quants holds a block of 256 per scale), and walks
// the rows two at a time: one multiply and one add per element serve both rows, where
// the float tile decodes each row and spends a multiply and an add per row and token.
// Measured on lavapipe: docs/perf.md.
//
// Every token of a batch runs here, the last tile padded with repeats of the last token
// (not stored), so that a token's result does not depend on its place in the batch;
// single tokens run `mul_mat_ks1` on float activations.
//
// The helpers here and in common/quant/pairs.wgsl build their arrays as literals, not in
// loops that write elements: written in loops, the kernel took lavapipe 0.65 s (three
// slots) and 1.9 s (six) to create, against 0.09 and 0.16 s as literals, and Mesa's
// shader cache does not keep that work.
//
// Params: common/mul_mat_params.wgsl; the workgroup's shape, lanes and bindings:
// common/ks1_lanes.wgsl.

// A chunk of one token's activations in 8 bits: the quants (as u32s, for the packed
// multiplies), their f16 scale, the sum of the quants, and that sum times the scale
// rounded to an f16 (ggml's Q8_1 `s`).
struct Q8 {
    a: array<vec4<u32>, 8>,
    d: f32,
    sum: f32,
    s: f32,
}

fn f16_round(v: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
}

// As ggml's quantize_row_q8_0/q8_1 on x86: quants rounded half to even.
fn q8_chunk(x: array<vec4<f32>, 8>) -> Q8 {
    let m = max(
        max(max(abs(x[0]), abs(x[1])), max(abs(x[2]), abs(x[3]))),
        max(max(abs(x[4]), abs(x[5])), max(abs(x[6]), abs(x[7]))),
    );
    let d = max(max(m.x, m.y), max(m.z, m.w)) / 127.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    let q = array<vec4<i32>, 8>(
        vec4<i32>(round(x[0] * id)), vec4<i32>(round(x[1] * id)),
        vec4<i32>(round(x[2] * id)), vec4<i32>(round(x[3] * id)),
        vec4<i32>(round(x[4] * id)), vec4<i32>(round(x[5] * id)),
        vec4<i32>(round(x[6] * id)), vec4<i32>(round(x[7] * id)),
    );
    let n = q[0] + q[1] + q[2] + q[3] + q[4] + q[5] + q[6] + q[7];
    let a = array<vec4<u32>, 8>(
        bitcast<vec4<u32>>(q[0]), bitcast<vec4<u32>>(q[1]),
        bitcast<vec4<u32>>(q[2]), bitcast<vec4<u32>>(q[3]),
        bitcast<vec4<u32>>(q[4]), bitcast<vec4<u32>>(q[5]),
        bitcast<vec4<u32>>(q[6]), bitcast<vec4<u32>>(q[7]),
    );
    let sum = f32(n.x + n.y + n.z + n.w);
    return Q8(a, f16_round(d), sum, f16_round(sum * d));
}

// Slot k of the four tokens `tt` (whose 1 / rms are `inv` with NORM), in 8 bits.
struct QSlot4 {
    c: u32,
    on: f32,
    a0: array<vec4<u32>, 8>,
    a1: array<vec4<u32>, 8>,
    a2: array<vec4<u32>, 8>,
    a3: array<vec4<u32>, 8>,
    d: vec4<f32>,
    sum: vec4<f32>,
    s: vec4<f32>,
}

fn qslot4(first: u32, tt: vec4<u32>, k: u32, l: u32, n_chunks: u32, inv: vec4<f32>) -> QSlot4 {
    let c = slot_chunk(k, l, n_chunks);
    let q0 = q8_chunk(normed(x_chunk(first, tt.x, c.x), c.x, inv.x));
    let q1 = q8_chunk(normed(x_chunk(first, tt.y, c.x), c.x, inv.y));
    let q2 = q8_chunk(normed(x_chunk(first, tt.z, c.x), c.x, inv.z));
    let q3 = q8_chunk(normed(x_chunk(first, tt.w, c.x), c.x, inv.w));
    return QSlot4(
        c.x,
        f32(c.y),
        q0.a,
        q1.a,
        q2.a,
        q3.a,
        vec4<f32>(q0.d, q1.d, q2.d, q3.d),
        vec4<f32>(q0.sum, q1.sum, q2.sum, q3.sum),
        vec4<f32>(q0.s, q1.s, q2.s, q3.s),
    );
}

// Tokens per tile: 4, or 8 (the host picks per batch, `ops::mul_mat::ks1i_eight`).
// The lines between `@begin tile8` and `@end tile8` are the tiles of eight's, those
// between `@begin tile4` and `@end tile4` the tiles of four's; the host drops the other
// build's (`gpu::shaders::keep_regions`), as lavapipe's time to create a pipeline
// grows with its source, dead branches included (docs/perf.md). With both (the file
// as it stands) the kernel is valid and runs both.
override TILE: u32 = 4u;

// The four tokens' sums of rows A and B.
struct Pair4 {
    a: vec4<f32>,
    b: vec4<f32>,
}

fn add4(u: Pair4, v: Pair4) -> Pair4 {
    return Pair4(u.a + v.a, u.b + v.b);
}

// `pair4_dot(w, s)`, the unpacked chunk `w` of rows A and B (`pair_chunk`) dotted with
// four tokens' slot s, is the type's (common/quant/pairs.wgsl).

// A row's chunks are unpacked one at a time (region `chunks`), or in pairs (region
// `chunk_pairs`; the host keeps one of the two, `ops::mul_mat::build`): types whose
// neighbouring chunks share their bytes, Q4_K's and Q5_K's low and high nibbles of the
// same 32 bytes, and the block's header, Q5_K's fifth bits, Q6_K's high bits and
// scales, on an even count of slots a lane, whose runs then start at even chunks, hold
// chunks 2 c2 and 2 c2 + 1 of a row in slots a and a + 1, unpacked together from one
// load of what they share (`pair_chunks`, common/quant/*_pairs.wgsl).

// @begin tile4
// Rows `rb_a` and `rb_b`'s chunk in slot s, unpacked once, dotted with the four tokens'.
fn qslot4_dot(rb_a: u32, rb_b: u32, s: QSlot4) -> Pair4 {
    return pair4_dot(pair_chunk(rb_a, rb_b, s.c), s);
}

// @begin chunk_pairs
// The two chunks of slots s and t (s.c even, t.c = s.c + 1), unpacked together.
fn qslots4_dot(rb_a: u32, rb_b: u32, s: QSlot4, t: QSlot4) -> Pair4 {
    let w = pair_chunks(rb_a, rb_b, s.c);
    return add4(pair4_dot(w.lo, s), pair4_dot(w.hi, t));
}
// @end chunk_pairs

// Rows `rb_a` and `rb_b` dotted with a lane's slots (the `@slot k` lines as in
// ops/mul_mat_ks1.wgsl).
fn rows_dot4(
    rb_a: u32,
    rb_b: u32,
    s0: QSlot4,
    s1: QSlot4, // @slot 1
    s2: QSlot4, // @slot 2
    s3: QSlot4, // @slot 3
    s4: QSlot4, // @slot 4
    s5: QSlot4, // @slot 5
    s6: QSlot4, // @slot 6
    s7: QSlot4, // @slot 7
) -> Pair4 {
    // @begin chunk_pairs
    var w = qslots4_dot(rb_a, rb_b, s0, s1); // @slot 1
    w = add4(w, qslots4_dot(rb_a, rb_b, s2, s3)); // @slot 3
    w = add4(w, qslots4_dot(rb_a, rb_b, s4, s5)); // @slot 5
    w = add4(w, qslots4_dot(rb_a, rb_b, s6, s7)); // @slot 7
    return w;
    // @end chunk_pairs
    // @begin chunks
    var v = qslot4_dot(rb_a, rb_b, s0);
    v = add4(v, qslot4_dot(rb_a, rb_b, s1)); // @slot 1
    v = add4(v, qslot4_dot(rb_a, rb_b, s2)); // @slot 2
    v = add4(v, qslot4_dot(rb_a, rb_b, s3)); // @slot 3
    v = add4(v, qslot4_dot(rb_a, rb_b, s4)); // @slot 4
    v = add4(v, qslot4_dot(rb_a, rb_b, s5)); // @slot 5
    v = add4(v, qslot4_dot(rb_a, rb_b, s6)); // @slot 6
    v = add4(v, qslot4_dot(rb_a, rb_b, s7)); // @slot 7
    return v;
    // @end chunks
}
// @end tile4

// @begin tile8
// A tile of eight's sums of rows A and B: tokens 0 .. 3 in `lo`, 4 .. 7 in `hi`.
struct Pair8 {
    lo: Pair4,
    hi: Pair4,
}

fn add8(u: Pair8, v: Pair8) -> Pair8 {
    return Pair8(add4(u.lo, v.lo), add4(u.hi, v.hi));
}

// Rows `rb_a` and `rb_b`'s chunk in slot s, unpacked once, dotted with the first four
// tokens' (s) and the next four's (u).
fn qslot8_dot(rb_a: u32, rb_b: u32, s: QSlot4, u: QSlot4) -> Pair8 {
    let w = pair_chunk(rb_a, rb_b, s.c);
    return Pair8(pair4_dot(w, s), pair4_dot(w, u));
}

// @begin chunk_pairs
// `qslots4_dot` for tiles of eight: slots s and t of the first four tokens, u and v of
// the next four.
fn qslots8_dot(rb_a: u32, rb_b: u32, s: QSlot4, t: QSlot4, u: QSlot4, v: QSlot4) -> Pair8 {
    let w = pair_chunks(rb_a, rb_b, s.c);
    return Pair8(
        add4(pair4_dot(w.lo, s), pair4_dot(w.hi, t)),
        add4(pair4_dot(w.lo, u), pair4_dot(w.hi, v)),
    );
}
// @end chunk_pairs

// `rows_dot4` for tiles of eight.
fn rows_dot8(
    rb_a: u32,
    rb_b: u32,
    s0: QSlot4,
    s1: QSlot4, // @slot 1
    s2: QSlot4, // @slot 2
    s3: QSlot4, // @slot 3
    s4: QSlot4, // @slot 4
    s5: QSlot4, // @slot 5
    s6: QSlot4, // @slot 6
    s7: QSlot4, // @slot 7
    u0: QSlot4,
    u1: QSlot4, // @slot 1
    u2: QSlot4, // @slot 2
    u3: QSlot4, // @slot 3
    u4: QSlot4, // @slot 4
    u5: QSlot4, // @slot 5
    u6: QSlot4, // @slot 6
    u7: QSlot4, // @slot 7
) -> Pair8 {
    // @begin chunk_pairs
    var w = qslots8_dot(rb_a, rb_b, s0, s1, u0, u1); // @slot 1
    w = add8(w, qslots8_dot(rb_a, rb_b, s2, s3, u2, u3)); // @slot 3
    w = add8(w, qslots8_dot(rb_a, rb_b, s4, s5, u4, u5)); // @slot 5
    w = add8(w, qslots8_dot(rb_a, rb_b, s6, s7, u6, u7)); // @slot 7
    return w;
    // @end chunk_pairs
    // @begin chunks
    var v = qslot8_dot(rb_a, rb_b, s0, u0);
    v = add8(v, qslot8_dot(rb_a, rb_b, s1, u1)); // @slot 1
    v = add8(v, qslot8_dot(rb_a, rb_b, s2, u2)); // @slot 2
    v = add8(v, qslot8_dot(rb_a, rb_b, s3, u3)); // @slot 3
    v = add8(v, qslot8_dot(rb_a, rb_b, s4, u4)); // @slot 4
    v = add8(v, qslot8_dot(rb_a, rb_b, s5, u5)); // @slot 5
    v = add8(v, qslot8_dot(rb_a, rb_b, s6, u6)); // @slot 6
    v = add8(v, qslot8_dot(rb_a, rb_b, s7, u7)); // @slot 7
    return v;
    // @end chunks
}
// @end tile8

// The four tokens `tt`'s 1 / rms with NORM (1 without).
fn norm_inv4(first: u32, tt: vec4<u32>, l: u32, n_chunks: u32) -> vec4<f32> {
    return vec4<f32>(
        norm_inv(first, tt.x, l, n_chunks),
        norm_inv(first, tt.y, l, n_chunks),
        norm_inv(first, tt.z, l, n_chunks),
        norm_inv(first, tt.w, l, n_chunks),
    );
}

// Row r's sums of tokens t .. t + 3 (`v`) stored, those from n_out on dropped.
fn store4(t: u32, n_out: u32, r: u32, v: vec4<f32>) {
    if (t >= n_out) {
        return;
    }
    store_out(t, r, v.x);
    for (var k = 1u; k < min(4u, n_out - t); k++) {
        store_out(t + k, r, v[k]);
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) l: u32,
) {
    // Uniform per workgroup, so every lane reaches the subgroupAdds below.
    let w = ks_rows(wid, nwg);
    if (w.r0 >= p.n_rows) {
        return;
    }
    let r0 = w.r0;
    let nr = w.nr;
    let n_chunks = p.chunk_n;
    let first = w.first;
    let n_out = w.n_out;
    let out0 = p.row0 + r0;
    let lanes = vec4<u32>(0u, 1u, 2u, 3u);
    for (var t = w.t0; t < n_out; t += TILE) {
        let tt = min(vec4<u32>(t) + lanes, vec4<u32>(n_out - 1u));
        let inv = norm_inv4(first, tt, l, n_chunks);
        let s0 = qslot4(first, tt, 0u, l, n_chunks, inv);
        let s1 = qslot4(first, tt, 1u, l, n_chunks, inv); // @slot 1
        let s2 = qslot4(first, tt, 2u, l, n_chunks, inv); // @slot 2
        let s3 = qslot4(first, tt, 3u, l, n_chunks, inv); // @slot 3
        let s4 = qslot4(first, tt, 4u, l, n_chunks, inv); // @slot 4
        let s5 = qslot4(first, tt, 5u, l, n_chunks, inv); // @slot 5
        let s6 = qslot4(first, tt, 6u, l, n_chunks, inv); // @slot 6
        let s7 = qslot4(first, tt, 7u, l, n_chunks, inv); // @slot 7
        // @begin tile8
        let tu = min(vec4<u32>(t + 4u) + lanes, vec4<u32>(n_out - 1u));
        let inv_u = norm_inv4(first, tu, l, n_chunks);
        let u0 = qslot4(first, tu, 0u, l, n_chunks, inv_u);
        let u1 = qslot4(first, tu, 1u, l, n_chunks, inv_u); // @slot 1
        let u2 = qslot4(first, tu, 2u, l, n_chunks, inv_u); // @slot 2
        let u3 = qslot4(first, tu, 3u, l, n_chunks, inv_u); // @slot 3
        let u4 = qslot4(first, tu, 4u, l, n_chunks, inv_u); // @slot 4
        let u5 = qslot4(first, tu, 5u, l, n_chunks, inv_u); // @slot 5
        let u6 = qslot4(first, tu, 6u, l, n_chunks, inv_u); // @slot 6
        let u7 = qslot4(first, tu, 7u, l, n_chunks, inv_u); // @slot 7
        // @end tile8
        for (var i0 = 0u; i0 < nr; i0 += WG) {
            var mine = vec4<f32>();
            // @begin tile8
            var mine_hi = vec4<f32>();
            // @end tile8
            // Pairs of rows; a lone last row is paired with itself and its copy dropped
            // (WG is even, so lane j + 1 exists).
            for (var j = 0u; j < min(WG, nr - i0); j += 2u) {
                let ra = r0 + i0 + j;
                let rb = min(ra + 1u, r0 + nr - 1u);
                // @begin tile4
                let v = rows_dot4(
                    ra * p.row_bytes,
                    rb * p.row_bytes,
                    s0,
                    s1, // @slot 1
                    s2, // @slot 2
                    s3, // @slot 3
                    s4, // @slot 4
                    s5, // @slot 5
                    s6, // @slot 6
                    s7, // @slot 7
                );
                mine = select(mine, lane_sum4(v.a), l == j);
                mine = select(mine, lane_sum4(v.b), l == j + 1u);
                // @end tile4
                // @begin tile8
                let v8 = rows_dot8(
                    ra * p.row_bytes,
                    rb * p.row_bytes,
                    s0,
                    s1, // @slot 1
                    s2, // @slot 2
                    s3, // @slot 3
                    s4, // @slot 4
                    s5, // @slot 5
                    s6, // @slot 6
                    s7, // @slot 7
                    u0,
                    u1, // @slot 1
                    u2, // @slot 2
                    u3, // @slot 3
                    u4, // @slot 4
                    u5, // @slot 5
                    u6, // @slot 6
                    u7, // @slot 7
                );
                mine = select(mine, lane_sum4(v8.lo.a), l == j);
                mine = select(mine, lane_sum4(v8.lo.b), l == j + 1u);
                mine_hi = select(mine_hi, lane_sum4(v8.hi.a), l == j);
                mine_hi = select(mine_hi, lane_sum4(v8.hi.b), l == j + 1u);
                // @end tile8
            }
            if (i0 + l < nr) {
                let r = out0 + i0 + l;
                store4(t, n_out, r, mine);
                // @begin tile8
                store4(t + 4u, n_out, r, mine_hi);
                // @end tile8
            }
        }
    }
    keep_lanes();
}
