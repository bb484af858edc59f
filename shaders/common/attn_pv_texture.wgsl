// The probabilities and the V cache of `attn_out` read from textures the step copied
// them into (`ops::attention::AttnTextures`): one vec4 of probabilities per texel, the
// probabilities' buffer row-major (common/scratch_texel.wgsl), and V's buffer the same
// way. Indices as common/attn_pv_buffer.wgsl's.

@group(0) @binding(2) var probs_tex: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(3) var v_tex: texture_storage_2d<rgba32uint, read>;

fn p4(i: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(textureLoad(probs_tex, scratch_xy(i)));
}

// Positions 8 j .. 8 j + 7 of value row `row`: one texel (common/v_layout.wgsl).
fn v8(row: u32, j: u32) -> array<vec4<f32>, 2> {
    let w = textureLoad(v_tex, scratch_xy(v_texel(row, 8u * j, p.head_dim * p.n_head_kv)));
    return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
}
