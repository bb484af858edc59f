// Embedding lookup: out[:, t] = dequantize(W[:, ids[t]]) for the ids that fall in this
// part of W. One invocation per (32-element chunk, token).
//
// W: [n_cols, n_rows] rows row0 .. row0 + n_rows; ids: [n_tokens] u32; out: [n_cols, n_tokens] f32

struct Params {
    n_rows: u32,
    n_cols: u32,
    row_bytes: u32,
    row0: u32,
    scale: f32, // multiplies every value (Gemma scales its embeddings by sqrt(n_embd))
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let t = gid.y;
    if (c >= p.n_cols / 32u || t >= step.n_tokens) {
        return;
    }
    let id = ids[t];
    if (id < p.row0 || id >= p.row0 + p.n_rows) {
        return;
    }
    let v = decode32((id - p.row0) * p.row_bytes, c);
    let o = (t * p.n_cols) / 4u + c * 8u;
    for (var k = 0u; k < 8u; k++) {
        out[o + k] = v[k] * p.scale;
    }
}
