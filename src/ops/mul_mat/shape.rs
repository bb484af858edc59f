//! Each kernel family's workgroups, rows per workgroup, token tiles and windows, and
//! the grids they make: constants measured per kind of device, and the choices made per
//! product (the lanes and slots of `mul_mat_ks1`, the trip budgets llvmpipe imposes).

use super::*;

/// Workgroup size of the row-per-workgroup variants.
pub(super) const ROW_WG: u32 = 64;

/// Rows per workgroup of `Ks` (`ROWS` in mul_mat_ks.wgsl).
pub(super) const KS_ROWS: u32 = 64;

/// The most rows one such workgroup takes ([`ks1_rows`]): their trips (four a row,
/// [`ks1_chainable`]) stay well within llvmpipe's 65535 a workgroup.
const KS1_MAX_ROWS: u32 = 4096;

/// What a build of `mul_mat_ks1` or `mul_mat_ks1i` walks per workgroup, which sets its
/// rows per workgroup ([`ks1_rows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ks1Walk {
    /// Single tokens, one at a time.
    Tokens,
    /// Single tokens, each row split over a workgroup's subgroups ([`ks1_split`]),
    /// whose workgroups are larger than the other kernels' and so join no chain.
    Split,
    /// Single tokens, each row walked in this many slices of its columns
    /// ([`ks1_token_slices`]), at most [`KS1_SLICE_ROWS`] rows a workgroup.
    Sliced(u32),
    /// Single tokens, each workgroup's rows whole heads of this many rows
    /// (`mul_mat_ks1nr`, whose workgroups rotate the heads they stored).
    Heads(u32),
    /// A batch's tiles of tokens.
    Tiles,
}

/// Rows per workgroup of `mul_mat_ks1` and `mul_mat_ks1i` over `n_rows` rows (`wg_rows`
/// in common/ks1_lanes.wgsl), a multiple of twice the subgroup, so that a GLU store's
/// blocks of gate and up rows stay in one workgroup.
///
/// GPUs keep [`KS_ROWS`]: they want many workgroups in flight. CPU-hosted drivers run
/// each workgroup on one of a thread per core, and a workgroup first loads (and folds
/// the norm into, and for `mul_mat_ks1i` quantizes) the activations of its slots, for
/// every token it walks: work that more rows per workgroup share. Measured on lavapipe
/// (docs/perf.md):
/// - a batch's tiles walk their tokens (a window of them, [`ks_tok_win`]) through
///   every workgroup, so batches run one workgroup per core across the rows: pp512
///   1.25x (SmolLM2) and 1.2x (Gemma 3) against 64 rows;
/// - a single token's product: [`ks1_groups`] workgroups of [`KS_ROWS`] to
///   [`KS1_MAX_ROWS`] rows. Gemma 3's Q8_0 head 11% and its gate/up 9% faster at 512
///   rows than at 64, and 32 rows decoded SmolLM2 at 0.8x; with chains, Gemma 3
///   decoded 1.047x faster at 4096 rows than at 512 (1.03-1.04x at 1024, 2048 and
///   8192).
pub(super) fn ks1_rows(ctx: &GpuContext, n_rows: u32, walk: Ks1Walk) -> u32 {
    let step = 2 * ctx.subgroup_min_size.clamp(1, KS_ROWS / 2);
    if let Ks1Walk::Heads(head) = walk {
        let rows = ks1_rows(ctx, n_rows, Ks1Walk::Tokens);
        return rows.next_multiple_of(lcm(head.max(1), step));
    }
    if ctx.info.device_type != wgpu::DeviceType::Cpu {
        return KS_ROWS;
    }
    let rows = match walk {
        // One workgroup per driver thread, few enough rows that a window of the fewest
        // tokens stays within the trip budget ([`ks_tok_win`]).
        Ks1Walk::Tiles => n_rows
            .div_ceil(crate::gpu::context::driver_threads())
            .min(KS_WALK_TRIPS / KS_TOK_WIN_MIN / step * step),
        Ks1Walk::Tokens | Ks1Walk::Split | Ks1Walk::Heads(_) => {
            let most = ctx.ks1_max_rows.unwrap_or(KS1_MAX_ROWS);
            n_rows.div_ceil(ks1_groups(ctx)).min(most)
        }
        // A workgroup's running sums fit its workgroup memory, and a window of the
        // fewest tokens (a batch's tail, or every token where no tiles run) walks each
        // row once a slice within the trip budget ([`ks_tok_win`]): as many workgroups
        // per driver thread as that takes, the rows shared evenly.
        Ks1Walk::Sliced(slices) => {
            let trips = KS_WALK_TRIPS / KS_TOK_WIN_MIN / slices.max(1) / step * step;
            let most = ctx.ks1_max_rows.unwrap_or(KS1_MAX_ROWS).min(KS1_SLICE_ROWS);
            let most = most.min(trips).max(step);
            let threads = ks1_groups(ctx);
            let groups = threads.saturating_mul(n_rows.div_ceil(threads.saturating_mul(most)));
            n_rows.div_ceil(groups.max(1)).min(most)
        }
    };
    rows.next_multiple_of(step).max(KS_ROWS)
}

