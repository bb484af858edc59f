// Activations of `mul_mat_win` read straight from storage.
// x: [n_cols, n_tokens] f32, column stride x_stride (in vec4s)

@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;

// vec4 i of output token t's column (batch token first + t).
fn xv(first: u32, t: u32, i: u32) -> vec4<f32> {
    return x[(first + t) * p.x_stride + i];
}
