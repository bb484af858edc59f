// q and the K cache of `attn_decode` read from their storage buffers.

@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec2<u32>>;

// vec4 i of q.
fn dq(i: u32) -> vec4<f32> {
    return q[i];
}

// The four halves at vec2 index i of the K cache.
fn dk(i: u32) -> vec4<f32> {
    return half4(k_cache[i]);
}
