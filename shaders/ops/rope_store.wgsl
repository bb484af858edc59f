// A layer's RoPE and its append to the KV cache in one dispatch (`rope` and `kv_store`
// in two): Q is rotated in place, K is rotated on its way into the cache (each
// invocation reads the unrotated pair partners it needs, so no invocation waits for
// another), and V is stored as `kv_store` stores it.
//
// Params and bindings 0-6: common/rope_store_io.wgsl.

override WG: u32 = 64u;

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
    store_v(g, t, p.kv_dim, p.stride);
}
