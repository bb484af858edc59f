// RoPE's rotation of pair i (i < n_rot / 2) at position pos, as (cos, sin):
// theta_i = pos * freq_scale * freq_base^(-2i / n_rot).
fn rope_cs(pos: u32, i: u32, n_rot: u32, freq_base: f32, freq_scale: f32) -> vec2<f32> {
    let inv_freq = pow(freq_base, -f32(2u * i) / f32(n_rot));
    let theta = f32(pos) * freq_scale * inv_freq;
    return vec2<f32>(cos(theta), sin(theta));
}

// Offsets within a head of pair i's two elements: (2i, 2i + 1) in mode 0 (normal,
// llama), (i, i + n_rot / 2) in mode 2 (NeoX, Gemma).
fn rope_pair(i: u32, n_rot: u32, mode: u32) -> vec2<u32> {
    return select(vec2<u32>(2u * i, 2u * i + 1u), vec2<u32>(i, i + n_rot / 2u), mode == 2u);
}
