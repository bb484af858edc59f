// The V half of appending a batch to the KV cache (`kv_store`, `rope_store`): value i of
// the V pair at positions 2 (pos / 2 + u), + 1, where the batch touches it, keeping a half
// from an earlier step where the pair straddles batches. The including kernel binds
// `v_new` ([kv_dim, n_tokens] f32) and `v_cache` (f16 pairs in u32, laid out as
// common/v_layout.wgsl says).
fn store_v(i: u32, u: u32, kv_dim: u32) {
    let j0 = (step.pos / 2u + u) * 2u; // first position of this V pair
    let end = step.pos + step.n_tokens;
    if (j0 >= end) {
        return;
    }
    let at = v_word(i, j0, kv_dim);
    var v2 = unpack2x16float(v_cache[at]);
    if (j0 >= step.pos) {
        v2.x = v_new[(j0 - step.pos) * kv_dim + i];
    }
    if (j0 + 1u < end) {
        v2.y = v_new[(j0 + 1u - step.pos) * kv_dim + i];
    }
    v_cache[at] = pack2x16float(v2);
}
