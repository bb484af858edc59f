// `wdot32` (activations as they are) for weight types that define only `wdot32_pre`
// (activations from their `x_pre`, common/bytes.wgsl): the kernels that dot a chunk
// once per row and load its activations with it pay `x_pre` per chunk, still fewer
// operations than extracting the quants.

fn wdot32(row_byte: u32, c: u32, xc: array<vec4<f32>, 8>, xs: f32) -> f32 {
    return wdot32_pre(row_byte, c, x_pre(xc, c), xs);
}
