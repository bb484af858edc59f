// The attention mask of `attn_scores` and `attn_decode` (their Params have `window`):
// keys after the query's position (the causal mask; this covers the row's padding past
// the cached positions too) and, with a sliding window, keys `window` or more behind it.
fn masked(j: u32, qpos: u32) -> bool {
    return j > qpos || (p.window > 0u && qpos - j >= p.window);
}

// The first key a query at `qpos` sees: past a sliding window's reach, the one `window`
// keys back (key qpos - window + 1); else key 0.
fn window_start(qpos: u32) -> u32 {
    return select(0u, qpos + 1u - p.window, p.window > 0u && qpos + 1u > p.window);
}
