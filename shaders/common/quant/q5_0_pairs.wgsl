// Q5_0 chunks of two rows for common/quant/pairs.wgsl: quants less 16, no offset.

const PAIR_OFF: f32 = 0.0;

fn pair_chunk(rb_a: u32, rb_b: u32, c: u32) -> PairChunk {
    let q = pair_q5(
        wq((rb_a >> 4u) + c),
        wq((rb_b >> 4u) + c),
        q5_0_qh(rb_a, c),
        q5_0_qh(rb_b, c),
    );
    return PairChunk(q, vec4<f32>(q5_0_d(rb_a, c), 0.0, q5_0_d(rb_b, c), 0.0));
}
