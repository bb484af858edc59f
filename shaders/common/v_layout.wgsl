// The V cache's layout (`ops::kv_store`): blocks of eight positions, one after another;
// a block holds every value row's eight halves of those positions as one 16-byte texel,
// the rows in order. A single token's values then lie in adjacent texels, where rows
// holding all positions each put them a row's length apart (their appending touched a
// line per value). Attention reads a value row's eight positions as one texel, and the
// kept texture holds the buffer's bytes as they are (`scratch_xy`).

// The texel (four words, or two vec2s) of value row i of kv_dim that holds position pos.
fn v_texel(i: u32, pos: u32, kv_dim: u32) -> u32 {
    return (pos / 8u) * kv_dim + i;
}

// The word of value row i that holds position pos (its low half when pos is even).
fn v_word(i: u32, pos: u32, kv_dim: u32) -> u32 {
    return v_texel(i, pos, kv_dim) * 4u + (pos % 8u) / 2u;
}
