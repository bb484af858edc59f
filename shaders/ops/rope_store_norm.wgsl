// `rope_store` with the per-head RMS norms before it (Gemma 3's q_norm and k_norm) in
// the same dispatch: three dispatches become one, and on CPU-hosted drivers each
// dispatch costs tens of microseconds whatever its size.
//
// One workgroup per head of one token: workgroups 0 .. n_heads take Q's heads,
// normalised and rotated in place; the next kv_dim / head_dim take K's, normalised and
// rotated on their way into the cache (k_new is left as it was), and store the head's
// V values as `kv_store` does. A head's sum of squares is one workgroup reduction; every
// lane reads the elements of its pairs only after it, so rotating in place races with
// no other lane's reads.
//
// Params and bindings 0-6: common/rope_store_io.wgsl; qw, kw: [head_dim] f32, the
// norms' weights.
// Uniforms, as a folded norm's weight (common/x_norm.wgsl): heads of up to 4096.
@group(0) @binding(7) var<uniform> qw: array<vec4<f32>, 1024>;
@group(0) @binding(8) var<uniform> kw: array<vec4<f32>, 1024>;
// @begin tex
// The `rope_store_norm_tex` build (common/kv_tex.wgsl): the layer's kept cache textures.
@group(0) @binding(9) var k_tex: texture_storage_2d<rgba32uint, write>;
@group(0) @binding(10) var v_tex: texture_storage_2d<rgba32uint, write>;

// Dims d, d + 1 of the normalised K head at `base` rotated at `pos`, as an f16 pair.
fn k_pair(base: u32, d: u32, pos: u32, inv: f32) -> u32 {
    return pack2x16float(vec2<f32>(k_rotated(base, d, pos, inv), k_rotated(base, d + 1u, pos, inv)));
}
// @end tex

// Lanes per workgroup (`ops::reduce_pipeline`): up to REDUCE_MAX_WG, or one subgroup
// with common/reduce_sg.wgsl.
override WG: u32 = 64u;
var<workgroup> partial: array<f32, REDUCE_MAX_WG>;

fn q_w(d: u32) -> f32 {
    return qw[d >> 2u][d & 3u];
}

fn k_w(d: u32) -> f32 {
    return kw[d >> 2u][d & 3u];
}

// Element d of the K head at `base` in k_new, normalised (`inv` is 1 / its rms).
fn k_normed(base: u32, d: u32, inv: f32) -> f32 {
    return k_new[base + d] * inv * k_w(d);
}

// As `k_rotated` in rope_store.wgsl, on the normalised head.
fn k_rotated(base: u32, d: u32, pos: u32, inv: f32) -> f32 {
    if (d >= p.n_rot) {
        return k_normed(base, d, inv);
    }
    let half_rot = p.n_rot / 2u;
    let i = select(d / 2u, d % half_rot, p.mode == 2u);
    let ab = rope_pair(i, p.n_rot, p.mode);
    let cs = rope_cs(pos, i, p.n_rot, p.freq_base, p.freq_scale);
    let x0 = k_normed(base, ab.x, inv);
    let x1 = k_normed(base, ab.y, inv);
    return select(x0 * cs.y + x1 * cs.x, x0 * cs.x - x1 * cs.y, d == ab.x);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;
    }
    let pos = step.pos + t;
    let hd = p.head_dim;
    // Uniform per workgroup. The loops below test it rather than branch on it: a
    // CPU-hosted driver runs both sides of a branch under lane masks, but skips a loop
    // no lane enters.
    let is_k = wid.x >= p.n_heads;
    let hk = wid.x - min(wid.x, p.n_heads);
    let qb = (t * p.n_heads + wid.x) * hd;
    let kb = t * p.kv_dim + hk * hd;

    var s = 0.0;
    for (var d = li; !is_k && d < hd; d += WG) {
        let v = q[qb + d];
        s += v * v;
    }
    for (var d = li; is_k && d < hd; d += WG) {
        let v = k_new[kb + d];
        s += v * v;
    }
    let inv = inverseSqrt(workgroup_sum(li, s) / f32(hd) + p.eps);

    // Q: each lane's pairs, then its elements past the rotation.
    let half_rot = p.n_rot / 2u;
    for (var i = li; !is_k && i < half_rot; i += WG) {
        let cs = rope_cs(pos, i, p.n_rot, p.freq_base, p.freq_scale);
        let ab = rope_pair(i, p.n_rot, p.mode);
        let x0 = q[qb + ab.x] * inv * q_w(ab.x);
        let x1 = q[qb + ab.y] * inv * q_w(ab.y);
        q[qb + ab.x] = x0 * cs.x - x1 * cs.y;
        q[qb + ab.y] = x0 * cs.y + x1 * cs.x;
    }
    for (var d = p.n_rot + li; !is_k && d < hd; d += WG) {
        q[qb + d] *= inv * q_w(d);
    }

    // K: the cache's pairs of neighbouring values; V as `kv_store` stores it.
    for (var d = 2u * li; is_k && d < hd; d += 2u * WG) {
        let k2 = vec2<f32>(k_rotated(kb, d, pos, inv), k_rotated(kb, d + 1u, pos, inv));
        k_cache[(pos * p.kv_dim + hk * hd + d) / 2u] = pack2x16float(k2);
    }
    for (var d = li; is_k && d < hd; d += WG) {
        store_v(hk * hd + d, t, p.kv_dim);
    }
    // @begin tex
    // A single token's key and value into the kept textures too, eight dims a texel.
    let one = step.n_tokens == 1u;
    for (var d = 8u * li; is_k && one && d < hd; d += 8u * WG) {
        let w = vec4<u32>(k_pair(kb, d, pos, inv), k_pair(kb, d + 2u, pos, inv), k_pair(kb, d + 4u, pos, inv), k_pair(kb, d + 6u, pos, inv));
        tex_k(pos, hk * hd + d, w, p.kv_dim);
    }
    for (var d = li; is_k && one && d < hd; d += WG) {
        tex_v(hk * hd + d, pos, p.kv_dim);
    }
    // @end tex
}
