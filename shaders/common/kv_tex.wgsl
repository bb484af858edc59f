// @begin tex
// A single token's key and value written into its layer's kept cache textures
// (`ops::attention::AttnTextures`, the `_tex` builds of `rope_store` and
// `rope_store_norm`, and the `_kvtex` builds of `mul_mat_ks1nr` and `mul_mat_ks1unr`,
// common/ks1_rope.wgsl), so that the step records no copy into them: on lavapipe each
// copy command and the compute pass it splits cost a decode step more than its bytes
// (docs/perf.md). K's texture holds the K cache's bytes row-major (eight halves per
// texel, `scratch_xy`), and V's its buffer's bytes the same way (common/v_layout.wgsl).
// The including kernel declares `k_tex` and `v_tex` (write-only) and binds `v_cache`.

// Dims i .. i + 7 (i a multiple of 8) of position pos's key of `kv_dim` dims, as f16
// pairs.
fn tex_k(pos: u32, i: u32, w: vec4<u32>, kv_dim: u32) {
    textureStore(k_tex, scratch_xy((pos * kv_dim + i) / 8u), w);
}

// Value row i's texel that holds position pos (of kv_dim rows), read back from the V
// cache, which holds this step's value (stored by this invocation) and the earlier
// positions'.
fn tex_v(i: u32, pos: u32, kv_dim: u32) {
    let t = v_texel(i, pos, kv_dim);
    let at = 4u * t;
    let w = vec4<u32>(v_cache[at], v_cache[at + 1u], v_cache[at + 2u], v_cache[at + 3u]);
    textureStore(v_tex, scratch_xy(t), w);
}
// @end tex
