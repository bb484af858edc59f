// Parameters of every mul_mat variant (Rust `ops::mul_mat::WinParams`). The window
// fields are the windowed walk's (`mul_mat_win`); tok0 / tok_n, the range of output
// tokens of one dispatch, are read by the variants that split a batch (`win`, `ks`).

struct Params {
    n_rows: u32,     // rows in this part
    n_cols: u32,     // elements per row (a multiple of 32)
    row_bytes: u32,  // bytes per row of W
    row0: u32,       // first row of this part within the whole tensor
    x_stride: u32,   // vec4s between activation columns
    y_stride: u32,   // floats between output columns
    last_only: u32,  // 1: only the batch's last token, written as column 0 (logits)
    acc: u32,        // 1: the product is added to the output (`acc_into`)
    win_chunks: u32, // 32-element chunks per window (whole blocks)
    win_bytes: u32,  // bytes of W per window
    tok0: u32,       // first output token of this dispatch
    tok_n: u32,      // most output tokens of this dispatch
    // Fused products (rows of several matrices one after another): rows seg1 .. seg2
    // go to y1 and rows seg2 .. seg_end to y2, each [its rows, n_tokens]. A plain
    // product has seg1 = 0xffffffff.
    seg1: u32,
    seg2: u32,
    seg_end: u32,
    // The epsilon of the norm `mul_mat_ks1` folds in (common/x_norm.wgsl).
    norm_eps: f32,
    // 0, or 1 + the activation (common/act.wgsl) of a fused gate/up product whose
    // single-token build stores act(gate) * up (`mul_mat_ks1`'s GLU store): y_stride
    // rows of gate, then as many of up.
    glu: u32,
    // Rows per workgroup of `mul_mat_ks1` and `mul_mat_ks1i` (common/ks1_lanes.wgsl).
    wg_rows: u32,
    // Output tokens per workgroup of the `Ks` family: workgroup z walks tokens
    // tok0 + z tok_win .. (common/x_chunk.wgsl, `ops::mul_mat::ks_tok_win`).
    tok_win: u32,
    // The chunks of 32 columns `mul_mat_ks1` and `mul_mat_ks1i` dot: chunk0 ..
    // chunk0 + chunk_n. The whole row (0, n_cols / 32), or where a batch's rows are too
    // long for the slots, a slice of them per dispatch (`ops::mul_mat::ks1_slices`),
    // every slice past the first adding into the output.
    chunk0: u32,
    chunk_n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// Stores to an output add the product to it when p.acc is 1 (the residual stream),
// which saves the separate add and its dispatch. Written as a loop of zero or one
// trips, not a branch: a CPU-hosted driver runs both sides of a branch under lane masks
// but skips a loop no lane enters. A parameter rather than a pipeline constant, so one
// pipeline serves both stores: llvmpipe generates each pipeline's code at its first
// dispatch, 10-15 s for a tiled kernel while Mesa's shader cache is cold.
fn store_y(i: u32, v: f32) {
    var s = v;
    for (var k = 0u; k < p.acc; k++) {
        s = y[i] + v;
    }
    y[i] = s;
}
