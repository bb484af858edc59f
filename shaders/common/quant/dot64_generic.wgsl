// Two consecutive chunks (2 c2, 2 c2 + 1) dotted with their activations as `x_pre`
// leaves them, for weight types whose decoder has no `wdot64_pre` (those with one load
// the words both chunks share once, as K-quants' paired nibbles).

fn wdot64_pre(
    row_byte: u32,
    c2: u32,
    xa: array<vec4<f32>, 8>,
    xb: array<vec4<f32>, 8>,
    sa: f32,
    sb: f32,
) -> f32 {
    return wdot32_pre(row_byte, 2u * c2, xa, sa) + wdot32_pre(row_byte, 2u * c2 + 1u, xb, sb);
}
