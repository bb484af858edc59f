// Per-step values shared by every kernel of a forward pass, written once per step.
struct Step {
    n_tokens: u32, // tokens in this batch
    pos: u32,      // position of the batch's first token
    n_kv: u32,     // positions held in the KV cache after this batch (pos + n_tokens)
    _pad: u32,
}
