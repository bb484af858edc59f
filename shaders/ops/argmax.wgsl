// Greedy sampling on the device: workgroup g finds the largest of logits
// g * span .. (g + 1) * span and writes its key and index, so a step reads back a few
// words per workgroup instead of every logit. The host picks the best of those.
//
// The same order as the host's `sampling::argmax`: NaN counts as -inf, -0 equals +0,
// and ties go to the lowest index. Logits are compared as order-preserving u32 keys, so
// no device flushes denormals or reorders NaNs differently.
//
// Each lane walks quads of four logits (`quad_keys`), WG quads apart. Two builds
// (`ops::argmax`): `argmax` reads the logits' buffer and its 64 lanes meet in a tree in
// workgroup memory (common/argmax_buffer.wgsl, common/argmax_tree.wgsl); `argmax_sg`,
// for CPU-hosted drivers, reads a texture the logits are copied into, and its
// workgroup is one subgroup (common/argmax_texture.wgsl, common/argmax_sg.wgsl).
//
// logits (binding 2): [n] f32, or their bytes in a texture; out: [groups] (key, index)

struct Params {
    n: u32,
    // Logits per workgroup, a multiple of four.
    span: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read_write> out: array<vec2<u32>>;

// Lanes per workgroup: a power of two (the tree halves it), or the subgroup size.
override WG: u32 = 64u;

// The key of the logit whose bits are `raw`: larger floats give larger keys; NaN and
// -inf share the smallest key a logit can have, 0x007fffff, so the key 0 (what
// `quad_keys` gives past the end) loses to every logit. Selects, not branches: a
// CPU-hosted driver runs both sides of a branch under lane masks.
fn key(raw: u32) -> u32 {
    let a = select(raw, 0xff800000u, (raw & 0x7fffffffu) > 0x7f800000u); // NaN: -inf
    let b = select(a, 0u, a == 0x80000000u); // -0: +0
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// The keys of the four raw logits `v`, quad j's, 0 for those at or past `end`.
fn keys_before(v: vec4<u32>, j: u32, end: u32) -> vec4<u32> {
    let i = vec4<u32>(4u * j) + vec4<u32>(0u, 1u, 2u, 3u);
    let k = vec4<u32>(key(v.x), key(v.y), key(v.z), key(v.w));
    return select(vec4<u32>(0u), k, i < vec4<u32>(end));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    // (Every kernel binds the step; one without tokens has no logits to sample.)
    if (step.n_tokens == 0u) {
        return;
    }
    let start = wid.x * p.span;
    let end = min(start + p.span, p.n);
    var bk = 0u;
    var bi = 0xffffffffu;
    // Each lane's quads come in order, so a strictly larger key keeps the first of ties,
    // and within a quad the first of its largest.
    for (var j = start / 4u + l; j < (end + 3u) / 4u; j += WG) {
        let k = quad_keys(j, end);
        let m = max(max(k.x, k.y), max(k.z, k.w));
        let c = select(select(select(3u, 2u, k.z == m), 1u, k.y == m), 0u, k.x == m);
        let better = m > bk;
        bk = select(bk, m, better);
        bi = select(bi, 4u * j + c, better);
    }
    let best = workgroup_best(l, bk, bi);
    if (l == 0u) {
        out[wid.x] = best;
    }
}
