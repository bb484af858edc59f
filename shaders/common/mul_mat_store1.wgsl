// Where a mul_mat kernel stores its rows, on devices that bind too few storage buffers
// for the outputs of fused products (`mul_mat_store.wgsl`): the one output.

// Row r (of the whole tensor) of output token t.
fn store_out(t: u32, r: u32, v: f32) {
    store_y(t * p.y_stride + r, v);
}
