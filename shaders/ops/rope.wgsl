// Rotary position embedding, in place. Position of token t is step.pos + t.
// mode 0 (normal, llama): rotates pairs (2i, 2i + 1); mode 2 (NeoX, Gemma): pairs
// (i, i + n_rot / 2). Dimensions past n_rot are left as they are.
// theta_i = pos * freq_scale * freq_base^(-2i / n_rot)
//
// x: [head_dim, n_heads, n_tokens] f32; x2: [head_dim, n_heads2, n_tokens] f32, rotated in
// the same dispatch (a layer's K next to its Q: one dispatch fewer per layer)

struct Params {
    head_dim: u32,
    n_heads: u32,
    n_rot: u32,
    mode: u32,
    freq_base: f32,
    freq_scale: f32,
    n_heads2: u32, // heads of x2 (0: x only)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> x2: array<f32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_rot = p.n_rot / 2u;
    let i = gid.x % half_rot;
    let hh = gid.x / half_rot;
    let t = gid.y;
    if (hh >= p.n_heads + p.n_heads2 || t >= step.n_tokens) {
        return;
    }
    // Heads past x's are x2's.
    let second = hh >= p.n_heads;
    let h = select(hh, hh - p.n_heads, second);
    let n_heads = select(p.n_heads, p.n_heads2, second);
    let cs = rope_cs(step.pos + t, i, p.n_rot, p.freq_base, p.freq_scale);
    let c = cs.x;
    let s = cs.y;
    let ab = (t * n_heads + h) * p.head_dim + rope_pair(i, p.n_rot, p.mode);
    let a = ab.x;
    let b = ab.y;
    if (second) {
        let x0 = x2[a];
        let x1 = x2[b];
        x2[a] = x0 * c - x1 * s;
        x2[b] = x0 * s + x1 * c;
    } else {
        let x0 = x[a];
        let x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}
