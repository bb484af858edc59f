// The probabilities and the V cache of `attn_out` read from their storage buffers
// (`v4` from common/attn_v.wgsl).
// probs: [probs_stride(), tn, n_head] f32 as vec4s; v_cache: the V cache (f16 in blocks
// of eight positions, common/v_layout.wgsl), four halves per vec2<u32>.

@group(0) @binding(2) var<storage, read> probs: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec2<u32>>;

// Probabilities of keys 4 i .. 4 i + 3 (i a vec4 index).
fn p4(i: u32) -> vec4<f32> {
    return probs[i];
}

// Positions 8 j .. 8 j + 7 of value row `row`: the first four and the last four.
fn v8(row: u32, j: u32) -> array<vec4<f32>, 2> {
    let i = v_texel(row, 8u * j, p.head_dim * p.n_head_kv);
    return array<vec4<f32>, 2>(v4(2u * i), v4(2u * i + 1u));
}
