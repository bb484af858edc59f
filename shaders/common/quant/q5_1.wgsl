// Q5_1 (ggml block_q5_1, 24 bytes): f16 d; f16 m; u8 qh[4]; u8 qs[16].
// value = q * d + m with q the 5-bit number (bit j of qh on top).
// Planar rows (src/gpu/layout.rs): every block's 16 bytes of nibbles (one aligned
// vec4), then every block's qh word, then every block's (d, m) word.

fn q5_1_qh(row_byte: u32, c: u32) -> u32 {
    return wu((plane(row_byte, 32u, 16u) >> 2u) + c);
}

fn q5_1_dm(row_byte: u32, c: u32) -> vec2<f32> {
    return unpack2x16float(wu((plane(row_byte, 32u, 20u) >> 2u) + c));
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let dm = q5_1_dm(row_byte, c);
    let qh = q5_1_qh(row_byte, c);
    let q = wq((row_byte >> 4u) + c);
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        o[k] = q5_lo(q[k], qh, 4u * k) * dm.x + dm.y;
        o[k + 4u] = q5_hi(q[k], qh, 16u + 4u * k) * dm.x + dm.y;
    }
    return o;
}

// sum_j (q_j d + m) x_j = d sum_j q_j x_j + m xs, on activations from `x_pre`, the
// five-bit quants read in place in their bytes (common/bytes.wgsl).
fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return x_times(xc, PLACE_BYTES);
}

fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let s = q5_dot(wq((row_byte >> 4u) + c), q5_1_qh(row_byte, c), xp);
    let dm = q5_1_dm(row_byte, c);
    return s * dm.x + xs * dm.y;
}

// A lane's run of chunks from c0 (the walk `fields` in ops/mul_mat_ks1.wgsl): their qh and
// (d, m) words, read once per row (`run_words`).
struct RunFields {
    qh: array<u32, 8>,
    dm: array<u32, 8>,
}

fn run_fields(row_byte: u32, c0: u32, slots: u32, lanes: u32) -> RunFields {
    let qh = run_words(plane(row_byte, 32u, 16u) + c0 * 4u, 4u, slots);
    return RunFields(qh, run_words(plane(row_byte, 32u, 20u) + c0 * 4u, 4u, slots));
}

// `wdot32_pre` of chunk c, the run's k-th, its qh and (d, m) from the run's fields.
fn wdot32_run(row_byte: u32, c: u32, k: u32, xp: array<vec4<f32>, 8>, xs: f32, f: RunFields) -> f32 {
    let s = q5_dot(wq((row_byte >> 4u) + c), f.qh[k], xp);
    let dm = unpack2x16float(f.dm[k]);
    return s * dm.x + xs * dm.y;
}
