// q and the caches of `attn_decode` read from their storage buffers.

@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec2<u32>>;

// vec4 i of q.
fn dq(i: u32) -> vec4<f32> {
    return q[i];
}

// The four halves at vec2 index i of the K cache.
fn dk(i: u32) -> vec4<f32> {
    return half4(k_cache[i]);
}

// The eight halves at vec2 indices i and i + 1 of the K cache (i even).
fn dk8(i: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(dk(i), dk(i + 1u));
}

// Positions 8 j .. 8 j + 7 of value row `dim`: the two vec2s of its texel
// (common/v_layout.wgsl, common/attn_v.wgsl's `v4`).
fn dv8(dim: u32, j: u32) -> V8 {
    let i = 2u * v_texel(dim, 8u * j, p.head_dim * p.n_head_kv);
    return V8(v4(i), v4(i + 1u));
}
