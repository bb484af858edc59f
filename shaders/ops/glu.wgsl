// Gated linear unit: out = act(gate) * up, act = SiLU (SwiGLU, llama) or GELU with the
// tanh approximation (GeGLU, Gemma).
//
// gate, up, out: [n, n_tokens] f32

struct Params {
    n: u32,   // elements per token
    act: u32, // 0: SiLU, 1: GELU (tanh)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> gate: array<f32>;
@group(0) @binding(3) var<storage, read> up: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

override WG: u32 = 64u;

fn gelu_tanh(x: f32) -> f32 {
    // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); tanh written through exp so
    // large |x| saturates instead of overflowing.
    let u = 0.7978845608 * (x + 0.044715 * x * x * x);
    let e = exp(-2.0 * abs(u));
    let th = sign(u) * (1.0 - e) / (1.0 + e);
    return 0.5 * x * (1.0 + th);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.n || t >= step.n_tokens) {
        return;
    }
    let k = t * p.n + i;
    let g = gate[k];
    var a: f32;
    if (p.act == 0u) {
        a = g / (1.0 + exp(-g));
    } else {
        a = gelu_tanh(g);
    }
    out[k] = a * up[k];
}
