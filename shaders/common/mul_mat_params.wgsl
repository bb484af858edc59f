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
    _pad0: u32,
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
    _pad1: u32,
}

// true: the product is added to y (the residual stream) instead of replacing it, which
// saves the separate add and its dispatch.
override ACC: bool = false;

fn store_y(i: u32, v: f32) {
    if (ACC) {
        y[i] += v;
    } else {
        y[i] = v;
    }
}
