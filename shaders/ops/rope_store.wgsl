// A layer's RoPE and its append to the KV cache in one dispatch (`rope` and `kv_store`
// in two): Q is rotated in place, K is rotated on its way into the cache (each
// invocation reads the unrotated pair partners it needs, so no invocation waits for
// another), and V is stored as `kv_store` stores it.
//
// Params and bindings 0-6: common/rope_store_io.wgsl.

override WG: u32 = 64u;

// @begin tex
// The `rope_store_tex` build (common/kv_tex.wgsl): the layer's kept cache textures.
@group(0) @binding(7) var k_tex: texture_storage_2d<rgba32uint, write>;
@group(0) @binding(8) var v_tex: texture_storage_2d<rgba32uint, write>;

// Dims d, d + 1 of the K head at `base` rotated at `pos`, as an f16 pair.
fn k_pair(base: u32, d: u32, pos: u32) -> u32 {
    return pack2x16float(vec2<f32>(k_rotated(base, d, pos), k_rotated(base, d + 1u, pos)));
}
// @end tex

// Element d (of a head starting at `base` in k_new) after the rotation at `pos`.
fn k_rotated(base: u32, d: u32, pos: u32) -> f32 {
    if (d >= p.n_rot) {
        return k_new[base + d];
    }
    let half_rot = p.n_rot / 2u;
    let i = select(d / 2u, d % half_rot, p.mode == 2u);
    let ab = rope_pair(i, p.n_rot, p.mode);
    let cs = rope_cs(pos, i, p.n_rot, p.freq_base, p.freq_scale);
    let x0 = k_new[base + ab.x];
    let x1 = k_new[base + ab.y];
    return select(x0 * cs.y + x1 * cs.x, x0 * cs.x - x1 * cs.y, d == ab.x);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    // Invocation g rotates Q's pair g and stores K/V value g, where they exist: one
    // range for both, as CPU-hosted drivers run both sides of every branch.
    let g = gid.x;
    let t = gid.y;
    let half_rot = p.n_rot / 2u;
    if (g < half_rot * p.n_heads && t < step.n_tokens) {
        let i = g % half_rot;
        let cs = rope_cs(step.pos + t, i, p.n_rot, p.freq_base, p.freq_scale);
        let ab = (t * p.n_heads + g / half_rot) * p.head_dim + rope_pair(i, p.n_rot, p.mode);
        let x0 = q[ab.x];
        let x1 = q[ab.y];
        q[ab.x] = x0 * cs.x - x1 * cs.y;
        q[ab.y] = x0 * cs.y + x1 * cs.x;
    }
    if (g >= p.kv_dim) {
        return;
    }
    if (t < step.n_tokens && (g & 1u) == 0u) {
        let d = g % p.head_dim;
        let base = t * p.kv_dim + g - d;
        let pos = step.pos + t;
        let k2 = vec2<f32>(k_rotated(base, d, pos), k_rotated(base, d + 1u, pos));
        k_cache[(pos * p.kv_dim + g) / 2u] = pack2x16float(k2);
    }
    // @begin tex
    // A single token's key, a texel of eight dims (8g ..) per invocation: a loop of zero
    // or one trips, which the lanes past the key's texels skip.
    for (var e = 8u * g; step.n_tokens == 1u && e < p.kv_dim; e += p.kv_dim) {
        let d = e % p.head_dim;
        let base = e - d;
        let pos = step.pos;
        let w = vec4<u32>(k_pair(base, d, pos), k_pair(base, d + 2u, pos), k_pair(base, d + 4u, pos), k_pair(base, d + 6u, pos));
        tex_k(pos, e, w, p.kv_dim);
    }
    // @end tex
    store_v(g, t, p.kv_dim);
    // @begin tex
    // A loop of zero or one trips, which batches skip (a branch would run under lane
    // masks on CPU-hosted drivers).
    for (var one = step.n_tokens == 1u; one; one = false) {
        tex_v(g, step.pos, p.kv_dim);
    }
    // @end tex
}
