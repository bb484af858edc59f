// mul_mat with the row's chunks split across one subgroup: a workgroup is exactly one
// subgroup of WG lanes and owns ROWS consecutive rows. Each lane decodes its share of
// the chunks of every row (`lane_walk`), so the chunk of activations it loads serves all
// ROWS rows;
// the lanes' partial sums are then added with subgroupAdd (no workgroup memory, no
// barrier). On CPU-hosted drivers every storage load is a per-lane loop, so loading
// each activation once per ROWS rows is what makes this fast there.
//
// Batches run in tiles of TILE tokens, each decoded chunk serving the whole tile (the
// last tile may be short); a single token, or one left over, runs alone. Both are loops with uniform trip counts, so the
// path a step does not take costs nothing (a CPU driver runs both sides of a branch).
// Activations come through `xv`, from storage (`mul_mat_xs.wgsl`) or from a uniform
// copy of output tokens tok0 .. tok0 + tok_n (`mul_mat_xu.wgsl`).
//
// Params: common/mul_mat_params.wgsl.
//
// W: [n_cols, n_rows] (this binding holds rows row0 .. row0 + n_rows of the tensor)
// x: [n_cols, n_tokens] f32, column stride x_stride (in vec4s)
// y: [y_stride, n_tokens] f32; row r of this part lands at y[t * y_stride + row0 + r]
//    (or in y1 / y2 for fused products: `store_out`)

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// Lanes per workgroup: the device's subgroup size, so one workgroup is one subgroup.
override WG: u32 = 8u;
// Rows per workgroup. Measured on lavapipe (model pp64 / tg32, back to back): 64 rows
// were 1.2-1.3x faster than 16 on both models, 32 in between, 128 no better; fewer,
// longer workgroups share each activation load more widely and pay llvmpipe's
// per-workgroup start less often. The loops over rows keep a variable trip count:
// a constant one (unrolled) was 1.5-2x slower.
const ROWS: u32 = 64u;
// `ks_rows` (common/x_chunk.wgsl) asks each kernel for its rows per workgroup.
fn wg_rows() -> u32 {
    return ROWS;
}
// Single tokens walk chunk pairs (`wdot64_pre`): for types whose neighbouring chunks share
// words (Q4_K's and Q5_K's paired nibbles, Q6_K's high bits and scales); others walk
// single chunks, which keeps more lanes busy on short rows.
override PAIRED: bool = false;
// How a single token's lanes share a row's chunks (pairs): in RUNS, lane l walks the
// l-th of WG contiguous runs; otherwise chunks l, l + WG, ... A gather of the WG lanes
// then touches WG cache lines of a row instead of two when a chunk's quants are 16 bytes,
// so the misses of rows that are not cached overlap. Measured on lavapipe, batch 1,
// alternated: Q4_0 at 8B shapes 24-30 -> 9-16 ms, SmolLM2's Q4_1 1536-column product
// 15.7-16.0 -> 8.7-10.0 ms per decode step; Q8_0, whose 32-byte chunks already span
// four lines, 1.1-1.8x slower in runs, so its host sets RUNS off (`ops::mul_mat`).
override RUNS: bool = true;
// Tokens per tile (two vec4 accumulators per row).
const TILE: u32 = 8u;
// Whether this build runs tiles at all. Off, every token runs alone: the build for
// steps of one to four tokens, whose tile loop would not run. llvmpipe takes about 3 s
// to JIT the tile loop's 128 accumulators (LLVM 15's coroutine pass on llvmpipe's
// compute shaders; 11 s while they were zeroed inside the loop), against 1-2 s for the
// rest, and it compiles a kernel on its first dispatch: a build without tiles keeps
// that off short prompts and decoding.
override TILES: bool = true;

