// Per-step values shared by every kernel of a forward pass, written once per step.
struct Step {
    n_tokens: u32, // tokens in this batch
    pos: u32,      // position of the batch's first token
    n_kv: u32,     // positions held in the KV cache after this batch (pos + n_tokens)
    _pad: u32,
}

// Row stride of the attention probabilities (attn_scores, softmax, attn_out): the
// cached positions rounded up to whole pairs of vec4s, so that `attn_decode` takes
// eight at a time. Entries past n_kv hold the mask.
fn probs_stride() -> u32 {
    return (step.n_kv + 7u) & ~7u;
}
