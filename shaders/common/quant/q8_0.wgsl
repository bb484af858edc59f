// Q8_0 (ggml block_q8_0, 34 bytes): f16 d; i8 qs[32]; value = q * d.
// Planar rows (src/gpu/layout.rs): every block's 32 quants (two aligned vec4s), then
// every block's d. The quants are held offset by 128, as unsigned bytes (q + 128, the
// file's byte with its top bit flipped: `gpu::layout::write_row`).

fn q8_0_d(row_byte: u32, c: u32) -> f32 {
    return w_f16(plane(row_byte, 32u, 32u) + c * 2u);
}

fn decode32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
    let d = q8_0_d(row_byte, c);
    let q = wq8((row_byte >> 4u) + c * 2u);
    var o: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        o[k] = (u8x4(q[k]) - 128.0) * d;
    }
    return o;
}

// sum_j q_j d x_j = d (sum_j (q_j + 128) x_j - 128 xs): the quants are held offset
// (above) and read in place in their bytes (common/bytes.wgsl), the activations from
// `x_pre`, so a byte takes one operation (a mask, or the top byte's shift) where a
// signed quant takes two to reach its word's top byte. Measured on lavapipe
// (docs/perf.md): Gemma 3's decode 1.04x, its Q8_0 head most of it.
fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return x_times(xc, PLACE_BYTES);
}

fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    return (q8_0_sum(row_byte, c, xp) - 128.0 * xs) * q8_0_d(row_byte, c);
}

// sum_j (q_j + 128) x_j over chunk c, on activations from `x_pre`.
fn q8_0_sum(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>) -> f32 {
    let q = wq8((row_byte >> 4u) + c * 2u);
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        s += dot(bytes_placed(q[k]), xp[k]);
    }
    return s;
}

// A lane's slots' d (the walk `fields` in ops/mul_mat_ks1.wgsl), each in the low half of its
// word. Q8_0's lanes hold strided chunks (c0, c0 + lanes, ..: `RUNS` off), so all of
// a row's lanes read the same texels of its d plane, as many as the row's slots span
// (`slots` x `lanes` chunks of 2 bytes, at most three texels), where each chunk's dot
// fetched one: fewer where a row has at most four lanes (`mul_mat::ks1_shape`'s two or
// four rows on a subgroup), the case the host builds it for. Slot k's d is then in word k lanes / 2 or the next,
// as lane c0's c0 & 2 says, in its half c0 & 1.
struct RunFields {
    d: array<u32, 8>,
}

fn run_fields(row_byte: u32, c0: u32, slots: u32, lanes: u32) -> RunFields {
    // Eight 2-byte fields a texel.
    let w = texel_words(plane(row_byte, 32u, 32u) >> 4u, (slots * lanes + 7u) / 8u);
    let next = (c0 & 2u) != 0u;
    let half = (c0 & 1u) * 16u;
    var d: array<u32, 8>;
    for (var k = 0u; k < 8u; k++) {
        let i = min(k * lanes / 2u, 10u);
        d[k] = select(w[i], w[i + 1u], next) >> half;
    }
    return RunFields(d);
}

// `wdot32_pre` of chunk c, the lane's k-th, its d from the lane's fields.
fn wdot32_run(row_byte: u32, c: u32, k: u32, xp: array<vec4<f32>, 8>, xs: f32, f: RunFields) -> f32 {
    return (q8_0_sum(row_byte, c, xp) - 128.0 * xs) * unpack2x16float(f.d[k]).x;
}
