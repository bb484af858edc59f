// `x_pre` and `wdot32_pre` (the dot of the products that load a chunk of activations
// once for many rows: `mul_mat_ks1`, `mul_mat_ks`, `mul_mat_mr`) for weight types whose
// decoder reads no field in place (common/bytes.wgsl): the activations as they are,
// and `wdot32`.

fn x_pre(xc: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    return xc;
}

fn wdot32_pre(row_byte: u32, c: u32, xp: array<vec4<f32>, 8>, xs: f32) -> f32 {
    return wdot32(row_byte, c, xp, xs);
}
