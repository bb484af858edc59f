// The weight binding of the quantized kernels as an rgba32uint texture, with the same
// accessors as common/w_storage.wgsl: `wq(i)`, the i-th aligned vec4<u32> (one texel),
// and `wu(i)`, the i-th u32 (a component of texel i / 4). The tensor's bytes run
// row-major through texels TEX_W wide (`gpu::upload`); the texture is bound at both
// weight bindings, as the storage form binds its buffer twice, so one layout serves
// every decoder. CPU-hosted drivers (lavapipe) fetch the texels of all lanes with one
// SIMD gather, where a storage-buffer load is a loop over the lanes.
//
// It is bound as a read-only storage texture rather than a sampled one: llvmpipe then
// addresses a load with the one row stride, inline, where a sampled fetch is a call that
// gathers each lane's mip-level offset and stride first. Measured on lavapipe
// (`wgllm-bench peak --all`, same run): 23-29 GB/s against 12-13 GB/s for sampled
// fetches; Gemma 3's decode step 1.2x faster (docs/perf.md).

@group(0) @binding(2) var wt: texture_storage_2d<rgba32uint, read>;

// log2 of TEX_W; `gpu::upload::TEX_SHIFT` on the host.
const TEX_SHIFT: u32 = 12u;

fn wq(i: u32) -> vec4<u32> {
    return textureLoad(wt, vec2<u32>(i & ((1u << TEX_SHIFT) - 1u), i >> TEX_SHIFT));
}

fn wu(i: u32) -> u32 {
    return wq(i >> 2u)[i & 3u];
}
