// Gated linear unit: out = act(gate) * up (common/act.wgsl).
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

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.n || t >= step.n_tokens) {
        return;
    }
    let k = t * p.n + i;
    out[k] = glu_act(p.act, gate[k]) * up[k];
}
