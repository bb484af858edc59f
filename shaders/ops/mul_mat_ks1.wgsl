// mul_mat for one token at a time (or four, with TILE), on rows short enough that one
// subgroup holds all of a row's activations in registers: each of the WG lanes holds
// SLOTS chunks of 32 (`ops::mul_mat::ks1_fits` picks it on rows of at most 8 * WG
// chunks, single tokens and batches, `ks1_batches_fit`; the K-quants' single tokens
// dot a lane's chunks in pairs where it holds an even count, the walk `pairs`). A workgroup is
// one subgroup owning ROWS consecutive rows; per row, each lane dots its chunks,
// `subgroupAdd` gives the row's sum, and lane j keeps row i0 + j's so that the lanes
// store WG rows at once. Single tokens of longer rows are walked in slices of their
// columns by one subgroup (`SLICED`, below), or split over a workgroup of several
// subgroups (`SPLIT`, below).
//
// Against `mul_mat_ks`, whose single-token path walks the chunks outside and the rows
// inside, adding each row's partial sum into a private array: with no private array
// and no tile loop in the kernel, llvmpipe's code for it runs 1.4-2x faster on long
// stacks of short rows (Q8_0 and Q4_1 640x262144 and 576x49152, docs/perf.md).
//
// With NORM (the `mul_mat_ks1n` build, common/x_norm.wgsl) the activations are the
// residual stream and the norm before the product happens here: the lanes' slots are
// the whole row, so its sum of squares is one `subgroupAdd` (`norm_inv`), and each
// slot is scaled by 1 / rms and the norm's weight before the rows are walked.
//
// With TILE (the batch build) tokens go four at a time: each slot holds its chunk of
// all four tokens' activations, and a row's chunk is decoded once and dotted with the
// four. `mul_mat_ks`'s 8-token tile keeps its row sums in private arrays, which llvmpipe
// indexes lane by lane; here a row's four sums are one vec4 in registers, and the run
// is 1.2-1.7x faster on lavapipe (576 and 640 columns, batch 64 and 512,
// docs/perf.md). A single token's build leaves the tile out: holding it, the kernel
// ran single tokens 1.15-1.4x slower. In a batch step both builds run, the tile build
// over the batch's whole tiles and the single-token build over the one to three tokens
// left. Batches of the types whose rows pack into integers (Q4_0, Q4_1, Q5_0, Q5_1) run
// ops/mul_mat_ks1i.wgsl instead of the tile build.
//
// With `p.glu` (a fused gate/up product of single tokens, `ops::mul_mat::gpu_gate_up`)
// the single-token loop walks a block of gate's rows then the same rows of up, and
// stores act(gate) * up (`glu_row`, `store_row`): no `glu` dispatch after it.
//
// With the `rope` region (the `mul_mat_ks1nr` build of a layer's Q/K/V product, kept
// only there) a single token's workgroups go on to rotate the heads they stored and
// append K and V to the cache: common/ks1_rope.wgsl.
//
// Params: common/mul_mat_params.wgsl; bindings as `mul_mat_ks`, and the norm's weight
// at 8 with NORM. The workgroup's shape and lanes: common/ks1_lanes.wgsl.

// Batches in tiles of four tokens (above); without it, tokens one at a time.
override TILE: bool = false;
// Without TILE: whether a batch's whole tiles are left to the tile build (run only the
// tokens past them), or every token runs here (rows too long for the tile builds,
// `ops::mul_mat::ks1_batches_fit`).
override TAILS: bool = true;

// One of a lane's chunks: its index, 1 or 0 for a lane past the row's end (which
// dots the last chunk again and drops it), its activations as the weight type's
// `wdot32_pre` takes them (`x_pre`: divided by the powers of two at which the type's
// quants are read in place, common/bytes.wgsl) and their plain sum.
struct Slot {
    c: u32,
    on: f32,
    x: array<vec4<f32>, 8>,
    xs: f32,
}

// `inv` scales the activations with NORM (1 / rms, see `norm_inv`).
fn slot(first: u32, t: u32, k: u32, l: u32, n_chunks: u32, inv: f32) -> Slot {
    let c = slot_chunk(k, l, n_chunks);
    let x = normed(x_chunk(first, t, c.x), c.x, inv);
    return Slot(c.x, f32(c.y), x_pre(x, c.x), x_sum(x));
}

