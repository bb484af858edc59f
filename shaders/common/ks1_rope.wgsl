// The end of `mul_mat_ks1nr`, the single-token build of a layer's fused Q/K/V product
// (`ops::mul_mat::gpu_qkv_rope`): after the workgroup has stored its rows, it rotates
// its own heads of Q in place (normalising them first with HEAD_NORMS, Gemma 3's
// q_norm), rotates its heads of K on their way into the KV cache, and appends its rows
// of V, as `rope_store` and `rope_store_norm` would in a dispatch of their own. On
// CPU-hosted drivers each dispatch costs a decode step tens of microseconds whatever
// its size (docs/perf.md).
//
// The host makes each workgroup's rows whole heads (`wg_rows` a multiple of head_dim)
// and keeps the product in one part, so a workgroup reads back only rows it stored.
// Where V is a product of its own (`rp.v_apart`, recorded before this one), `y2` is
// its output and the workgroups share its rows. The parameters:
// common/rope_store_params.wgsl.

@group(0) @binding(9) var<uniform> rp: RopeStoreParams;
@group(0) @binding(10) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(11) var<storage, read_write> v_cache: array<u32>;
// The heads' norms' weights (bound, and unread, without HEAD_NORMS): uniforms, as
// rope_store_norm's.
@group(0) @binding(12) var<uniform> qw: array<vec4<f32>, 1024>;
@group(0) @binding(13) var<uniform> kw: array<vec4<f32>, 1024>;
// @begin tex
// The layer's kept cache textures (common/kv_tex.wgsl).
@group(0) @binding(14) var k_tex: texture_storage_2d<rgba32uint, write>;
@group(0) @binding(15) var v_tex: texture_storage_2d<rgba32uint, write>;
// @end tex

// Whether each head of Q and K is normalised before its rotation.
override HEAD_NORMS: bool = false;

// What element d of a Q (or K) head is scaled by before its rotation: its norm's
// weight times `inv`, 1 / the head's rms, with HEAD_NORMS.
fn q_scale(d: u32, inv: f32) -> f32 {
    if (!HEAD_NORMS) {
        return 1.0;
    }
    return inv * qw[d >> 2u][d & 3u];
}

fn k_scale(d: u32, inv: f32) -> f32 {
    if (!HEAD_NORMS) {
        return 1.0;
    }
    return inv * kw[d >> 2u][d & 3u];
}

// 1 / rms of the head whose sum of squares `s` the lanes hold, with HEAD_NORMS
// (uniform control flow: every lane calls it).
fn head_inv(s: f32) -> f32 {
    if (!HEAD_NORMS) {
        return 1.0;
    }
    return inverseSqrt(subgroupAdd(s) / f32(rp.head_dim) + rp.eps);
}

// The Q head at row h0 of `y`, rotated at `pos` in place. Each lane reads and writes
// only its own pairs, after the head's sum of squares is taken.
fn rope_q_head(h0: u32, l: u32, pos: u32) {
    var s = 0.0;
    for (var d = l; HEAD_NORMS && d < rp.head_dim; d += WG) {
        s += y[h0 + d] * y[h0 + d];
    }
    let inv = head_inv(s);
    for (var i = l; i < rp.n_rot / 2u; i += WG) {
        let cs = rope_cs(pos, i, rp.n_rot, rp.freq_base, rp.freq_scale);
        let ab = rope_pair(i, rp.n_rot, rp.mode);
        let x0 = y[h0 + ab.x] * q_scale(ab.x, inv);
        let x1 = y[h0 + ab.y] * q_scale(ab.y, inv);
        y[h0 + ab.x] = x0 * cs.x - x1 * cs.y;
        y[h0 + ab.y] = x0 * cs.y + x1 * cs.x;
    }
    for (var d = rp.n_rot + l; HEAD_NORMS && d < rp.head_dim; d += WG) {
        y[h0 + d] *= q_scale(d, inv);
    }
}

