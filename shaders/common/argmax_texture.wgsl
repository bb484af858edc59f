// `argmax_sg`'s logits (ops/argmax.wgsl) read from the scratch texture they are copied
// into each step (common/scratch_texel.wgsl): four logits a texel. On lavapipe a storage
// buffer's loads go lane by lane at about 1 GB/s on some hosts, where texel loads are
// SIMD gathers (docs/perf.md).

@group(0) @binding(2) var logit_tex: texture_storage_2d<rgba32uint, read>;

// The keys of logits 4j .. 4j + 3 (texel j), 0 for those at or past `end`.
fn quad_keys(j: u32, end: u32) -> vec4<u32> {
    return keys_before(textureLoad(logit_tex, scratch_xy(j)), j, end);
}
