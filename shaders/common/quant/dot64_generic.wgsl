// Two consecutive chunks (2 c2, 2 c2 + 1) dotted with their activations, for weight
// types whose decoder has no `wdot64` (those with one load the words both chunks
// share once, as K-quants' paired nibbles).

fn wdot64(
    row_byte: u32,
    c2: u32,
    xa: array<vec4<f32>, 8>,
    xb: array<vec4<f32>, 8>,
    sa: f32,
    sb: f32,
) -> f32 {
    return wdot32(row_byte, 2u * c2, xa, sa) + wdot32(row_byte, 2u * c2 + 1u, xb, sb);
}
