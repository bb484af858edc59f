// Attention of a single-token step in one dispatch: the scores, their softmax and the
// weighted sum of values that `attn_scores`, `softmax` and `attn_out` compute in three.
// One workgroup per HG query heads of one K/V head, exactly one subgroup of WG lanes, so
// the softmax's max and sum are subgroup operations and one barrier separates the
// probabilities from their use.
// The probabilities are left in `probs` as the three kernels leave them (tools read them).
//
// q: [head_dim, n_head] f32; k_cache: [head_dim, n_head_kv, n_ctx] f16, four halves per
// vec2<u32>; v_cache: f16 in blocks of eight positions (common/v_layout.wgsl), four per
// vec2<u32>
// probs: [probs_stride(), tn, n_head] f32 (this step's token is row 0 of each head)
// out: [head_dim, n_head] f32
//
// q and the caches are read through `dq`, `dk` and `dv8`: from their storage buffers
// (common/attn_dec_buffer.wgsl), or q as a uniform and K and V from the textures the
// step copied them into (common/attn_dec_texture.wgsl, the `attn_decode_tex` build).
//
// With SPLITS > 1 (common/attn_split.wgsl) each group of heads' keys are split over
// SPLITS workgroups, so that a long context keeps every core busy: each normalises
// nothing, leaves its probabilities relative to its own max, and writes that max, its
// sum and its weighted sum to `part`; `attn_decode_join` combines them.

// Params and bindings 0 and 1: common/attn_dec_params.wgsl.

@group(0) @binding(5) var<storage, read_write> probs: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> part: array<vec4<f32>>;

// Lanes per workgroup: the device's subgroup size.
override WG: u32 = 8u;
// Query heads per workgroup, consecutive heads of one K/V head (`ops::attention`'s
// `decode_heads`): each key's and value's loads serve all of them. At most MAX_HG.
override HG: u32 = 1u;
const MAX_HG: u32 = 4u;

