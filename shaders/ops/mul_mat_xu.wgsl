// Activations of `mul_mat_win` read from a uniform-buffer copy of up to 64 KiB
// (`mul_mat_xcopy` fills it with output tokens tok0 .. tok0 + tok_n). On lavapipe a
// uniform load with per-lane addresses is one vectorised gather, against a scalar
// load, bounds check and branch per lane and component for a storage load, and the
// activations are 4 bytes per weight: this is where the per-row kernel spent its time.
// xu: [n_cols, tok_n] f32, column stride x_stride (in vec4s)

@group(0) @binding(3) var<uniform> xu: array<vec4<f32>, 4096>;

// vec4 i of output token t's column.
fn xv(first: u32, t: u32, i: u32) -> vec4<f32> {
    return xu[(t - p.tok0) * p.x_stride + i];
}
