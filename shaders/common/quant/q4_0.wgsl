// Q4_0 (ggml block_q4_0, 18 bytes): f16 d; u8 qs[16].
// Element j = (qs[j] & 15) - 8, element j + 16 = (qs[j] >> 4) - 8, both times d.
// Planar rows (src/gpu/layout.rs): every block's 16 bytes of nibbles (one aligned
// vec4), then every block's d.

fn q4_0_d(row_byte: u32, c: u32) -> f32 {
    return w_f16(plane(row_byte, 32u, 16u) + c * 2u);
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let d = q4_0_d(row_byte, c);
    let q = wq((row_byte >> 4u) + c);
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        o[k] = (lo4(q[k]) - 8.0) * d;
        o[k + 4u] = (hi4(q[k]) - 8.0) * d;
    }
    return o;
}

// sum_j (q_j - 8) d x_j = d (sum_j q_j x_j - 8 xs), on activations from `x_pre`, the
// nibbles read in place (common/bytes.wgsl).
fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return nibbles_pre(xc);
}

fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let s = nibbles_dot(wq((row_byte >> 4u) + c), xp);
    return (s - 8.0 * xs) * q4_0_d(row_byte, c);
}

// A lane's run of chunks from c0 (the walk `fields` in ops/mul_mat_ks1.wgsl): their d words,
// read once per row (`run_words`), and the byte of the run's first d.
struct RunFields {
    d: array<u32, 8>,
    b: u32,
}

fn run_fields(row_byte: u32, c0: u32, slots: u32, lanes: u32) -> RunFields {
    let b = plane(row_byte, 32u, 16u) + c0 * 2u;
    return RunFields(run_words(b, 2u, slots), b);
}

// `wdot32_pre` of chunk c, the run's k-th, its d from the run's fields.
fn wdot32_run(row_byte: u32, c: u32, k: u32, xp: array<vec4<f32>, 8>, xs: f32, f: RunFields) -> f32 {
    let s = nibbles_dot(wq((row_byte >> 4u) + c), xp);
    return (s - 8.0 * xs) * unpack2x16float(run_half(f.d, f.b, k)).x;
}