// Lane l's share of the items begin .. end as (first, end, step), per RUNS.
fn lane_walk(begin: u32, end: u32, l: u32) -> vec3<u32> {
    if (!RUNS) {
        return vec3<u32>(begin + l, end, WG);
    }
    let run = (end - begin + WG - 1u) / WG;
    let a = min(begin + l * run, end);
    return vec3<u32>(a, min(a + run, end), 1u);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) l: u32,
) {
    // Uniform per workgroup, so every lane reaches the subgroupAdds below.
    let w = ks_rows(wid, nwg);
    if (w.r0 >= p.n_rows) {
        return;
    }
    let r0 = w.r0;
    let nr = w.nr;
    let n_chunks = p.n_cols / 32u;
    let first = w.first;
    let n_out = w.n_out;
    let out0 = p.row0 + r0;
    var t = w.t0;
    // Five to seven tokens left over run as one short tile, which computes the missing
    // tokens from whatever the activation buffer holds and does not store them: a tile
    // costs about what four single tokens do (measured on lavapipe, pp3-pp15). The bound
    // keeps the `t + TILE <= end` form; `t + 1 < n_out` made every tile 1.3x slower.
    let rem = select(0u, (n_out - t) % TILE, n_out > t);
    let tiles_end = select(n_out - rem, n_out - rem + TILE, rem >= 5u);
    // The accumulators are declared outside the loops and cleared by a loop: declared
    // inside one, a zeroed array is stored element by element there (each element a
    // per-lane scatter on llvmpipe) on top of the function's own zeroing, and LLVM 15's
    // coroutine pass (llvmpipe's compute shaders are coroutines) took 11 s instead of 3
    // to compile the tile build (docs/perf.md; tests/shaders_naga.rs keeps large arrays
    // so).
    var acc: array<vec4<f32>, ROWS>;
    var acc2: array<vec4<f32>, ROWS>;
    for (; TILES && t + TILE <= tiles_end; t += TILE) {
        for (var i = 0u; i < nr; i++) {
            acc[i] = vec4<f32>();
            acc2[i] = vec4<f32>();
        }
        for (var c = l; c < n_chunks; c += WG) {
            let x0 = x_chunk(first, t, c);
            let x1 = x_chunk(first, t + 1u, c);
            let x2 = x_chunk(first, t + 2u, c);
            let x3 = x_chunk(first, t + 3u, c);
            let x4 = x_chunk(first, t + 4u, c);
            let x5 = x_chunk(first, t + 5u, c);
            let x6 = x_chunk(first, t + 6u, c);
            let x7 = x_chunk(first, t + 7u, c);
            for (var i = 0u; i < nr; i++) {
                let v = decode32((r0 + i) * p.row_bytes, c);
                acc[i] += vec4<f32>(vdot32(v, x0), vdot32(v, x1), vdot32(v, x2), vdot32(v, x3));
                acc2[i] += vec4<f32>(vdot32(v, x4), vdot32(v, x5), vdot32(v, x6), vdot32(v, x7));
            }
        }
        // Every lane holds the row's sums; lane k stores token k's, so one store
        // (a loop over the active lanes on CPU drivers) serves the whole tile.
        for (var i = 0u; i < ROWS; i++) {
            let s = subgroupAdd(acc[i]);
            let s2 = subgroupAdd(acc2[i]);
            for (var k = l; k < TILE; k += WG) {
                if (i < nr && t + k < n_out) {
                    store_out(t + k, out0 + i, select(s2[k & 3u], s[k & 3u], k < 4u));
                }
            }
        }
    }
    let n_pairs = select(0u, n_chunks / 2u, PAIRED);
    let pairs = lane_walk(0u, n_pairs, l);
    let singles = lane_walk(2u * n_pairs, n_chunks, l);
    var acc1: array<f32, ROWS>;
    for (; t < n_out; t++) {
        for (var i = 0u; i < nr; i++) {
            acc1[i] = 0.0;
        }
        for (var c2 = pairs.x; c2 < pairs.y; c2 += pairs.z) {
            // One token: the decoders' own dot products, with scales outside the sum,
            // two chunks at a time (K-quants share words between neighbouring chunks),
            // their quants read in place (`x_pre`, common/bytes.wgsl).
            let xa = x_chunk(first, t, 2u * c2);
            let xb = x_chunk(first, t, 2u * c2 + 1u);
            let sa = x_sum(xa);
            let sb = x_sum(xb);
            let pa = x_pre(xa, 2u * c2);
            let pb = x_pre(xb, 2u * c2 + 1u);
            for (var i = 0u; i < nr; i++) {
                acc1[i] += wdot64_pre((r0 + i) * p.row_bytes, c2, pa, pb, sa, sb);
            }
        }
        // The chunks not walked in pairs (all of them unless PAIRED; an odd last one),
        // their quants read in place (`x_pre`, common/bytes.wgsl).
        for (var c = singles.x; c < singles.y; c += singles.z) {
            let x0 = x_chunk(first, t, c);
            let xs = x_sum(x0);
            let xp = x_pre(x0, c);
            for (var i = 0u; i < nr; i++) {
                acc1[i] += wdot32_pre((r0 + i) * p.row_bytes, c, xp, xs);
            }
        }
        // The row sums are spread over the lanes to store: lane l writes rows l, l + WG..
        for (var i = 0u; i < ROWS; i++) {
            acc1[i] = subgroupAdd(acc1[i]);
        }
        for (var i = l; i < nr; i += WG) {
            store_out(t, out0 + i, acc1[i]);
        }
    }
}
