// Two consecutive chunks (2 c2, 2 c2 + 1) of a K-quant dotted with their activations
// as `x_pre` leaves them, for decoders whose pairs take what they share in their block
// from a `KBlock` (`k_block`, `wdot64_blk`): read here for the one pair, where
// `mul_mat_ks1`'s walk `kblock` reads it once for a lane's pairs.

fn wdot64_pre(
    row_byte: u32,
    c2: u32,
    xa: array<vec4<f32>, 8>,
    xb: array<vec4<f32>, 8>,
    sa: f32,
    sb: f32,
) -> f32 {
    return wdot64_blk(row_byte, c2, k_block(row_byte, 2u * c2), xa, xb, sa, sb);
}
