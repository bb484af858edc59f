// The norm `mul_mat_mr` folds into its single-token build: as common/x_norm.wgsl, its
// weight read from storage instead. The lanes of a subgroup read different chunks of
// the weight at once, which a GPU's uniform path serves one address at a time: on an
// H200 the products folding the norm ran 5-10x slower with the weight a uniform
// (docs/perf.md). The buffer is the same (`gpu::upload::vector_init`: storage and
// uniform).

const NORM: bool = true;

@group(0) @binding(8) var<storage, read> nw: array<vec4<f32>>;

// vec4 i of the norm's weight.
fn norm_w(i: u32) -> vec4<f32> {
    return nw[i];
}
