// How `attn_decode` splits a step's keys over workgroups (SPLITS of them per group of
// heads), and where each leaves its partial softmax for `attn_decode_join`. Split s of
// a row takes a contiguous share of the eight-key blocks its token sees; empty where
// the row has fewer blocks than splits.

// Splits of each group of heads' keys (1: the kernel normalises in place).
override SPLITS: u32 = 1u;

// Blocks of eight keys [x, y) of split s for the token at qpos, whose row of
// probabilities holds n4 vec4s.
fn split_blocks(s: u32, qpos: u32, n4: u32) -> vec2<u32> {
    let b0 = window_start(qpos) / 8u;
    let b1 = n4 / 2u;
    let share = (b1 - b0 + SPLITS - 1u) / SPLITS;
    return vec2<u32>(min(b1, b0 + s * share), min(b1, b0 + (s + 1u) * share));
}

// Where head h's split s leaves its max and sum (one vec4, then d4 vec4s of its
// weighted sum) in `part`.
fn part_at(h: u32, s: u32, d4: u32) -> u32 {
    return (h * SPLITS + s) * (d4 + 1u);
}
