// `mul_mat_ks1` on activations used as they are (see common/x_norm.wgsl).

const NORM: bool = false;

fn norm_w(i: u32) -> vec4<f32> {
    return vec4<f32>(1.0);
}
