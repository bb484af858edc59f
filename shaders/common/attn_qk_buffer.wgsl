// Q and the K cache of `attn_scores` read from their storage buffers.
// q: [head_dim, n_head, n_tokens] f32 as vec4s; k_cache: [head_dim, n_head_kv, n_ctx]
// f16, four halves per vec2<u32>.

@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec2<u32>>;

// Dimensions 4 i .. 4 i + 3 of Q (i a vec4 index) and 8 from there.
fn q4(i: u32) -> vec4<f32> {
    return q[i];
}
fn q8(i: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(q[i], q[i + 1u]);
}

// Four halves of K from vec2 index i, and eight.
fn k4(i: u32) -> vec4<f32> {
    let w = k_cache[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
fn k8(i: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(k4(i), k4(i + 1u));
}
