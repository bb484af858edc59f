// The norm `mul_mat_ks1` folds into its product: its activations are the residual
// stream, and the kernel computes rms_norm(x) * nw itself (`ops::mul_mat::Norm`), so the
// step records no norm dispatch of its own.

const NORM: bool = true;

@group(0) @binding(8) var<storage, read> nw: array<vec4<f32>>;

// vec4 i of the norm's weight.
fn norm_w(i: u32) -> vec4<f32> {
    return nw[i];
}