fn half4(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// Eight consecutive positions of one value row (`dv8`): 0-3 and 4-7.
struct V8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    // Workgroup x is group x % n_groups, split x / n_groups.
    let n_groups = p.n_head / HG;
    let split = wid.x / n_groups;
    let h0 = (wid.x % n_groups) * HG;
    let hkv = h0 / (p.n_head / p.n_head_kv);
    let d4 = p.head_dim / 4u;
    let qpos = step.pos;
    let n4 = probs_stride() / 4u;
    // Head h0 + g's row of probabilities starts at row0 + g * hrow.
    let hrow = p.tn * n4;
    let row0 = h0 * hrow;
    // A sliding window's layer reads only the keys it sees, from the eight-key block
    // that holds the first of them (`window_start`); the row's entries before that
    // block are zero, as the three kernels leave them.
    let s8 = window_start(qpos) / 8u;
    for (var g = 0u; g < HG && split == 0u; g++) {
        for (var j4 = l; j4 < 2u * s8; j4 += WG) {
            probs[row0 + g * hrow + j4] = vec4<f32>();
        }
    }
    // This split's vec4s of keys [a4, e4).
    let blocks = split_blocks(split, qpos, n4);
    let a4 = 2u * blocks.x;
    let e4 = 2u * blocks.y;
    // Scores, four keys per vec4 of the row; lane l takes vec4s l, l + WG, ... and
    // each key load serves the HG heads, each q load its four keys.
    var m: array<f32, MAX_HG>;
    for (var g = 0u; g < HG; g++) {
        m[g] = -3.0e38;
    }
    for (var j4 = a4 + l; j4 < e4; j4 += WG) {
        var kb: array<u32, 4>;
        for (var k = 0u; k < 4u; k++) {
            kb[k] = (min(4u * j4 + k, step.n_kv - 1u) * p.n_head_kv + hkv) * d4;
        }
        var s: array<vec4<f32>, MAX_HG>;
        if ((d4 & 1u) == 0u) {
            // Eight dimensions at a time: a key's rows start on whole texels, and one
            // load of each (`dk8`) serves two vec4s of q.
            for (var i = 0u; i < d4; i += 2u) {
                let k0 = dk8(kb[0] + i);
                let k1 = dk8(kb[1] + i);
                let k2 = dk8(kb[2] + i);
                let k3 = dk8(kb[3] + i);
                for (var g = 0u; g < HG; g++) {
                    let q0 = dq((h0 + g) * d4 + i);
                    let q1 = dq((h0 + g) * d4 + i + 1u);
                    s[g] += vec4<f32>(
                        dot(q0, k0[0]) + dot(q1, k0[1]),
                        dot(q0, k1[0]) + dot(q1, k1[1]),
                        dot(q0, k2[0]) + dot(q1, k2[1]),
                        dot(q0, k3[0]) + dot(q1, k3[1]),
                    );
                }
            }
        } else {
            for (var i = 0u; i < d4; i++) {
                let k0 = dk(kb[0] + i);
                let k1 = dk(kb[1] + i);
                let k2 = dk(kb[2] + i);
                let k3 = dk(kb[3] + i);
                for (var g = 0u; g < HG; g++) {
                    let qv = dq((h0 + g) * d4 + i);
                    s[g] += vec4<f32>(dot(qv, k0), dot(qv, k1), dot(qv, k2), dot(qv, k3));
                }
            }
        }
        let j = 4u * j4;
        let mask = vec4<bool>(masked(j, qpos), masked(j + 1u, qpos), masked(j + 2u, qpos), masked(j + 3u, qpos));
        for (var g = 0u; g < HG; g++) {
            let sm = select(s[g] * p.scale, vec4<f32>(-1.0e30), mask);
            probs[row0 + g * hrow + j4] = sm;
            m[g] = max(m[g], max(max(sm.x, sm.y), max(sm.z, sm.w)));
        }
    }
    // Softmax over each head's row: each lane rereads the entries it wrote. Splits
    // keep their share relative to its own max and leave the normalising to the join.
    for (var g = 0u; g < HG; g++) {
        let row = row0 + g * hrow;
        let mx = subgroupMax(m[g]);
        var sum = 0.0;
        for (var j4 = a4 + l; j4 < e4; j4 += WG) {
            let e = exp(probs[row + j4] - mx);
            probs[row + j4] = e;
            sum += e.x + e.y + e.z + e.w;
        }
        let total = subgroupAdd(sum);
        if (SPLITS > 1u) {
            if (l == 0u) {
                part[part_at(h0 + g, split, d4)] = vec4<f32>(mx, total, 0.0, 0.0);
            }
            continue;
        }
        let inv = 1.0 / total;
        for (var j4 = a4 + l; j4 < e4; j4 += WG) {
            probs[row + j4] *= inv;
        }
    }
    storageBarrier();
    // Weighted sum: lane l takes dimensions 4 l, 4 (l + WG), ... over every key, eight
    // positions (two vec4s of probabilities) at a time, each value load serving the HG
    // heads: the cache holds whole blocks of eight positions, and its entries past n_kv
    // weigh 0. The loop is a plain count of pairs:
    // written with a guarded second vec4 (`select(.., j4 + 1 < n4)`), lavapipe (Mesa
    // 22.3) built a new shader for nearly every dispatch of this kernel on Gemma 3, its
    // JIT regions held near a thousand, 2-2.5 ms per dispatch (docs/perf.md;
    // tests/driver_compiles.rs counts them).
    for (var dg = l; dg < d4; dg += WG) {
        let d = hkv * p.head_dim + 4u * dg;
        var acc: array<vec4<f32>, MAX_HG>;
        for (var j4 = a4; j4 < e4; j4 += 2u) {
            let j8 = j4 / 2u;
            let v0 = dv8(d, j8);
            let v1 = dv8(d + 1u, j8);
            let v2 = dv8(d + 2u, j8);
            let v3 = dv8(d + 3u, j8);
            let lo = mat4x4<f32>(v0.lo, v1.lo, v2.lo, v3.lo);
            let hi = mat4x4<f32>(v0.hi, v1.hi, v2.hi, v3.hi);
            for (var g = 0u; g < HG; g++) {
                let row = row0 + g * hrow;
                acc[g] += probs[row + j4] * lo + probs[row + j4 + 1u] * hi;
            }
        }
        for (var g = 0u; g < HG; g++) {
            if (SPLITS > 1u) {
                part[part_at(h0 + g, split, d4) + 1u + dg] = acc[g];
            } else {
                out[(h0 + g) * d4 + dg] = acc[g];
            }
        }
    }
}
