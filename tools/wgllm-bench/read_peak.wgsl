// Read-bandwidth probes: each entry point reads `src` in a different pattern and folds
// what it read into one word per invocation so the loads cannot be removed.
//
// src4 / src1: the same buffer seen as [n_vec4] vec4<u32> and [4 * n_vec4] u32.
// out: [n_inv] u32, one word per invocation.

struct Params {
    per_inv: u32, // vec4s (or u32s for `run_u32`) each invocation reads
    n_inv: u32,   // invocations that read
    n_vec4: u32,  // vec4s in src
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src4: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src1: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<uniform> ubo: array<vec4<u32>, 4096>;

override WG: u32 = 64u;

fn fold(v: vec4<u32>) -> u32 {
    return v.x ^ v.y ^ v.z ^ v.w;
}

// Each invocation walks its own contiguous run of vec4s.
@compute @workgroup_size(WG)
fn run_vec4(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var acc = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k++) {
        acc += src4[base + k];
    }
    out[i] = fold(acc);
}

// The same run, four loads per iteration.
@compute @workgroup_size(WG)
fn run_vec4_x4(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var a = vec4<u32>();
    var b = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k += 4u) {
        let j = base + k;
        a += src4[j] + src4[j + 1u];
        b += src4[j + 2u] + src4[j + 3u];
    }
    out[i] = fold(a + b);
}

// Each invocation walks its own contiguous run of single words.
@compute @workgroup_size(WG)
fn run_u32(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var acc = 0u;
    for (var k = 0u; k < p.per_inv; k++) {
        acc += src1[base + k];
    }
    out[i] = acc;
}

// Neighbouring invocations read neighbouring vec4s (coalesced on a GPU).
@compute @workgroup_size(WG)
fn strided_vec4(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (i >= p.n_inv) {
        return;
    }
    var acc = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k++) {
        acc += src4[k * p.n_inv + i];
    }
    out[i] = fold(acc);
}

// Every invocation of a workgroup reads the same address (one run per workgroup).
@compute @workgroup_size(WG)
fn same_addr_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let i = wid.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var acc = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k++) {
        acc += src4[base + k];
    }
    out[i * WG + l] = fold(acc);
}

// Loads from a 64 KiB uniform buffer (per-lane addresses), for the cost of a uniform
// gather; the bytes counted are those the loads return, mostly from cache.
@compute @workgroup_size(WG)
fn ubo_vec4(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var acc = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k++) {
        acc += ubo[(base + k) & 4095u];
    }
    out[i] = fold(acc);
}

// The same uniform buffer read at one address per workgroup (uniform across its lanes):
// a driver that sees the offset is the same for every lane loads it once.
@compute @workgroup_size(WG)
fn ubo_same_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let i = wid.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var acc = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k++) {
        acc += ubo[(base + k) & 4095u];
    }
    out[i * WG + l] = fold(acc);
}

// The same per-invocation runs as `run_vec4`, read from an rgba32uint texture (TEX_W
// texels wide, row-major) with textureLoad: CPU-hosted drivers gather texels with SIMD
// loads, while storage loads are a loop over the lanes.
@group(0) @binding(5) var tex: texture_2d<u32>;
const TEX_W: u32 = 4096u;

fn texel(i: u32) -> vec4<u32> {
    return textureLoad(tex, vec2<u32>(i & (TEX_W - 1u), i / TEX_W), 0);
}

@compute @workgroup_size(WG)
fn tex_vec4(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var acc = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k++) {
        acc += texel(base + k);
    }
    out[i] = fold(acc);
}

@compute @workgroup_size(WG)
fn tex_vec4_x4(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var a = vec4<u32>();
    var b = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k += 4u) {
        let j = base + k;
        a += texel(j) + texel(j + 1u);
        b += texel(j + 2u) + texel(j + 3u);
    }
    out[i] = fold(a + b);
}

// The same runs read from the texture bound as a read-only storage texture, as the
// kernels bind their weight textures: no sampler state, no mip levels (CPU-hosted
// drivers address such a load with the one row stride, inline).
@group(0) @binding(6) var img: texture_storage_2d<rgba32uint, read>;

fn img_texel(i: u32) -> vec4<u32> {
    return textureLoad(img, vec2<u32>(i & (TEX_W - 1u), i / TEX_W));
}

@compute @workgroup_size(WG)
fn img_vec4(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var acc = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k++) {
        acc += img_texel(base + k);
    }
    out[i] = fold(acc);
}

@compute @workgroup_size(WG)
fn img_vec4_x4(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (i >= p.n_inv) {
        return;
    }
    let base = i * p.per_inv;
    var a = vec4<u32>();
    var b = vec4<u32>();
    for (var k = 0u; k < p.per_inv; k += 4u) {
        let j = base + k;
        a += img_texel(j) + img_texel(j + 1u);
        b += img_texel(j + 2u) + img_texel(j + 3u);
    }
    out[i] = fold(a + b);
}
