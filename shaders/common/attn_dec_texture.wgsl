// q and the caches of `attn_decode_tex`: q read as a uniform (the first 64 KiB of its
// buffer, which holds the step's one token), K from the texture the step copied the
// cache's filled rows into (`ops::attention::AttnTextures`, common/scratch_texel.wgsl),
// and V from the texture its cache's bytes went into the same way. On CPU-hosted
// drivers a uniform or texel load is one SIMD gather where a storage load is a loop
// over the lanes: on lavapipe the fifth VM read storage at 1.1-1.3 GB/s, uniforms at
// 17.8 and textures at 29.4 (docs/perf.md).

@group(0) @binding(2) var<uniform> qu: array<vec4<f32>, 4096>;
@group(0) @binding(3) var k_tex: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(4) var v_tex: texture_storage_2d<rgba32uint, read>;

// vec4 i of q.
fn dq(i: u32) -> vec4<f32> {
    return qu[i];
}

// The eight halves at vec2 indices i and i + 1 of the K cache (i even): texel i / 2.
fn dk8(i: u32) -> array<vec4<f32>, 2> {
    let w = textureLoad(k_tex, scratch_xy(i >> 1u));
    return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
}

// The four halves at vec2 index i of the K cache: half of texel i / 2.
fn dk(i: u32) -> vec4<f32> {
    return dk8(i & ~1u)[i & 1u];
}

// Positions 8 j .. 8 j + 7 of value row `dim`: one texel (common/v_layout.wgsl).
fn dv8(dim: u32, j: u32) -> V8 {
    let w = textureLoad(v_tex, scratch_xy(v_texel(dim, 8u * j, p.head_dim * p.n_head_kv)));
    return V8(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
}