// @begin tile
// Slot k of the four tokens t .. t + 3, whose 1 / rms are `inv` with NORM.
struct Slot4 {
    c: u32,
    on: f32,
    x0: array<vec4<f32>, 8>,
    x1: array<vec4<f32>, 8>,
    x2: array<vec4<f32>, 8>,
    x3: array<vec4<f32>, 8>,
}

fn slot4(first: u32, t: u32, k: u32, l: u32, n_chunks: u32, inv: vec4<f32>) -> Slot4 {
    let c = slot_chunk(k, l, n_chunks);
    return Slot4(
        c.x,
        f32(c.y),
        normed(x_chunk(first, t, c.x), c.x, inv.x),
        normed(x_chunk(first, t + 1u, c.x), c.x, inv.y),
        normed(x_chunk(first, t + 2u, c.x), c.x, inv.z),
        normed(x_chunk(first, t + 3u, c.x), c.x, inv.w),
    );
}

// Row `rb`'s chunk in slot s, decoded once, dotted with the four tokens'.
fn slot4_dot(rb: u32, s: Slot4) -> vec4<f32> {
    let w = decode32(rb, s.c);
    return s.on * vec4<f32>(vdot32(w, s.x0), vdot32(w, s.x1), vdot32(w, s.x2), vdot32(w, s.x3));
}

// @end tile

fn slot_dot(row_byte: u32, s: Slot) -> f32 {
    return s.on * wdot32_pre(row_byte, s.c, s.x, s.xs);
}

// A single token's row is walked one of four ways, each a region of `row_dot` below
// (the host keeps one, `ops::mul_mat::build::RowDot`): `plain`, a chunk at a time;
// `pairs`, `kblock` and `fields`, next.
//
// With `pairs`, slots a and a + 1 hold chunks 2 c2 and 2 c2 + 1 of a row (an even
// chunk count per lane, each lane's run starting at an even chunk, rows of an even
// count of chunks): the K-quants' two chunks that share bytes (Q4_K and Q5_K their
// nibbles, header and scales; Q6_K its high bits, scales and d), dotted with one load
// of them (`wdot64_pre`), where one chunk at a time loads them twice. Both slots are
// in the row or neither.
// @begin pairs
fn pair_dot(row_byte: u32, a: Slot, b: Slot) -> f32 {
    return a.on * wdot64_pre(row_byte, a.c / 2u, a.x, b.x, a.xs, b.xs);
}
// @end pairs

// With `kblock` (pairs where a lane's run of SLOTS chunks lies in one block of eight,
// SLOTS 2, 4 or 8), a lane reads what its pairs share in the block (the K-quant's
// header or scales, Q5_K's fifth bits, Q6_K's d: the decoder's `k_block`) once per
// row, where each pair's dot read it again.

// @begin kblock
fn pair_dot_blk(row_byte: u32, a: Slot, b: Slot, blk: KBlock) -> f32 {
    return a.on * wdot64_blk(row_byte, a.c / 2u, blk, a.x, b.x, a.xs, b.xs);
}
// @end kblock

// With `fields` (the planar types, on lanes that hold runs of consecutive chunks, or
// Q8_0's strided chunks on at most four lanes per row), a single token's lane reads the
// small fields (scales, fifth bits) of all its slots once per row, from the texels
// that hold them (`run_fields`, common/bytes.wgsl's `run_words`), where each chunk's
// dot fetched a texel per field. A slot past the row reads fields past the lane's: its
// dot is dropped by a select, not a multiply by 0.

// @begin fields
fn run_dot(rb: u32, s: Slot, k: u32, f: RunFields) -> f32 {
    return select(0.0, wdot32_run(rb, s.c, k, s.x, s.xs, f), s.on != 0.0);
}
// @end fields

