// Q5_0 (ggml block_q5_0, 22 bytes): f16 d; u8 qh[4]; u8 qs[16].
// Bit j of qh is the fifth bit of element j; value = (q - 16) * d.
// Planar rows (src/gpu/layout.rs): every block's 16 bytes of nibbles (one aligned
// vec4), then every block's qh word, then every block's d.

fn q5_0_qh(row_byte: u32, c: u32) -> u32 {
    return wu((plane(row_byte, 32u, 16u) >> 2u) + c);
}

fn q5_0_d(row_byte: u32, c: u32) -> f32 {
    return w_f16(plane(row_byte, 32u, 20u) + c * 2u);
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let d = q5_0_d(row_byte, c);
    let qh = q5_0_qh(row_byte, c);
    let q = wq((row_byte >> 4u) + c);
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        o[k] = (q5_lo(q[k], qh, 4u * k) - 16.0) * d;
        o[k + 4u] = (q5_hi(q[k], qh, 16u + 4u * k) - 16.0) * d;
    }
    return o;
}

// sum_j (q_j - 16) d x_j = d (sum_j q_j x_j - 16 xs), on activations from `x_pre`, the
// five-bit quants read in place in their bytes (common/bytes.wgsl).
fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return x_times(xc, PLACE_BYTES);
}

fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let s = q5_dot(wq((row_byte >> 4u) + c), q5_0_qh(row_byte, c), xp);
    return (s - 16.0 * xs) * q5_0_d(row_byte, c);
}

// A lane's run of chunks from c0 (the walk `fields` in ops/mul_mat_ks1.wgsl): their qh and d
// words, read once per row (`run_words`), and the byte of the run's first d.
struct RunFields {
    qh: array<u32, 8>,
    d: array<u32, 8>,
    b: u32,
}

fn run_fields(row_byte: u32, c0: u32, slots: u32, lanes: u32) -> RunFields {
    let b = plane(row_byte, 32u, 20u) + c0 * 2u;
    let qh = run_words(plane(row_byte, 32u, 16u) + c0 * 4u, 4u, slots);
    return RunFields(qh, run_words(b, 2u, slots), b);
}

// `wdot32_pre` of chunk c, the run's k-th, its qh and d from the run's fields.
fn wdot32_run(row_byte: u32, c: u32, k: u32, xp: array<vec4<f32>, 8>, xs: f32, f: RunFields) -> f32 {
    let s = q5_dot(wq((row_byte >> 4u) + c), f.qh[k], xp);
    return (s - 16.0 * xs) * unpack2x16float(run_half(f.d, f.b, k)).x;
}
