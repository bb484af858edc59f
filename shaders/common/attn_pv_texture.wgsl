// The probabilities and the V cache of `attn_out` read from textures the step copied
// them into (`ops::attention::AttnTextures`, common/scratch_texel.wgsl): one vec4 of
// probabilities, or eight halves of V, per texel. Indices as
// common/attn_pv_buffer.wgsl's.

@group(0) @binding(2) var probs_tex: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(3) var v_tex: texture_storage_2d<rgba32uint, read>;

fn p4(i: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(scratch_texel(probs_tex, i));
}

fn v8(i: u32) -> array<vec4<f32>, 2> {
    let w = scratch_texel(v_tex, i);
    return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
}
