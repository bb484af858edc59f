// `argmax`'s logits (ops/argmax.wgsl) read from their buffer.

@group(0) @binding(2) var<storage, read> logits: array<f32>;

// The keys of logits 4j .. 4j + 3, 0 for those at or past `end` (whose loads are
// clamped to the last logit).
fn quad_keys(j: u32, end: u32) -> vec4<u32> {
    let i = min(vec4<u32>(4u * j) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(end - 1u));
    let v = vec4<u32>(
        bitcast<u32>(logits[i.x]),
        bitcast<u32>(logits[i.y]),
        bitcast<u32>(logits[i.z]),
        bitcast<u32>(logits[i.w]),
    );
    return keys_before(v, j, end);
}
