// Q and the K cache of `attn_scores` read from textures the step copied them into
// (`ops::attention::AttnTextures`, common/scratch_texel.wgsl). Indices as
// common/attn_qk_buffer.wgsl's (vec4s of Q, vec2s of K); K's eight halves from an even
// vec2 index are one texel.

@group(0) @binding(2) var q_tex: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(3) var k_tex: texture_storage_2d<rgba32uint, read>;

fn q4(i: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(textureLoad(q_tex, scratch_xy(i)));
}
fn q8(i: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(q4(i), q4(i + 1u));
}

fn k8(i: u32) -> array<vec4<f32>, 2> {
    let w = textureLoad(k_tex, scratch_xy(i >> 1u));
    return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
}
fn k4(i: u32) -> vec4<f32> {
    return k8(i & ~1u)[i & 1u];
}
