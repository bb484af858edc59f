// Q4_1 (ggml block_q4_1, 20 bytes): f16 d; f16 m; u8 qs[16].
// Element j = (qs[j] & 15) * d + m, element j + 16 = (qs[j] >> 4) * d + m.
// Planar rows (src/gpu/layout.rs): every block's 16 bytes of nibbles (one aligned
// vec4), then every block's (d, m) word.

fn q4_1_dm(row_byte: u32, c: u32) -> vec2<f32> {
    return unpack2x16float(wu((plane(row_byte, 32u, 16u) >> 2u) + c));
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let dm = q4_1_dm(row_byte, c);
    let q = wq((row_byte >> 4u) + c);
    return array<vec4<f32>, 8>(
        lo4(q.x) * dm.x + dm.y, lo4(q.y) * dm.x + dm.y, lo4(q.z) * dm.x + dm.y, lo4(q.w) * dm.x + dm.y,
        hi4(q.x) * dm.x + dm.y, hi4(q.y) * dm.x + dm.y, hi4(q.z) * dm.x + dm.y, hi4(q.w) * dm.x + dm.y,
    );
}

// sum_j (q_j d + m) x_j = d sum_j q_j x_j + m xs, on activations from `x_pre`, the
// nibbles read in place (common/bytes.wgsl).
fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return nibbles_pre(xc);
}

fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let s = nibbles_dot(wq((row_byte >> 4u) + c), xp);
    let dm = q4_1_dm(row_byte, c);
    return s * dm.x + xs * dm.y;
}

// A lane's run of chunks from c0 (the walk `fields` in ops/mul_mat_ks1.wgsl): their (d, m)
// words, read once per row (`run_words`).
struct RunFields {
    dm: array<u32, 8>,
}

fn run_fields(row_byte: u32, c0: u32, slots: u32, lanes: u32) -> RunFields {
    return RunFields(run_words(plane(row_byte, 32u, 16u) + c0 * 4u, 4u, slots));
}

// `wdot32_pre` of chunk c, the run's k-th, its (d, m) from the run's fields.
fn wdot32_run(row_byte: u32, c: u32, k: u32, xp: array<vec4<f32>, 8>, xs: f32, f: RunFields) -> f32 {
    let s = nibbles_dot(wq((row_byte >> 4u) + c), xp);
    let dm = unpack2x16float(f.dm[k]);
    return s * dm.x + xs * dm.y;
}