// Row `rb` dotted with a lane's slots. Every line of slot k > 0 ends in a `@slot k`
// mark: the host drops the lines of the slots past SLOTS from the source before
// compiling it (`gpu::shaders::keep_slots`), so the driver never sees them. (WGSL has
// no generic functions: `row_dot4` is the same sum over the four tokens' slots.)
fn row_dot(
    rb: u32,
    s0: Slot,
    s1: Slot, // @slot 1
    s2: Slot, // @slot 2
    s3: Slot, // @slot 3
    s4: Slot, // @slot 4
    s5: Slot, // @slot 5
    s6: Slot, // @slot 6
    s7: Slot, // @slot 7
) -> f32 {
    // One of the four walks below is kept per build (`ops::mul_mat::build`'s `RowDot`):
    // each returns the row's sum.
    // @begin kblock
    let blk = k_block(rb, s0.c);
    var u = pair_dot_blk(rb, s0, s1, blk); // @slot 1
    u += pair_dot_blk(rb, s2, s3, blk); // @slot 3
    u += pair_dot_blk(rb, s4, s5, blk); // @slot 5
    u += pair_dot_blk(rb, s6, s7, blk); // @slot 7
    return u;
    // @end kblock
    // @begin pairs
    var w = pair_dot(rb, s0, s1); // @slot 1
    w += pair_dot(rb, s2, s3); // @slot 3
    w += pair_dot(rb, s4, s5); // @slot 5
    w += pair_dot(rb, s6, s7); // @slot 7
    return w;
    // @end pairs
    // @begin fields
    let f = run_fields(rb, s0.c, SLOTS, row_lanes());
    var r = run_dot(rb, s0, 0u, f);
    r += run_dot(rb, s1, 1u, f); // @slot 1
    r += run_dot(rb, s2, 2u, f); // @slot 2
    r += run_dot(rb, s3, 3u, f); // @slot 3
    r += run_dot(rb, s4, 4u, f); // @slot 4
    r += run_dot(rb, s5, 5u, f); // @slot 5
    r += run_dot(rb, s6, 6u, f); // @slot 6
    r += run_dot(rb, s7, 7u, f); // @slot 7
    return r;
    // @end fields
    // @begin plain
    var v = slot_dot(rb, s0);
    v += slot_dot(rb, s1); // @slot 1
    v += slot_dot(rb, s2); // @slot 2
    v += slot_dot(rb, s3); // @slot 3
    v += slot_dot(rb, s4); // @slot 4
    v += slot_dot(rb, s5); // @slot 5
    v += slot_dot(rb, s6); // @slot 6
    v += slot_dot(rb, s7); // @slot 7
    return v;
    // @end plain
}

// @begin tile
fn row_dot4(
    rb: u32,
    s0: Slot4,
    s1: Slot4, // @slot 1
    s2: Slot4, // @slot 2
    s3: Slot4, // @slot 3
    s4: Slot4, // @slot 4
    s5: Slot4, // @slot 5
    s6: Slot4, // @slot 6
    s7: Slot4, // @slot 7
) -> vec4<f32> {
    var v = slot4_dot(rb, s0);
    v += slot4_dot(rb, s1); // @slot 1
    v += slot4_dot(rb, s2); // @slot 2
    v += slot4_dot(rb, s3); // @slot 3
    v += slot4_dot(rb, s4); // @slot 4
    v += slot4_dot(rb, s5); // @slot 5
    v += slot4_dot(rb, s6); // @slot 6
    v += slot4_dot(rb, s7); // @slot 7
    return v;
}

// @end tile

// The GLU store (`p.glu`, a fused gate/up product of single tokens): the workgroups
// walk the rows in blocks of WG, a block of gate's rows then the same rows of up, so
// that each lane holds its gate row's sum when it gets its up row's and stores
// act(gate) * up. Row v of that walk is this row of the product (y_stride rows of gate,
// then up's); without GLU, row v.
fn glu_row(v: u32) -> u32 {
    let g = v / (2u * WG) * WG + v % WG;
    let up = ((v / WG) & 1u) == 1u;
    return select(v, select(g, p.y_stride + g, up), p.glu != 0u);
}

// Row v of the walk (see `glu_row`): stored, or with GLU, act(gate) * x where v is an
// up row (the lane's `gate` is its gate row's sum, from the block before).
// GLU false (plain products, `Ks1::plain`) leaves the GLU case out of the code: a
// CPU-hosted driver would run it under lane masks, activation and store included.
override GLU: bool = true;

fn store_row(t: u32, v: u32, x: f32, gate: f32) {
    if (!GLU || p.glu == 0u) {
        store_out(t, v, x);
    } else if (((v / WG) & 1u) == 1u) {
        let g = v / (2u * WG) * WG + v % WG;
        store_y(t * p.y_stride + g, glu_act(p.glu - 1u, gate) * x);
    }
}

