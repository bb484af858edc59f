// Copies output tokens tok0 .. tok0 + tok_n of the activations into the buffer that
// `mul_mat_win` with uniform activations (`mul_mat_xu.wgsl`) then binds as a uniform.
// x: [n_cols, n_tokens] f32 as vec4s, column stride x_stride; xu: [n_cols, tok_n]

struct Params {
    x_stride: u32,  // vec4s per activation column
    tok0: u32,      // first output token to copy
    tok_n: u32,     // most tokens to copy (what fits the uniform buffer)
    last_only: u32, // 1: the only output token is the batch's last
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> xu: array<vec4<f32>>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let first = select(0u, step.n_tokens - 1u, p.last_only != 0u);
    let n_out = step.n_tokens - first;
    if (p.tok0 >= n_out) {
        return;
    }
    let n = min(p.tok_n, n_out - p.tok0) * p.x_stride;
    let i = gid.x;
    if (i >= n) {
        return;
    }
    xu[i] = x[(first + p.tok0) * p.x_stride + i];
}
