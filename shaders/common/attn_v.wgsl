// Reads of the V cache shared by the weighted sums (`attn_out`, `attn_decode`): the
// including kernel binds `v_cache` as array<vec2<u32>>, four f16 per element, each
// texel of common/v_layout.wgsl two elements.

// Four consecutive positions of one value row.
fn v4(i: u32) -> vec4<f32> {
    let w = v_cache[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