// Element d of the K head at `kb` in `y1` after its norm and rotation at `pos`, as
// rope_store_norm's `k_rotated`.
fn k_rotated(kb: u32, d: u32, pos: u32, inv: f32) -> f32 {
    if (d >= rp.n_rot) {
        return y1[kb + d] * k_scale(d, inv);
    }
    let i = select(d / 2u, d % (rp.n_rot / 2u), rp.mode == 2u);
    let ab = rope_pair(i, rp.n_rot, rp.mode);
    let cs = rope_cs(pos, i, rp.n_rot, rp.freq_base, rp.freq_scale);
    let x0 = y1[kb + ab.x] * k_scale(ab.x, inv);
    let x1 = y1[kb + ab.y] * k_scale(ab.y, inv);
    return select(x0 * cs.y + x1 * cs.x, x0 * cs.x - x1 * cs.y, d == ab.x);
}

// Dims d, d + 1 of that head as an f16 pair.
fn k_pair(kb: u32, d: u32, pos: u32, inv: f32) -> u32 {
    return pack2x16float(vec2<f32>(k_rotated(kb, d, pos, inv), k_rotated(kb, d + 1u, pos, inv)));
}

// The K head at `kb` (its first dim within the position's key) into the cache at
// `pos`: eight dims a lane, four cache words and a texel.
fn rope_k_head(kb: u32, l: u32, pos: u32) {
    var s = 0.0;
    for (var d = l; HEAD_NORMS && d < rp.head_dim; d += WG) {
        s += y1[kb + d] * y1[kb + d];
    }
    let inv = head_inv(s);
    for (var d = 8u * l; d < rp.head_dim; d += 8u * WG) {
        let w = vec4<u32>(k_pair(kb, d, pos, inv), k_pair(kb, d + 2u, pos, inv), k_pair(kb, d + 4u, pos, inv), k_pair(kb, d + 6u, pos, inv));
        let at = (pos * rp.kv_dim + kb + d) / 2u;
        k_cache[at] = w.x;
        k_cache[at + 1u] = w.y;
        k_cache[at + 2u] = w.z;
        k_cache[at + 3u] = w.w;
        // @begin tex
        tex_k(pos, kb + d, w, rp.kv_dim);
        // @end tex
    }
}

// Value i of position `pos` into its V cache row (and the row's texel).
fn store_v1(i: u32, v: f32, pos: u32) {
    let at = v_word(i, pos, rp.kv_dim);
    let old = unpack2x16float(v_cache[at]);
    v_cache[at] = pack2x16float(select(vec2<f32>(old.x, v), vec2<f32>(v, old.y), pos % 2u == 0u));
    // @begin tex
    tex_v(i, pos, rp.kv_dim);
    // @end tex
}

// The epilogue of workgroup `g` of `n_g`, which stored rows r0 .. r0 + nr (Q's rows
// first, then K's from p.seg1, then V's from p.seg2) for the step's one token. The
// loops' bounds are uniform: heads never straddle workgroups.
fn ks1_rope(r0: u32, nr: u32, l: u32, g: u32, n_g: u32) {
    // The lanes read back rows other lanes stored.
    storageBarrier();
    let pos = step.pos;
    let end = r0 + nr;
    for (var h0 = r0; h0 < min(end, p.seg1); h0 += rp.head_dim) {
        rope_q_head(h0, l, pos);
    }
    for (var h0 = max(r0, p.seg1); h0 < min(end, p.seg2); h0 += rp.head_dim) {
        rope_k_head(h0 - p.seg1, l, pos);
    }
    for (var r = max(r0, p.seg2) + l; r < min(end, p.seg_end); r += WG) {
        store_v1(r - p.seg2, y2[r - p.seg2], pos);
    }
    for (var i = g * WG + l; rp.v_apart != 0u && i < rp.kv_dim; i += n_g * WG) {
        store_v1(i, y2[i], pos);
    }
}
