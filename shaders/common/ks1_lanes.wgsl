// What the two `mul_mat_ks1` kernels (ops/mul_mat_ks1.wgsl and, for batches of the
// integer-dotted types, ops/mul_mat_ks1i.wgsl) share: their workgroup shape, which
// chunks of a row each lane holds, and the norm they may fold in (common/x_norm.wgsl,
// common/x_plain.wgsl). Bindings as `mul_mat_ks`, and the norm's weight at 8 with NORM.

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// Lanes per workgroup: the device's subgroup size.
override WG: u32 = 8u;
// Rows per workgroup: the host's choice per product (`ops::mul_mat::ks1_rows`), a
// multiple of 2 WG, so that a GLU store's blocks of gate and up rows stay whole.
fn wg_rows() -> u32 {
    return p.wg_rows;
}
// Chunks per lane, 1 to 8: the fewest that cover a row
// (`ops::mul_mat::ks1_slots`).
// The host drops the lines of the slots past SLOTS from the source (their `@slot k`
// marks, see `row_dot` in ops/mul_mat_ks1.wgsl).
override SLOTS: u32 = 3u;
// Lane l holds chunks l * SLOTS .. (a contiguous run) rather than l, l + WG, ..; as
// `RUNS` in `mul_mat_ks`.
override RUNS: bool = true;
// Rows a single token's subgroup dots at once, 1, 2 or 4, each on WG / GROUPS lanes
// (`ops::mul_mat::ks1_shape`): a row whose chunks leave lanes idle in its last slot
// keeps them busy with the next row's (SmolLM2's 18 chunks: 3 slots of 8 lanes hold 24
// where 5 slots of 4 lanes hold 20). Lanes l and l + WG / GROUPS hold the same chunks.
// The batch builds keep 1.
override GROUPS: u32 = 1u;

// Subgroups per workgroup, each holding its part of a row: 1, or with the `split`
// region of ops/mul_mat_ks1.wgsl (single tokens of rows past 8 * WG chunks), more; then
// GROUPS is 1 and there is no NORM.
override SPLIT: u32 = 1u;

// Lanes per row ([`GROUPS`], [`SPLIT`]).
fn row_lanes() -> u32 {
    return WG * SPLIT / GROUPS;
}

// The first chunk of the slice of a row that a single token's lanes hold now, past
// p.chunk0, where they walk the row in slices (`SLICED` in ops/mul_mat_ks1.wgsl); 0
// in every other build.
var<private> slice0: u32;

// Lane l's k-th chunk of the n_chunks from p.chunk0 + slice0 (the whole row, or a
// batch's slice of it, or a single token's): its index in the row, and whether it is
// in the slice.
fn slot_chunk(k: u32, l: u32, n_chunks: u32) -> vec2<u32> {
    let lr = l % row_lanes();
    let want = select(lr + k * row_lanes(), lr * SLOTS + k, RUNS);
    return vec2<u32>(p.chunk0 + slice0 + min(want, n_chunks - 1u), u32(want < n_chunks));
}

// Chunk c of the activations times `inv` and the norm's weight, with NORM.
fn normed(x: array<vec4<f32>, 8>, c: u32, inv: f32) -> array<vec4<f32>, 8> {
    if (!NORM) {
        return x;
    }
    let i = c * 8u;
    return array<vec4<f32>, 8>(
        x[0] * inv * norm_w(i), x[1] * inv * norm_w(i + 1u),
        x[2] * inv * norm_w(i + 2u), x[3] * inv * norm_w(i + 3u),
        x[4] * inv * norm_w(i + 4u), x[5] * inv * norm_w(i + 5u),
        x[6] * inv * norm_w(i + 6u), x[7] * inv * norm_w(i + 7u),
    );
}

// With NORM, 1 / rms of output token t's activations: the lanes' slots are the whole
// row (GROUPS times over), so its sum of squares is one `subgroupAdd` (uniform control
// flow: every lane calls it). 1 without.
fn norm_inv(first: u32, t: u32, l: u32, n_chunks: u32) -> f32 {
    if (!NORM) {
        return 1.0;
    }
    var sq = 0.0;
    for (var k = 0u; k < SLOTS; k++) {
        let c = slot_chunk(k, l, n_chunks);
        let x = x_chunk(first, t, c.x);
        let s = x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3]
            + x[4] * x[4] + x[5] * x[5] + x[6] * x[6] + x[7] * x[7];
        sq += f32(c.y) * (s.x + s.y + s.z + s.w);
    }
    return inverseSqrt(subgroupAdd(sq) / f32(GROUPS * p.n_cols) + p.norm_eps);
}

// `subgroupAdd(v)` for the rows' sums. llvmpipe adds a subgroup's lanes in a scalar loop
// that reads each lane's value back from the stack; where that loop is the value's only
// use, LLVM moves the arithmetic that makes the value (a chunk's scales, the slots' sum)
// into the loop, lane by lane: for Q5_0 the scale's f16 conversion and two multiplies
// per slot, eight times per row. Each sum is also added into `kept`, which `keep_lanes`
// stores where no step ever reaches: a second use, so the arithmetic stays in vector
// registers.
var<private> kept: vec4<f32>;

fn lane_sum(v: f32) -> f32 {
    kept.x += v;
    return subgroupAdd(v);
}

fn lane_sum4(v: vec4<f32>) -> vec4<f32> {
    kept += v;
    return subgroupAdd(v);
}

// The end of a kernel that sums with `lane_sum`: p.glu is 0, 1 or 2 (common/act.wgsl),
// never all ones, but the compiler cannot know.
fn keep_lanes() {
    if (p.glu == 0xffffffffu) {
        store_y(0u, kept.x + kept.y + kept.z + kept.w);
    }
}
