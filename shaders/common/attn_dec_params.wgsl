// The parameters of `attn_decode` and `attn_decode_join` (Rust `attention::DecodeParams`)
// and the bindings both take them at.

struct Params {
    head_dim: u32,
    n_head: u32,
    n_head_kv: u32,
    window: u32, // 0: no sliding window
    scale: f32,
    _pad0: u32,
    tn: u32, // rows per head in `probs`
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
