// Q4_0 chunks of two rows for common/quant/pairs.wgsl: the fields hold the nibbles
// 0 .. 15, and PAIR_OFF takes the 8 off.

const PAIR_OFF: f32 = -8.0;

fn pair_chunk(rb_a: u32, rb_b: u32, c: u32) -> PairChunk {
    let q = pair_nibbles(wq((rb_a >> 4u) + c), wq((rb_b >> 4u) + c));
    return PairChunk(q, vec4<f32>(q4_0_d(rb_a, c), 0.0, q4_0_d(rb_b, c), 0.0));
}