/// Workgroups a single-token `mul_mat_ks1` product aims for on a CPU-hosted driver:
/// one per driver thread. Each workgroup first loads (and normalizes) its activations,
/// and in a chain each item is claimed and counted done; the threads take the next
/// item as they finish one. Measured in one process (`--versus ks1-groups=N`,
/// docs/perf.md): with chains, SmolLM2 decoded 1.135x faster at two (the VM's threads)
/// than at sixteen, the count before, 1.057x than at eight; three, unevenly shared,
/// 0.966x. Without chains, two against sixteen: 1.011x and 1.017x (Gemma 3).
fn ks1_groups(ctx: &GpuContext) -> u32 {
    ctx.ks1_groups
        .unwrap_or_else(crate::gpu::context::driver_threads)
        .max(1)
}

/// What a single-token workgroup of `mul_mat_ks1` with `wg_rows` rows needs to join a
/// chain: a bound on its loop trips. It walks its rows one trip each (and one more per
/// block of lanes); RoPE's epilogue walks each head it stored in loops of a few trips per
/// lane block. Four trips a row and a few hundred more leave room for both.
pub(super) fn ks1_chainable(wg_rows: u32) -> crate::ops::chain::Chainable {
    crate::ops::chain::Chainable::fixed(wg_rows.saturating_mul(4).saturating_add(256))
}

/// What a single token's workgroup of `mul_mat_ks` on rows of `n_cols` needs to join a
/// chain (rows too long for `mul_mat_ks1`: Gemma 3's `ffn_down`): a bound on its loop
/// trips. Each of a lane's chunks (or pairs, fewer) walks the workgroup's [`KS_ROWS`]
/// rows, one trip each; the sums are then added and stored in a trip a row and one per
/// block of lanes, and the token loop takes one.
pub(super) fn ks_chainable(ctx: &GpuContext, n_cols: u64) -> crate::ops::chain::Chainable {
    let lanes = ctx.subgroup_min_size.max(1);
    let lane_chunks = u32::try_from((n_cols / 32).div_ceil(lanes as u64)).unwrap_or(u32::MAX);
    let trips = lane_chunks
        .saturating_add(2)
        .saturating_mul(KS_ROWS + 1)
        .saturating_add(KS_ROWS + KS_ROWS / lanes + 8);
    crate::ops::chain::Chainable::fixed(trips)
}

