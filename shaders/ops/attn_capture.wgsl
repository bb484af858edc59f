// Keep one layer's attention probabilities of the batch's last token, for tools that
// show where the model looked: capture[h, j] = probs[j, n_tokens - 1, h]. The probs
// hold the batch's last chunk of tn tokens, chunks starting at multiples of tn.
//
// probs: [probs_stride(), tn, n_head]; capture: [n_ctx, n_head] (this layer's slice)

struct Params {
    n_head: u32,
    n_ctx: u32,
    offset: u32, // first float of this layer's slice in `capture`
    tn: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> probs: array<f32>;
@group(0) @binding(3) var<storage, read_write> capture: array<f32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let h = gid.y;
    if (j >= p.n_ctx || h >= p.n_head) {
        return;
    }
    var v = 0.0;
    if (j < step.n_kv) {
        v = probs[(h * p.tn + (step.n_tokens - 1u) % p.tn) * probs_stride() + j];
    }
    capture[p.offset + h * p.n_ctx + j] = v;
}
