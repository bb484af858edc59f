// Reads of the transposed V cache shared by the weighted sums (`attn_out`,
// `attn_decode`): the including kernel binds `v_cache` as array<vec2<u32>>, four f16
// per element.

// Four consecutive positions of one value row.
fn v4(i: u32) -> vec4<f32> {
    let w = v_cache[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// Positions 4 j .. 4 j + 3 of the four value rows from vec2 index vb on, vs apart: one
// row (one dimension) per column, so probabilities p times it weigh all four at once.
fn v_block(vb: u32, vs: u32, j: u32) -> mat4x4<f32> {
    return mat4x4<f32>(v4(vb + j), v4(vb + vs + j), v4(vb + 2u * vs + j), v4(vb + 3u * vs + j));
}