fn lcm(a: u32, b: u32) -> u32 {
    let gcd = |mut a: u32, mut b: u32| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

/// Output tokens per workgroup of a `Ks` family dispatch that does not split its
/// tokens: all of them.
pub(super) const KS_TOK_WIN_ALL: u32 = 1 << 24;

/// The fewest tokens of a window ([`ks_tok_win`]): a tile of eight.
const KS_TOK_WIN_MIN: u32 = 8;

/// The most loop trips, in rows times tokens times chunks per lane, that one workgroup
/// of the `Ks` family walks ([`ks_tok_win`]): 64 rows of a 512-token batch.
const KS_WALK_TRIPS: u32 = 64 * 512;

/// Output tokens per workgroup of a `Ks` family kernel with `wg_rows` rows per
/// workgroup and `lane_chunks` chunks per lane in its inner loop (1 for `mul_mat_ks1`,
/// whose slots are unrolled): a multiple of 8, so that every window but the last is
/// whole tiles of four and of eight. llvmpipe ends a loop nest after a fixed number of
/// trips (its loop limiter) without a trace: measured on lavapipe, `mul_mat_ks1`
/// workgroups stopped storing after about 22,000-23,600 rows of tiles of four tokens
/// (640 rows per workgroup from token 144, 64 rows from token 1372), and `mul_mat_ks`
/// failed at 512 tokens of 4096 columns in 64 rows. [`KS_WALK_TRIPS`] keeps 2.7x below
/// the first and further below the second.
///
/// This is the most a window takes: the kernels share a step's tokens evenly over the
/// grid's windows (`window` in common/x_chunk.wgsl), so that no thread of a CPU-hosted
/// driver gets the full windows while another gets the short one.
///
/// A window is at least [`KS_TOK_WIN_MIN`] tokens, so [`ks1_rows`] caps a batch's rows
/// per workgroup to keep that window within the budget (a model's output head over
/// every token of a 512-token batch, as `perplexity` runs it, had 24,576 rows per
/// workgroup).
pub(super) fn ks_tok_win(wg_rows: u32, lane_chunks: u32) -> u32 {
    let per_token = wg_rows.max(1).saturating_mul(lane_chunks.max(1));
    (KS_WALK_TRIPS / per_token / KS_TOK_WIN_MIN * KS_TOK_WIN_MIN).max(KS_TOK_WIN_MIN)
}

/// Rows per workgroup of `Mr` (`ROWS` in mul_mat_mr.wgsl).
const MR_ROWS: u32 = 4;

/// Tokens per pass over `Mr`'s rows in batches (`TILE` in mul_mat_mr.wgsl).
pub(super) const MR_TILE: u32 = 4;

/// `Mr`'s workgroups ([`mr_lanes`]): how many a product should have for a GPU to keep
/// enough loads in flight (an H200 holds about 2000 resident 32-lane subgroups), and
/// how many times [`mr_shape`]'s lanes a workgroup may take to get there.
const MR_FILL_GROUPS: u64 = 2048;

const MR_MAX_SPLIT: u32 = 4;

/// `Mr`'s workgroup for products of `n_rows` rows of `n_cols` (`WG`, `SG_WHOLE`):
/// [`mr_shape`]'s, widened two or four times on GPUs where the product has too few
/// rows to fill the device ([`MR_FILL_GROUPS`]) and rows long enough that each lane
/// still walks two chunks or more; the lanes' sums are then added in workgroup memory.
/// A down projection of 4096 rows (1024 workgroups of one subgroup) walks 14 chunks per
/// lane one after another; split over two subgroups, it walks seven.
pub fn mr_lanes(ctx: &GpuContext, n_rows: u64, n_cols: u64) -> (u32, bool) {
    let (base, whole) = mr_shape(ctx);
    let cpu_hosted = ctx.info.device_type == wgpu::DeviceType::Cpu;
    if cpu_hosted && !ctx.workgroup_reductions {
        return (base, whole);
    }
    let groups = n_rows.div_ceil(MR_ROWS as u64);
    let chunks = n_cols / 32;
    let mut k = 1;
    while k < MR_MAX_SPLIT
        && groups * (k as u64) < MR_FILL_GROUPS
        && chunks >= (base * k * 4) as u64
    {
        k *= 2;
    }
    if k == 1 {
        (base, whole)
    } else {
        (base * k, false)
    }
}

/// Fewest tokens for which `Mr` runs batches as `mul_mat_mm` ([`mm_fits`]).
pub const MM_MIN: u32 = 16;

/// Rows and tokens of a `mul_mat_mm` workgroup's tile (`BM`, `BN`), its invocations
/// (`WG`) and the workgroup memory its two tiles take.
const MM_ROWS: u32 = 64;

const MM_TOKENS: u32 = 64;

const MM_WG: u32 = 256;

const MM_SHARED_BYTES: u32 = 2 * 64 * 64 * 4;

/// Whether `Mr` runs batches of [`MM_MIN`] tokens or more as `mul_mat_mm`: where the
/// device allows its workgroup of 256 and its 32 KiB of workgroup memory.
pub fn mm_fits(ctx: &GpuContext) -> bool {
    let l = &ctx.limits;
    l.max_compute_invocations_per_workgroup >= MM_WG
        && l.max_compute_workgroup_size_x >= MM_WG
        && l.max_compute_workgroup_storage_size >= MM_SHARED_BYTES
}

/// `Mr`'s workgroup (`WG`, `SG_WHOLE` in mul_mat_mr.wgsl): one subgroup where the
/// device fixes its size (at most 64 lanes), so `subgroupAdd` alone sums a row; else,
/// or with [`GpuContext::workgroup_reductions`], 64 invocations, their subgroups' sums
/// added in workgroup memory.
pub fn mr_shape(ctx: &GpuContext) -> (u32, bool) {
    match ctx.fixed_subgroup() {
        Some(s) if s <= 64 && !ctx.workgroup_reductions => (s, true),
        _ => (64, false),
    }
}

/// Tokens per tile of `mul_mat_ks1`'s batch build (four sums in one vec4 there).
pub(super) const KS1_TILE: u32 = 4;

/// Whether `mul_mat_ks1i` runs a batch of `n` tokens in tiles of eight rather than
/// four: from [`KS1I_EIGHT_MIN`] tokens. Eight unpack each pair of rows' chunk once for
/// twice the tokens (SmolLM2's and Gemma 3's pp512 1.08-1.09x on lavapipe,
/// docs/perf.md); their last tile pads at most four tokens more than tiles of four,
/// 4 / 68 of the work at 64 tokens. Their pipelines are compiled when a batch first
/// runs them, so shorter prompts never pay for that.
pub(super) fn ks1i_eight(n: u32) -> bool {
    n >= KS1I_EIGHT_MIN
}

/// Fewest tokens that `mul_mat_ks1i` runs in tiles of eight (`ks1i_eight`).
pub const KS1I_EIGHT_MIN: u32 = 64;

/// Fewest tokens for which `mul_mat_ks` runs a tile (of eight; five to seven run as one
/// short tile): steps of fewer run its build without tiles.
pub(super) const KS_TILE_MIN: u32 = 5;

/// Chunks of 32 elements each lane of `mul_mat_ks1` holds for rows of `n_chunks` chunks
/// (`SLOTS` in mul_mat_ks1.wgsl): the fewest that cover the row, as every lane dots all
/// its slots on every row (1.2-1.5x on 1024 columns at four slots against six, 1.1-1.8x
/// on 512 at two against three, docs/perf.md); 0 where the row is longer than
/// [`KS1_MAX_SLOTS`] chunks per lane.
pub(super) fn ks1_slots(ctx: &GpuContext, n_chunks: u64) -> u32 {
    match n_chunks.div_ceil(ctx.subgroup_min_size.max(1) as u64) {
        s @ 1..=KS1_MAX_SLOTS => s as u32,
        _ => 0,
    }
}

/// Most chunks a lane of `mul_mat_ks1`'s single-token build holds (the `@slot` lines
/// of mul_mat_ks1.wgsl). At eight (2048 columns on 8-lane subgroups) single tokens ran
/// 1.2-1.75x faster than in `ks` on lavapipe (Q5_0, Q8_0, Q4_K; Q6_K in pairs about
/// even), and Gemma 3's decode 1.03-1.05x (its Q6_K `ffn_down`, docs/perf.md).
const KS1_MAX_SLOTS: u64 = 8;

/// Most chunks a lane of `mul_mat_ks1` holds one at a time for a K-quant (an odd count
/// of slots, where its chunks cannot go in pairs): seven ran single tokens no faster
/// than `ks` (docs/perf.md).
const KS1_UNPAIRED_MAX_SLOTS: u32 = 6;

/// Rows a single token's subgroup of `mul_mat_ks1` dots at once, and the chunks each
/// lane then holds (`GROUPS` and `SLOTS` in common/ks1_lanes.wgsl), for rows of
/// `n_chunks`: of 1, 2 or 4 rows on a subgroup's lanes split alike, the one whose slots
/// leave the fewest idle, the fewest rows among equals. Every lane dots all its slots:
/// SmolLM2's 18 chunks take 3 slots on 8 lanes (24, 75% busy) or 5 on 4 (20, 90%);
/// Gemma 3's 20 fill 5 slots on 4. One row and [`ks1_slots`] with
/// [`GpuContext::one_row_at_a_time`], or where that takes no row (0).
pub(super) fn ks1_shape(ctx: &GpuContext, n_chunks: u64) -> (u32, u32) {
    let lanes = ctx.subgroup_min_size.max(1);
    if ctx.one_row_at_a_time || ks1_slots(ctx, n_chunks) == 0 {
        return (1, ks1_slots(ctx, n_chunks));
    }
    let shapes = [1u32, 2, 4].into_iter().filter_map(|g| {
        let row_lanes = lanes / g;
        let fits = lanes % g == 0 && row_lanes >= 2;
        let slots = n_chunks.div_ceil(row_lanes.max(1) as u64);
        (fits && (1..=KS1_MAX_SLOTS).contains(&slots)).then_some((g, slots as u32))
    });
    // Busy slots per thousand, then the fewest rows.
    let busy = |(g, slots): (u32, u32)| n_chunks * 1000 / (slots as u64 * (lanes / g) as u64);
    shapes
        .max_by_key(|&s| (busy(s), std::cmp::Reverse(s.0)))
        .unwrap_or((1, ks1_slots(ctx, n_chunks)))
}

/// Most subgroups one single-token workgroup of `mul_mat_ks1` splits its rows over
/// (`SPLIT` in common/ks1_lanes.wgsl, [`ks1_split`]): rows of up to 8 x 8 x 8 = 512
/// chunks on 8-lane subgroups (14336 columns take 448).
const KS1_MAX_SPLIT: u32 = 8;

/// For single tokens of rows too long for one subgroup's slots (more than
/// [`KS1_MAX_SLOTS`] chunks a lane), the subgroups a workgroup of `mul_mat_ks1` splits
/// each row over and the chunks each lane then holds (`SPLIT`, `SLOTS`): the fewest
/// subgroups that hold the row in at most [`KS1_MAX_SLOTS`] slots (an even count for
/// the K-quants, which dot them in pairs). `None` where the row fits one subgroup,
/// where it is too long for [`KS1_MAX_SPLIT`] subgroups or the device's workgroups, where
/// the device's subgroups do not have one fixed size (the parts' sums are each
/// subgroup's `subgroupAdd`), with [`GpuContext::split_rows`] off, or where single
/// tokens walk such rows in slices instead ([`ks1_token_slices`]).
///
/// Measured on lavapipe (docs/perf.md): 1.5-2.6x faster than `ks` at 4096 and 14336
/// columns (Q6_K, whose pairs `ks` already walked, about even), a synthetic 8B model's
/// decode 1.23x. Rows one subgroup holds stay whole: split in two at 2048 columns
/// (four slots a lane against eight) they ran 1.5-1.7x slower, each lane's fixed work
/// per row spread over half the slots.
pub(super) fn ks1_split(ctx: &GpuContext, ty: GgmlType, n_chunks: u64) -> Option<(u32, u32)> {
    let lanes = ctx.fixed_subgroup()?.max(1);
    if !ctx.split_rows || ks1_slots(ctx, n_chunks) > 0 {
        return None;
    }
    if ks1_token_slices(ctx, ty, n_chunks).is_some() {
        return None;
    }
    let l = &ctx.limits;
    let most = KS1_MAX_SPLIT
        .min(l.max_compute_invocations_per_workgroup / lanes)
        .min(l.max_compute_workgroup_size_x / lanes)
        .min(l.max_compute_workgroup_storage_size / (2 * 4 * lanes));
    (2..=most).find_map(|split| {
        let slots = n_chunks.div_ceil((lanes * split) as u64);
        let slots = if ks_paired(ty) {
            slots.next_multiple_of(2)
        } else {
            slots
        };
        (slots <= KS1_MAX_SLOTS).then_some((split, slots as u32))
    })
}

/// The most rows a workgroup of single tokens walked in slices takes
/// ([`Ks1Walk::Sliced`]): its lanes keep their rows' running sums in workgroup memory,
/// 4 bytes a row (`SLICE_ROWS` in ops/mul_mat_ks1.wgsl).
pub(super) const KS1_SLICE_ROWS: u32 = 2048;

/// For single tokens of rows too long for one subgroup's slots (more than
/// [`KS1_MAX_SLOTS`] chunks a lane) on devices that run them in `mul_mat_ks1`
/// ([`GpuContext::split_rows`]), the chunks per lane of each slice of the row one
/// subgroup walks in turn (`SLICED`), and the slices: slices of equal slots, the fewest
/// that hold the row (an even count for the K-quants, which dot them in pairs). `None`
/// where the row fits one subgroup, where it takes more than [`KS1_MAX_TOKEN_SLICES`], where the device's subgroups do not have one fixed size or its
/// workgroup memory does not hold [`KS1_SLICE_ROWS`] sums, or with
/// [`GpuContext::sliced_tokens`] off (then [`ks1_split`] splits such rows).
///
/// Measured on lavapipe against the split rows (docs/perf.md, "Single tokens of long
/// rows in slices"), at 4096, 8192 and 14336 columns: 1.1-1.45x in most cases (Q6_K and
/// Q4_K at 14336 columns 0.8-1.35x run to run), within 0.8-1.0x of the one-subgroup rate
/// of 2048 columns, where the split ran 0.6-0.85x; synthetic 8B models decoded
/// 1.16-1.23x faster, 1B models 1.05-1.06x. The split's workgroups meet at a barrier
/// once per block of rows, where llvmpipe switches between their subgroups (the likely
/// cost, not isolated); one subgroup walking the slices in turn needs no barrier.
pub(super) fn ks1_token_slices(
    ctx: &GpuContext,
    ty: GgmlType,
    n_chunks: u64,
) -> Option<(u32, u32)> {
    let lanes = ctx.fixed_subgroup()?.max(1) as u64;
    let memory = ctx.limits.max_compute_workgroup_storage_size / 4;
    if !ctx.split_rows || !ctx.sliced_tokens || ks1_slots(ctx, n_chunks) > 0 {
        return None;
    }
    if memory < KS1_SLICE_ROWS || n_chunks == 0 {
        return None;
    }
    let slots = equal_slices(n_chunks, lanes);
    let slots = if ks_paired(ty) {
        slots.next_multiple_of(2)
    } else {
        slots
    };
    let slices = n_chunks.div_ceil(slots * lanes);
    if slices > KS1_MAX_TOKEN_SLICES {
        return None;
    }
    Some((u32::try_from(slots).ok()?, u32::try_from(slices).ok()?))
}

/// The most slices [`ks1_token_slices`] cuts a row into (32768 columns on 8-lane
/// subgroups): a workgroup's rows times its slices stay within the trip budget
/// ([`ks1_rows`]) on at least [`KS_ROWS`] rows.
const KS1_MAX_TOKEN_SLICES: u64 = 16;

/// The chunks per lane of each slice where rows of `n_chunks` on `lanes` lanes are cut
/// into the fewest slices of at most [`KS1_MAX_SLOTS`] chunks a lane, of equal slots
/// (the last slice may hold fewer chunks).
fn equal_slices(n_chunks: u64, lanes: u64) -> u64 {
    let slices = n_chunks.div_ceil(lanes * KS1_MAX_SLOTS).max(1);
    n_chunks.div_ceil(slices * lanes)
}

/// A single-token `mul_mat_ks1` build's rows per subgroup pass, chunks per lane and
/// subgroups per workgroup (`GROUPS`, `SLOTS`, `SPLIT`) for rows of `n_chunks` of `ty`:
/// [`ks1_token_slices`]'s slots where one subgroup walks the rows in slices,
/// [`ks1_split`]'s where it splits them, else [`ks1_shape`]'s on one subgroup.
pub(super) fn ks1_token_shape(ctx: &GpuContext, ty: GgmlType, n_chunks: u64) -> (u32, u32, u32) {
    if let Some((slots, _)) = ks1_token_slices(ctx, ty, n_chunks) {
        return (1, slots, 1);
    }
    match ks1_split(ctx, ty, n_chunks) {
        Some((split, slots)) => (1, slots, split),
        None => {
            let (groups, slots) = ks1_shape(ctx, n_chunks);
            (groups, slots, 1)
        }
    }
}

/// Whether single tokens of rows of `n_chunks` of `ty` run `mul_mat_ks1` although one
/// subgroup's slots do not hold them: split ([`ks1_split`]) or in slices
/// ([`ks1_token_slices`]).
fn ks1_long_rows(ctx: &GpuContext, ty: GgmlType, n_chunks: u64) -> bool {
    ks1_token_slices(ctx, ty, n_chunks).is_some() || ks1_split(ctx, ty, n_chunks).is_some()
}

/// Whether `Ks` walks a single token's chunks in pairs (`PAIRED` in mul_mat_ks.wgsl):
/// the K-quants, whose neighbouring chunks share words (Q6_K: 1.2-1.4x on lavapipe at
/// batch 1).
pub(super) fn ks_paired(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Whether single tokens of a `Ks` or `KsU` product of `ty` on rows of `n_cols`
/// elements run `mul_mat_ks1`: rows whose activations the subgroup holds in registers.
/// Measured on lavapipe, batch 1 (docs/perf.md): 1.4-2x on long stacks of three-chunk
/// rows, 1.3-1.6x on 1536 columns with six; Q4_K and Q5_K, one chunk per slot though
/// neighbouring chunks share words, 1.15-1.7x at 512-1536 columns, and 1.24-1.53x more
/// where a lane's chunks go in pairs (the walk `pairs`). Q6_K, whose chunk alone takes six loads
/// (four in a pair), gained nothing there one chunk at a time; in pairs it runs single
/// tokens 1.17-1.25x and batches of 16 and 64 (the float tiles) 1.1-1.35x faster than
/// in `ks`.
/// Past [`KS1_UNPAIRED_MAX_SLOTS`], the K-quants only on an even count of slots, in
/// pairs.
/// Rows past [`KS1_MAX_SLOTS`] chunks a lane run there too where one subgroup walks
/// them in slices ([`ks1_token_slices`]) or [`ks1_split`] splits them over a
/// workgroup's subgroups.
pub(super) fn ks1_fits(ctx: &GpuContext, v: Variant, ty: GgmlType, n_cols: u64) -> bool {
    let slots = ks1_slots(ctx, n_cols / 32);
    let unpaired_k_quant = ks_paired(ty) && slots % 2 == 1;
    let one_subgroup = slots > 0 && (slots <= KS1_UNPAIRED_MAX_SLOTS || !unpaired_k_quant);
    matches!(v, Variant::Ks | Variant::KsU) && (one_subgroup || ks1_long_rows(ctx, ty, n_cols / 32))
}

/// Whether batches of a product of `ty` run `mul_mat_ks1`'s tile builds (or
/// `mul_mat_ks1i` for the types of [`ks1_int`]): products that [`ks1_fits`], on rows of
/// at most [`KS1_MAX_SLOTS`] chunks per lane. Longer rows that [`ks1_fits`] (split
/// over subgroups) run only their single tokens there, their batches in `ks`.
///
/// At seven and eight slots (1792 and 2048 columns on 8-lane subgroups), measured on
/// lavapipe against `ks` (docs/perf.md), 2048x12288 at 16 and 64 tokens: Q4_0 and
/// Q4_1 1.5-1.7x, Q5_0 1.3-1.45x (`mul_mat_ks1i`), Q8_0 1.3x, Q4_K 1.2x, Q6_K
/// 1.1-1.45x (the float tiles); synthetic 1B models' prompts (2048 columns) 1.27-1.37x
/// (Q4_0) and 1.10-1.17x (Q4_K_M).
pub(super) fn ks1_batches_fit(ctx: &GpuContext, v: Variant, ty: GgmlType, n_cols: u64) -> bool {
    ks1_fits(ctx, v, ty, n_cols) && ks1_slots(ctx, n_cols / 32) > 0
}

/// For batches of a `Ks` product of `ty` on rows too long for one subgroup's slots
/// (past [`KS1_MAX_SLOTS`] chunks a lane, whose single tokens run `mul_mat_ks1` in
/// slices or split, [`ks1_token_slices`], [`ks1_split`]), the
/// slices of columns `mul_mat_ks1`'s tiles walk them in, one dispatch each: the chunks
/// per slice (the last may hold fewer) and the slots per lane. Each slice's tiles add
/// the products of its columns into the output, so that a tile holds the activations of
/// at most [`KS1_MAX_SLOTS`] chunks a lane in registers; slices of equal slots, the
/// fewest that hold the row. `None` where the rows fit one subgroup
/// ([`ks1_batches_fit`]), where single tokens do not run them there, for the types that
/// are not [`ks1_sliced`], or with [`GpuContext::sliced_batches`] off.
pub(super) fn ks1_slices(
    ctx: &GpuContext,
    v: Variant,
    ty: GgmlType,
    n_cols: u64,
) -> Option<(u32, u32)> {
    let n_chunks = n_cols / 32;
    let long_rows = ks1_long_rows(ctx, ty, n_chunks);
    if !ctx.sliced_batches || v != Variant::Ks || !ks1_sliced(ty) || !long_rows {
        return None;
    }
    let lanes = ctx.fixed_subgroup()?.max(1) as u64;
    let slots = equal_slices(n_chunks, lanes);
    let chunks = u32::try_from(slots * lanes).ok()?;
    Some((chunks, slots as u32))
}

/// The types whose batches past [`KS1_MAX_SLOTS`] chunks a lane run in slices
/// ([`ks1_slices`]). Measured on lavapipe against `mul_mat_ks` (docs/perf.md, "Batches
/// past 2048 columns in slices"; "Q8_0's batches in slices"), 16 and 64 tokens at 4096,
/// 8192 and 14336 columns: Q4_0, Q4_1 and Q5_0 1.1-1.45x; Q4_K, Q5_K and Q6_K 1.2-1.35x,
/// 1.2-1.9x and 1.15-1.25x at 8192 (the types `mul_mat_ks1i` dots in integers, [`ks1_int`]); Q8_0 in
/// the float tiles 1.05-1.2x. Q4_K and Q6_K in the float tiles gained nothing
/// before they were dotted in integers.
pub(super) fn ks1_sliced(ty: GgmlType) -> bool {
    ks1_int(ty) || ty == GgmlType::Q8_0
}

/// Whether batches of a `Ks` product of `ty` run `mul_mat_ks1`'s tile builds (or
/// `mul_mat_ks1i`), over whole rows ([`ks1_batches_fit`]) or slices of them
/// ([`ks1_slices`]).
pub(super) fn ks1_tiles_run(ctx: &GpuContext, v: Variant, ty: GgmlType, n_cols: u64) -> bool {
    ks1_batches_fit(ctx, v, ty, n_cols) || ks1_slices(ctx, v, ty, n_cols).is_some()
}

/// Whether batches of a `Ks` product of `ty` that [`ks1_fits`] run `mul_mat_ks1i`,
/// which quantizes the activations to 8 bits per chunk of 32 (as ggml's CPU backend
/// does for these types) and dots two rows at a time in packed integers, instead of
/// `mul_mat_ks1`'s float tiles: the types whose chunks the packing holds
/// (common/quant/pairs.wgsl). Measured on lavapipe (docs/perf.md). The K-quants run
/// there too, a lane's neighbouring chunks unpacked together where it holds an even
/// count (region `chunk_pairs`): Q4_K and Q5_K, whose chunk is a sub-block with its own scale
/// and min, 1.2-1.4x and 1.15-1.35x their float tiles at 2048 and 8192 columns (a
/// synthetic 1B Q4_K_M model's prompts 1.3x); Q6_K, whose chunk is two sub-blocks with
/// a scale each, 1.05-1.3x in pairs (one chunk at a time it ran 0.95x in tiles of four
/// and 1.15x in tiles of eight) ("The K-quants' batches in integers").
pub(super) fn ks1_int(ty: GgmlType) -> bool {
    crate::gpu::shaders::pair_decoder(ty).is_some()
}

/// Whether a single token's lanes in `Ks` walk contiguous runs of a row (`RUNS` in
/// mul_mat_ks.wgsl): types whose chunks hold 16 or 20 bytes of quants gain (Q4_0 2x at
/// 8B shapes on lavapipe); Q8_0 and F16, whose chunks span 32 and 64 bytes, lose.
pub(super) fn ks_runs(ty: GgmlType) -> bool {
    !matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F32
    )
}

/// Workgroups of variant `v` for `n_rows` rows: one row per invocation (`Row`, `Win`,
/// `WinU`), per workgroup (`Wg`, `Sg`), `ks_rows` per workgroup (`Ks`, `KsU`: `KS_ROWS`,
/// or [`ks1_rows`] for the builds of `mul_mat_ks1`) or `MR_ROWS` (`Mr`); grids wider
/// than the per-dimension limit fold into y.
pub(super) fn grid(v: Variant, n_rows: u32, ks_rows: u32, max_groups: u32) -> [u32; 3] {
    let n_wg = match v {
        Variant::Row | Variant::Win | Variant::WinU => return [groups(n_rows, WG), 1, 1],
        Variant::Wg | Variant::Sg => n_rows,
        Variant::Ks | Variant::KsU => n_rows.div_ceil(ks_rows.max(1)),
        Variant::Mr => n_rows.div_ceil(MR_ROWS),
    };
    let gx = n_wg.min(max_groups).max(1);
    [gx, n_wg.div_ceil(gx), 1]
}

/// `mul_mat_mm`'s grid over `n_rows` rows and a step's output tokens `toks.0 ..
/// toks.0 + toks.1`: a tile of rows by a tile of tokens per workgroup.
pub(super) fn mm_grid(
    n_rows: u32,
    (tok0, tok_n): (u32, u32),
    max_groups: u32,
    name: &str,
) -> Result<impl Fn(&StepInfo) -> [u32; 3] + Copy + Send + Sync + 'static> {
    let gx = n_rows.div_ceil(MM_ROWS);
    if gx > max_groups {
        return Err(Error::Unsupported(format!(
            "{name}: {n_rows} rows in one binding, more than the tiled product's grid holds"
        )));
    }
    Ok(move |s: &StepInfo| [gx, tokens_in(s, (tok0, tok_n)).div_ceil(MM_TOKENS), 1])
}

/// How many of output tokens `tok0 .. tok0 + tok_n` step `s` has.
pub(super) fn tokens_in(s: &StepInfo, (tok0, tok_n): (u32, u32)) -> u32 {
    s.n_tokens
        .min(tok0.saturating_add(tok_n))
        .saturating_sub(tok0)
}
