// Chunks of two rows with one scale and offset each (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q5_K), for common/quant/pairs.wgsl: dm = (d_a, m_a, d_b, m_b), so that element j of
// row X is d_X (q_j + PAIR_OFF) + m_X.

struct PairChunk {
    q: array<vec4<u32>, 8>,
    dm: vec4<f32>,
}

// Chunk `q` of two rows dotted with a chunk of 8-bit activations `a` (as u32s): the
// integer sums for rows A and B. Each of acc's components takes 8 products per field,
// and two of them are added before `fields`.
fn pair_dot(q: array<vec4<u32>, 8>, a: array<vec4<u32>, 8>) -> vec2<f32> {
    let acc = q[0] * a[0] + q[1] * a[1] + q[2] * a[2] + q[3] * a[3]
        + q[4] * a[4] + q[5] * a[5] + q[6] * a[6] + q[7] * a[7];
    return fields(acc.x + acc.y) + fields(acc.z + acc.w);
}

// The unpacked chunk `w` of rows A and B dotted with four tokens' slot s
// (ops/mul_mat_ks1i.wgsl): d_w d_x (sum q a + PAIR_OFF sum a) + m_w s_x per row and
// token.
fn pair4_dot(w: PairChunk, s: QSlot4) -> Pair4 {
    let f0 = pair_dot(w.q, s.a0);
    let f1 = pair_dot(w.q, s.a1);
    let f2 = pair_dot(w.q, s.a2);
    let f3 = pair_dot(w.q, s.a3);
    let off = PAIR_OFF * s.sum;
    let sd = s.on * s.d;
    let ss = s.on * s.s;
    return Pair4(
        (vec4<f32>(f0.x, f1.x, f2.x, f3.x) + off) * sd * w.dm.x + ss * w.dm.y,
        (vec4<f32>(f0.y, f1.y, f2.y, f3.y) + off) * sd * w.dm.z + ss * w.dm.w,
    );
}
