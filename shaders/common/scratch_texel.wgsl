// Where texel i lies in a scratch texture that holds a buffer's bytes row-major through
// rgba32uint texels TEX_W wide (`gpu::upload::scratch_texture`), as the attention
// kernels read their operands: on CPU-hosted drivers a texel load is one SIMD gather,
// where a storage load is a loop over the lanes and their words.

// log2 of TEX_W (`gpu::upload::TEX_SHIFT`).
const SCRATCH_TEX_SHIFT: u32 = 12u;

// Where texel i lies. The callers load it from their texture themselves: GLSL (wgpu's
// GL backend) takes no storage image as a function's parameter.
fn scratch_xy(i: u32) -> vec2<u32> {
    return vec2<u32>(i & ((1u << SCRATCH_TEX_SHIFT) - 1u), i >> SCRATCH_TEX_SHIFT);
}
