// The gated activations of the feed-forward blocks (ops/glu.wgsl, and the GLU store of
// ops/mul_mat_ks1.wgsl): act = SiLU (SwiGLU, llama) or GELU with the tanh approximation
// (GeGLU, Gemma).

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

fn gelu_tanh(x: f32) -> f32 {
    // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); tanh written through exp so
    // large |x| saturates instead of overflowing.
    let u = 0.7978845608 * (x + 0.044715 * x * x * x);
    let e = exp(-2.0 * abs(u));
    let th = sign(u) * (1.0 - e) / (1.0 + e);
    return 0.5 * x * (1.0 + th);
}

// act(g) for `act` 0 (SiLU) or 1 (GELU), Rust `ops::glu::Activation`.
fn glu_act(act: u32, g: f32) -> f32 {
    return select(gelu_tanh(g), silu(g), act == 0u);
}
