// The dot product of a weight chunk with activations, for weight types whose decoder
// defines only `decode32` (those with their own `wdot32` fold scales out of the sum).
// xc: the chunk's 32 activations; xs: their sum (unused here).

fn wdot32(row_byte: u32, c: u32, xc: array<vec4<f32>, 8>, xs: f32) -> f32 {
    let v = decode32(row_byte, c);
    var s = dot(v[0], xc[0]) + dot(v[1], xc[1]);
    s += dot(v[2], xc[2]) + dot(v[3], xc[3]);
    s += dot(v[4], xc[4]) + dot(v[5], xc[5]);
    s += dot(v[6], xc[6]) + dot(v[7], xc[7]);
    return s;
}
