// Q5_1 chunks of two rows for common/quant/pairs.wgsl: the fields hold quants less 16
// (16 products of 0 .. 31 would overflow them), which PAIR_OFF adds back.

const PAIR_OFF: f32 = 16.0;

fn pair_chunk(rb_a: u32, rb_b: u32, c: u32) -> PairChunk {
    let q = pair_q5(
        wq((rb_a >> 4u) + c),
        wq((rb_b >> 4u) + c),
        q5_1_qh(rb_a, c),
        q5_1_qh(rb_b, c),
    );
    return PairChunk(q, vec4<f32>(q5_1_dm(rb_a, c), q5_1_dm(rb_b, c)));
}