// With SPLIT (region `split`: single tokens of rows past 8 * WG chunks,
// `ops::mul_mat::ks1_split`) a workgroup is SPLIT subgroups, each holding its part of
// every row in its lanes' slots (lane l of the workgroup is lane l of a row of
// WG * SPLIT lanes, common/ks1_lanes.wgsl). Lane j of each subgroup keeps its part's sum
// of row i0 + j, and `split_total` adds the parts through workgroup memory: one barrier
// per block of WG rows. The blocks' sums alternate between two buffers, so that a
// block's writes come after the barrier by which every lane had read that buffer's
// last sums, two blocks before. Against `mul_mat_ks`, whose lanes walk such rows'
// chunks one after another through a private array of row sums, on lavapipe: see
// `ks1_split`.
// @begin split
// Two buffers of a sum per lane (named: naga sizes workgroup arrays by an override's
// name, not an expression).
override PART: u32 = 2u * WG * SPLIT;
var<workgroup> part: array<f32, PART>;

fn split_total(mine: f32, l: u32, block: u32) -> f32 {
    let buf = block % 2u * (WG * SPLIT);
    part[buf + l] = mine;
    workgroupBarrier();
    var total = 0.0;
    for (var s = 0u; s < SPLIT; s++) {
        total += part[buf + s * WG + l % WG];
    }
    return total;
}
// @end split

// With SLICED (single tokens of rows past 8 * WG chunks, `ops::mul_mat::ks1_token_slices`,
// instead of SPLIT) a workgroup is one subgroup that walks each token's row in slices
// of SLOTS * WG chunks: its lanes' slots hold one slice's activations at a time, and it
// dots all its rows with each slice in turn. Lane j keeps the running sum of row
// i0 + j in workgroup memory (`slice_total`: only that lane reads or writes it, so no
// barrier), and the last slice stores the totals as the single-token loop does.
// Against SPLIT, which holds every slice at once in a workgroup of several subgroups
// and adds the parts through workgroup memory behind a barrier per block of rows, on
// lavapipe: see `ks1_token_slices`.
override SLICED: bool = false;
// @begin sliced
// Rows per workgroup at most (the host's `wg_rows` stays within it).
override SLICE_ROWS: u32 = 1u;
var<workgroup> row_sums: array<f32, SLICE_ROWS>;

// Lane l's running sum of row i (`on`: a row of the workgroup's) after slice `sl`.
fn slice_total(mine: f32, i: u32, on: bool, sl: u32) -> f32 {
    if (!on) {
        return mine;
    }
    let total = mine + select(0.0, row_sums[i], sl > 0u);
    row_sums[i] = total;
    return total;
}
// @end sliced

// Invocations per workgroup: WG, or WG * SPLIT with SPLIT (set by the host, which
// chains compare between members).
override LANES: u32 = 8u;

