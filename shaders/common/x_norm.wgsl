// The norm `mul_mat_ks1` folds into its product: its activations are the residual
// stream, and the kernel computes rms_norm(x) * nw itself (`ops::mul_mat::Norm`), so the
// step records no norm dispatch of its own.

const NORM: bool = true;

// A uniform rather than storage: every workgroup reads the whole weight, and a
// CPU-hosted driver runs a storage load as a loop over the lanes (on lavapipe, folding
// with the weight in storage made Gemma 3's gate/up products 1.3x slower than a
// separate norm, docs/perf.md). The buffer holds at least the array's 16 KiB
// (`gpu::upload::VECTOR_UNIFORM_BYTES`): rows of up to 4096.
@group(0) @binding(8) var<uniform> nw: array<vec4<f32>, 1024>;

// vec4 i of the norm's weight.
fn norm_w(i: u32) -> vec4<f32> {
    return nw[i];
}
