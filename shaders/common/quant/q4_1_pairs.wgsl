// Q4_1 chunks of two rows for common/quant/pairs.wgsl: quants 0 .. 15, offset m.

const PAIR_OFF: f32 = 0.0;

fn pair_chunk(rb_a: u32, rb_b: u32, c: u32) -> PairChunk {
    let q = pair_nibbles(wq((rb_a >> 4u) + c), wq((rb_b >> 4u) + c));
    return PairChunk(q, vec4<f32>(q4_1_dm(rb_a, c), q4_1_dm(rb_b, c)));
}
