// The join of `attn_decode`'s splits (SPLITS > 1, common/attn_split.wgsl): for each
// head, the splits' maxima give the row's, each split's sum and weighted sum are scaled
// to it, and out = the scaled weighted sums over the scaled sums. Each split's
// probabilities are rescaled alike, so that `probs` ends as the unsplit kernel leaves
// it (tools read it). One workgroup per head; Params and bindings 0 and 1 as
// `attn_decode`'s (common/attn_dec_params.wgsl).

@group(0) @binding(2) var<storage, read_write> probs: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> part: array<vec4<f32>>;

override WG: u32 = 64u;
const MAX_SPLITS: u32 = 16u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let h = wid.x;
    let d4 = p.head_dim / 4u;
    let qpos = step.pos;
    var mx = -3.0e38;
    for (var s = 0u; s < SPLITS; s++) {
        mx = max(mx, part[part_at(h, s, d4)].x);
    }
    // Each split's weight relative to the row's max, and their sum.
    var w: array<f32, MAX_SPLITS>;
    var total = 0.0;
    for (var s = 0u; s < SPLITS; s++) {
        let ml = part[part_at(h, s, d4)];
        w[s] = exp(ml.x - mx);
        total += w[s] * ml.y;
    }
    let inv = 1.0 / total;
    for (var dg = l; dg < d4; dg += WG) {
        var acc = vec4<f32>();
        for (var s = 0u; s < SPLITS; s++) {
            acc += w[s] * part[part_at(h, s, d4) + 1u + dg];
        }
        out[h * d4 + dg] = acc * inv;
    }
    let n4 = probs_stride() / 4u;
    let row = h * p.tn * n4;
    for (var s = 0u; s < SPLITS; s++) {
        let blocks = split_blocks(s, qpos, n4);
        let f = w[s] * inv;
        for (var j4 = 2u * blocks.x + l; j4 < 2u * blocks.y; j4 += WG) {
            probs[row + j4] *= f;
        }
    }
}