@compute @workgroup_size(LANES)
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
    let n_chunks = p.chunk_n;
    let first = w.first;
    let n_out = w.n_out;
    let out0 = p.row0 + r0;
    var t = w.t0;
    // The tile build keeps the tiles (region `tile`) and the single-token build the
    // loop after them (region `token`), each without the other's: lavapipe translates
    // and optimises a loop its constants leave dead before dropping it (docs/perf.md).
    // @begin tile
    for (; TILE && t + 4u <= n_out; t += 4u) {
        let inv = vec4<f32>(
            norm_inv(first, t, l, n_chunks),
            norm_inv(first, t + 1u, l, n_chunks),
            norm_inv(first, t + 2u, l, n_chunks),
            norm_inv(first, t + 3u, l, n_chunks),
        );
        let s0 = slot4(first, t, 0u, l, n_chunks, inv);
        let s1 = slot4(first, t, 1u, l, n_chunks, inv); // @slot 1
        let s2 = slot4(first, t, 2u, l, n_chunks, inv); // @slot 2
        let s3 = slot4(first, t, 3u, l, n_chunks, inv); // @slot 3
        let s4 = slot4(first, t, 4u, l, n_chunks, inv); // @slot 4
        let s5 = slot4(first, t, 5u, l, n_chunks, inv); // @slot 5
        let s6 = slot4(first, t, 6u, l, n_chunks, inv); // @slot 6
        let s7 = slot4(first, t, 7u, l, n_chunks, inv); // @slot 7
        for (var i0 = 0u; i0 < nr; i0 += WG) {
            var mine = vec4<f32>();
            for (var j = 0u; j < min(WG, nr - i0); j++) {
                let v = row_dot4(
                    (r0 + i0 + j) * p.row_bytes,
                    s0,
                    s1, // @slot 1
                    s2, // @slot 2
                    s3, // @slot 3
                    s4, // @slot 4
                    s5, // @slot 5
                    s6, // @slot 6
                    s7, // @slot 7
                );
                mine = select(mine, lane_sum4(v), l == j);
            }
            if (i0 + l < nr) {
                let r = out0 + i0 + l;
                store_out(t, r, mine.x);
                store_out(t + 1u, r, mine.y);
                store_out(t + 2u, r, mine.z);
                store_out(t + 3u, r, mine.w);
            }
        }
    }
    // @end tile
    // Single tokens; in a batch, the one to three its whole tiles leave (every token
    // without TAILS). The tile build runs the tiles in a dispatch of its own.
    // @begin token
    let span = select(0u, n_out - t, n_out > t);
    // @begin split
    var block = 0u;
    // @end split
    // With SLICED, a token's row in slices of SLOTS * WG chunks (the last may hold
    // fewer); else one slice, the whole row.
    let slice_chunks = select(n_chunks, SLOTS * WG, SLICED);
    let n_slices = select(1u, (n_chunks + slice_chunks - 1u) / slice_chunks, SLICED);
    for (t += select(0u, span / 4u * 4u, TAILS); !TILE && t < n_out; t++) {
        for (var sl = 0u; sl < n_slices; sl++) {
            slice0 = sl * slice_chunks;
            let in_slice = min(slice_chunks, n_chunks - slice0);
            let last = sl + 1u == n_slices;
            let inv = norm_inv(first, t, l, in_slice);
            let s0 = slot(first, t, 0u, l, in_slice, inv);
            let s1 = slot(first, t, 1u, l, in_slice, inv); // @slot 1
            let s2 = slot(first, t, 2u, l, in_slice, inv); // @slot 2
            let s3 = slot(first, t, 3u, l, in_slice, inv); // @slot 3
            let s4 = slot(first, t, 4u, l, in_slice, inv); // @slot 4
            let s5 = slot(first, t, 5u, l, in_slice, inv); // @slot 5
            let s6 = slot(first, t, 6u, l, in_slice, inv); // @slot 6
            let s7 = slot(first, t, 7u, l, in_slice, inv); // @slot 7
            var gate = 0.0;
            let group = l / row_lanes();
            // Lane l's index in its subgroup (l itself but with SPLIT).
            let lane = l % WG;
            for (var i0 = 0u; i0 < nr; i0 += WG) {
                var mine = 0.0;
                for (var j = 0u; j < min(WG, nr - i0); j += GROUPS) {
                    // Group g dots row i0 + j + g (past nr, the last row again, dropped).
                    let v = row_dot(
                        glu_row(r0 + min(i0 + j + group, nr - 1u)) * p.row_bytes,
                        s0,
                        s1, // @slot 1
                        s2, // @slot 2
                        s3, // @slot 3
                        s4, // @slot 4
                        s5, // @slot 5
                        s6, // @slot 6
                        s7, // @slot 7
                    );
                    // Lane j + g keeps row i0 + j + g's sum: group g's lanes'.
                    for (var g = 0u; g < GROUPS; g++) {
                        let sum = lane_sum(select(0.0, v, group == g));
                        mine = select(mine, sum, lane == j + g);
                    }
                }
                // @begin split
                mine = split_total(mine, l, block);
                block++;
                // @end split
                // @begin sliced
                mine = slice_total(mine, i0 + l, i0 + l < nr, sl);
                // @end sliced
                if (last && i0 + l < nr && (SPLIT == 1u || l < WG)) {
                    store_row(t, out0 + i0 + l, mine, gate);
                }
                gate = mine;
            }
        }
    }
    // @end token
    // @begin rope
    // The `mul_mat_ks1nr` build (common/ks1_rope.wgsl): a single token's RoPE and cache
    // append, in a loop of zero or one trips (a CPU-hosted driver skips a loop no lane
    // enters; a branch it would run under lane masks). Batches' tails are stored plain.
    for (var one = step.n_tokens == 1u; one; one = false) {
        let n_g = (p.n_rows + wg_rows() - 1u) / wg_rows();
        ks1_rope(out0, nr, l, r0 / wg_rows(), n_g);
    }
    // @end rope
    keep_lanes();
}
