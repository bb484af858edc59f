// Texel i of a scratch texture that holds a buffer's bytes row-major through rgba32uint
// texels TEX_W wide (`gpu::upload::scratch_texture`), as the attention kernels' batch
// builds read their operands: on CPU-hosted drivers a texel load is one SIMD gather,
// where a storage load is a loop over the lanes and their words.

// log2 of TEX_W (`gpu::upload::TEX_SHIFT`).
const SCRATCH_TEX_SHIFT: u32 = 12u;

fn scratch_texel(t: texture_storage_2d<rgba32uint, read>, i: u32) -> vec4<u32> {
    return textureLoad(t, vec2<u32>(i & ((1u << SCRATCH_TEX_SHIFT) - 1u), i >> SCRATCH_TEX_SHIFT));
}
