//! Quantized matrix times activations, dequantizing inside the kernel
//! (`shaders/ops/mul_mat.wgsl` with the weight type's decoder).

use super::glu::Activation;
use super::kv_store::{CacheAppend, CacheViews};
use super::{dispatch, dispatch_bound, groups, Dispatch, Pipe, StepInfo, WG};
use crate::gpu::pipelines::Binding;
use crate::gpu::shaders::Form;
use crate::gpu::upload::{is_vector_uniform, Part, WeightMemory, VECTOR_UNIFORM_BYTES};
use crate::gpu::{GpuContext, GpuTensor};
use crate::quant::GgmlType;
use crate::{Error, Result};

/// The shape part of every mul_mat variant's parameters (`WinParams` adds the rest of
/// `common/mul_mat_params.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub n_rows: u32,
    pub n_cols: u32,
    pub row_bytes: u32,
    pub row0: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub last_only: u32,
    /// 1: the product is added to the output instead of replacing it ([`Store::Add`]).
    pub acc: u32,
}

/// Which activation columns to multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Columns {
    /// Every token of the batch: y is [n_rows, n_tokens].
    All,
    /// Only the batch's last token: y is [n_rows] (logits for sampling).
    Last,
}

pub use super::Store;

/// Kernel variants of `mul_mat`; all compute the same product and are tested against
/// [`reference`]. Which one runs is chosen per device by [`variant`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `mul_mat.wgsl`: one invocation per row, the decoders' u32 loads from storage.
    Row,
    /// `mul_mat_win.wgsl` + `mul_mat_xs.wgsl`: one invocation per row, the row
    /// fetched in windows of vec4 loads into a private array.
    Win,
    /// `mul_mat_win.wgsl` + `mul_mat_xu.wgsl`: as `Win`, activations copied into a
    /// uniform buffer first (`mul_mat_xcopy`), a few tokens at a time (fastest on
    /// lavapipe). Rows longer than the uniform buffer holds run as `Win`. Types stored
    /// planar ([`crate::gpu::layout`]) have no runs of whole blocks and run as `Row`.
    WinU,
    /// `mul_mat_wg.wgsl`: one workgroup per row, coalesced block reads, reduction in
    /// workgroup memory (portable). Batches of [`MM_MIN`] tokens or more run the tiled
    /// product `mul_mat_mm.wgsl` where the device allows it ([`mm_fits`]).
    Wg,
    /// `mul_mat_sg.wgsl`: as `Wg`, reduced with `subgroupAdd` (needs subgroups).
    Sg,
    /// `mul_mat_ks.wgsl`: one subgroup per workgroup owning several rows, the row's
    /// chunks split across its lanes, each activation chunk loaded once for all rows
    /// (needs subgroups of a fixed size).
    Ks,
    /// `Ks` with the activations copied into a uniform buffer first, as `WinU`. Large
    /// products of the last token alone (output heads) run it in place of `Ks`
    /// ([`for_product`]).
    KsU,
    /// `mul_mat_mr.wgsl`: four rows per workgroup, coalesced block reads, each
    /// activation chunk loaded once for the four, reduced with `subgroupAdd` (needs
    /// subgroups; for GPUs). Batches of [`MM_MIN`] tokens or more run the tiled
    /// product `mul_mat_mm.wgsl` where the device allows it ([`mm_fits`]).
    Mr,
}

impl Variant {
    pub const ALL: [Variant; 8] = [
        Variant::Row,
        Variant::Win,
        Variant::WinU,
        Variant::Wg,
        Variant::Sg,
        Variant::Ks,
        Variant::KsU,
        Variant::Mr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Row => "row",
            Variant::Win => "win",
            Variant::WinU => "winu",
            Variant::Wg => "wg",
            Variant::Sg => "sg",
            Variant::Ks => "ks",
            Variant::KsU => "ksu",
            Variant::Mr => "mr",
        }
    }

    pub fn parse(s: &str) -> Option<Variant> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Name of the kernel in the shader table.
    pub fn shader(self) -> &'static str {
        match self {
            Variant::Row => "mul_mat",
            Variant::Win => "mul_mat_win",
            Variant::WinU => "mul_mat_winu",
            Variant::Wg => "mul_mat_wg",
            Variant::Sg => "mul_mat_sg",
            Variant::Ks => "mul_mat_ks",
            Variant::KsU => "mul_mat_ksu",
            Variant::Mr => "mul_mat_mr",
        }
    }

    /// Whether `ctx` can run this variant.
    pub fn available(self, ctx: &GpuContext) -> bool {
        match self {
            Variant::Sg | Variant::Mr => ctx.has_subgroups,
            // One workgroup must be one whole subgroup, so the size must be fixed.
            Variant::Ks | Variant::KsU => ctx.fixed_subgroup().is_some(),
            _ => true,
        }
    }
}

/// Environment variable that overrides the per-device choice (a [`Variant::name`]).
pub const VARIANT_ENV: &str = "WGLLM_MUL_MAT";

/// The variant `mul_mat::gpu` uses for weights of `ty` on `ctx`: the context's
/// (`DeviceOptions::mul_mat`) if set, else `WGLLM_MUL_MAT` if set, else the one measured
/// fastest on this adapter ([`tuned_variant`]), else [`default_variant`].
pub fn variant(ctx: &GpuContext, ty: GgmlType) -> Result<Variant> {
    let (source, want) = match (&ctx.forced_mul_mat, std::env::var(VARIANT_ENV)) {
        (Some(v), _) => ("the device options' mul_mat", v.clone()),
        (None, Ok(v)) => (VARIANT_ENV, v),
        (None, Err(_)) => return Ok(tuned_variant(ctx, ty).unwrap_or_else(|| default_variant(ctx))),
    };
    let v = Variant::parse(&want).ok_or_else(|| {
        let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
        Error::invalid(format!(
            "{source}={want:?}: expected one of {}",
            names.join(", ")
        ))
    })?;
    if !v.available(ctx) {
        return Err(Error::Unsupported(format!(
            "{source}={want}: {} has no subgroup support",
            ctx.info.name
        )));
    }
    Ok(v)
}

/// The variant the tuning file ([`crate::gpu::tuning`]) recorded for `ty` on this
/// adapter, if this build knows it and the device runs it.
pub fn tuned_variant(ctx: &GpuContext, ty: GgmlType) -> Option<Variant> {
    let name = ctx.tuned.mul_mat.get(ty.name())?;
    Variant::parse(name).filter(|v| v.available(ctx))
}

/// The measured best per kind of device (docs/perf.md): CPU-hosted drivers run one
/// SIMD lane per invocation and pay per load, so one subgroup sharing each activation
/// load across many rows wins there (the windowed per-row walk where subgroups are
/// missing); real GPUs want coalesced reads, several rows per workgroup and a subgroup
/// reduction (`Mr`: on an H200, the fastest of every variant for all eight types by
/// `wgllm-bench kernels --save`, 1.7-2.6x `Wg` at 8B layer shapes), or a workgroup
/// reduction without subgroups.
pub fn default_variant(ctx: &GpuContext) -> Variant {
    if ctx.info.device_type == wgpu::DeviceType::Cpu {
        if Variant::Ks.available(ctx) {
            Variant::Ks
        } else {
            Variant::WinU
        }
    } else if Variant::Mr.available(ctx) {
        Variant::Mr
    } else {
        Variant::Wg
    }
}

/// Workgroup size of the row-per-workgroup variants.
const ROW_WG: u32 = 64;

/// Rows per workgroup of `Ks` (`ROWS` in mul_mat_ks.wgsl).
const KS_ROWS: u32 = 64;

/// The most rows one such workgroup takes ([`ks1_rows`]): their trips (four a row,
/// [`ks1_chainable`]) stay well within llvmpipe's 65535 a workgroup.
const KS1_MAX_ROWS: u32 = 4096;

/// What a build of `mul_mat_ks1` or `mul_mat_ks1i` walks per workgroup, which sets its
/// rows per workgroup ([`ks1_rows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ks1Walk {
    /// Single tokens, one at a time.
    Tokens,
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
fn ks1_rows(ctx: &GpuContext, n_rows: u32, walk: Ks1Walk) -> u32 {
    let step = 2 * ctx.subgroup_min_size.clamp(1, KS_ROWS / 2);
    if let Ks1Walk::Heads(head) = walk {
        let rows = ks1_rows(ctx, n_rows, Ks1Walk::Tokens);
        return rows.next_multiple_of(lcm(head.max(1), step));
    }
    if ctx.info.device_type != wgpu::DeviceType::Cpu {
        return KS_ROWS;
    }
    let rows = match walk {
        // Few enough that a window of the fewest tokens stays within the trip budget
        // ([`ks_tok_win`]).
        Ks1Walk::Tiles => n_rows
            .div_ceil(crate::gpu::context::host_cores())
            .min(KS_WALK_TRIPS / KS_TOK_WIN_MIN / step * step),
        Ks1Walk::Tokens | Ks1Walk::Heads(_) => {
            let most = ctx.ks1_max_rows.unwrap_or(KS1_MAX_ROWS);
            n_rows.div_ceil(ks1_groups(ctx)).min(most)
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
fn ks1_chainable(wg_rows: u32) -> crate::ops::chain::Chainable {
    crate::ops::chain::Chainable::fixed(wg_rows.saturating_mul(4).saturating_add(256))
}

/// What a single token's workgroup of `mul_mat_ks` on rows of `n_cols` needs to join a
/// chain (rows too long for `mul_mat_ks1`: Gemma 3's `ffn_down`): a bound on its loop
/// trips. Each of a lane's chunks (or pairs, fewer) walks the workgroup's [`KS_ROWS`]
/// rows, one trip each; the sums are then added and stored in a trip a row and one per
/// block of lanes, and the token loop takes one.
fn ks_chainable(ctx: &GpuContext, n_cols: u64) -> crate::ops::chain::Chainable {
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
const KS_TOK_WIN_ALL: u32 = 1 << 24;

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
/// A window is at least [`KS_TOK_WIN_MIN`] tokens, so [`ks1_rows`] caps a batch's rows
/// per workgroup to keep that window within the budget (a model's output head over
/// every token of a 512-token batch, as `perplexity` runs it, had 24,576 rows per
/// workgroup).
fn ks_tok_win(wg_rows: u32, lane_chunks: u32) -> u32 {
    let per_token = wg_rows.max(1).saturating_mul(lane_chunks.max(1));
    (KS_WALK_TRIPS / per_token / KS_TOK_WIN_MIN * KS_TOK_WIN_MIN).max(KS_TOK_WIN_MIN)
}

/// Rows per workgroup of `Mr` (`ROWS` in mul_mat_mr.wgsl).
const MR_ROWS: u32 = 4;

/// Tokens per pass over `Mr`'s rows in batches (`TILE` in mul_mat_mr.wgsl).
const MR_TILE: u32 = 4;

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
const KS1_TILE: u32 = 4;

/// Whether `mul_mat_ks1i` runs a batch of `n` tokens in tiles of eight rather than
/// four: from [`KS1I_EIGHT_MIN`] tokens. Eight unpack each pair of rows' chunk once for
/// twice the tokens (SmolLM2's and Gemma 3's pp512 1.08-1.09x on lavapipe,
/// docs/perf.md); their last tile pads at most four tokens more than tiles of four,
/// 4 / 68 of the work at 64 tokens. Their pipelines are compiled when a batch first
/// runs them, so shorter prompts never pay for that.
fn ks1i_eight(n: u32) -> bool {
    n >= KS1I_EIGHT_MIN
}

/// Fewest tokens that `mul_mat_ks1i` runs in tiles of eight (`ks1i_eight`).
pub const KS1I_EIGHT_MIN: u32 = 64;

/// Fewest tokens for which `mul_mat_ks` runs a tile (of eight; five to seven run as one
/// short tile): steps of fewer run its build without tiles.
const KS_TILE_MIN: u32 = 5;

/// Chunks of 32 elements each lane of `mul_mat_ks1` holds for rows of `n_chunks` chunks
/// (`SLOTS` in mul_mat_ks1.wgsl): the fewest that cover the row, as every lane dots all
/// its slots on every row (1.2-1.5x on 1024 columns at four slots against six, 1.1-1.8x
/// on 512 at two against three, docs/perf.md); 0 where the row is longer than
/// six chunks per lane.
fn ks1_slots(ctx: &GpuContext, n_chunks: u64) -> u32 {
    match n_chunks.div_ceil(ctx.subgroup_min_size.max(1) as u64) {
        s @ 1..=KS1_MAX_SLOTS => s as u32,
        _ => 0,
    }
}

/// Most chunks a lane of `mul_mat_ks1` holds (the `@slot` lines of mul_mat_ks1.wgsl).
const KS1_MAX_SLOTS: u64 = 6;

/// Rows a single token's subgroup of `mul_mat_ks1` dots at once, and the chunks each
/// lane then holds (`GROUPS` and `SLOTS` in common/ks1_lanes.wgsl), for rows of
/// `n_chunks`: of 1, 2 or 4 rows on a subgroup's lanes split alike, the one whose slots
/// leave the fewest idle, the fewest rows among equals. Every lane dots all its slots:
/// SmolLM2's 18 chunks take 3 slots on 8 lanes (24, 75% busy) or 5 on 4 (20, 90%);
/// Gemma 3's 20 fill 5 slots on 4. One row and [`ks1_slots`] with
/// [`GpuContext::one_row_at_a_time`], or where that takes no row (0).
fn ks1_shape(ctx: &GpuContext, n_chunks: u64) -> (u32, u32) {
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

/// Whether `Ks` walks a single token's chunks in pairs (`PAIRED` in mul_mat_ks.wgsl):
/// the K-quants, whose neighbouring chunks share words (Q6_K: 1.2-1.4x on lavapipe at
/// batch 1).
fn ks_paired(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Whether single tokens of a `Ks` or `KsU` product on rows of `n_cols` elements of
/// `ty` run `mul_mat_ks1`: rows whose activations the subgroup holds in registers.
/// Measured on lavapipe, batch 1 (docs/perf.md): 1.4-2x on long stacks of three-chunk
/// rows, 1.3-1.6x on 1536 columns with six; Q4_K and Q5_K, one chunk per slot though
/// neighbouring chunks share words, 1.15-1.7x at 512-1536 columns. Q6_K, whose chunk
/// alone takes six loads (four in a pair), gained nothing there and keeps `ks`.
fn ks1_fits(ctx: &GpuContext, v: Variant, ty: GgmlType, n_cols: u64) -> bool {
    matches!(v, Variant::Ks | Variant::KsU)
        && ty != GgmlType::Q6_K
        && ks1_slots(ctx, n_cols / 32) > 0
}

/// Whether batches of a `Ks` product of `ty` that [`ks1_fits`] run `mul_mat_ks1i`,
/// which quantizes the activations to 8 bits per chunk of 32 (as ggml's CPU backend
/// does for these types) and dots two rows at a time in packed integers, instead of
/// `mul_mat_ks1`'s float tiles: the types whose chunks the packing holds
/// (common/quant/pairs.wgsl). Measured on lavapipe (docs/perf.md).
fn ks1_int(ty: GgmlType) -> bool {
    crate::gpu::shaders::pair_decoder(ty).is_some()
}

/// Whether a single token's lanes in `Ks` walk contiguous runs of a row (`RUNS` in
/// mul_mat_ks.wgsl): types whose chunks hold 16 or 20 bytes of quants gain (Q4_0 2x at
/// 8B shapes on lavapipe); Q8_0 and F16, whose chunks span 32 and 64 bytes, lose.
fn ks_runs(ty: GgmlType) -> bool {
    !matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F32
    )
}

fn pipeline(
    ctx: &GpuContext,
    ty: GgmlType,
    v: Variant,
    memory: WeightMemory,
    when: Compile,
) -> Result<Pipe> {
    kernel_pipeline(ctx, ty, v, memory, (Build::Whole, when))
}

/// When a kernel's pipeline is compiled: with the plan, or when a step first runs it
/// (the builds that only batches run: a model's start need not wait for them, and a
/// prompt's first step compiles only those of its own size, `warm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compile {
    Now,
    OnFirstUse,
}

const NOW: Compile = Compile::Now;
/// The builds of [`kernels`] that no single token runs.
const LATER: Compile = Compile::OnFirstUse;

/// Which build of a variant's kernel.
#[derive(Clone, Copy, Debug)]
enum Build {
    /// The variant's kernel, for any batch.
    Whole,
    /// `Ks` or `KsU` without its tile loop (`TILES` off in mul_mat_ks.wgsl): every
    /// token alone, for steps of fewer than [`KS_TILE_MIN`] tokens. llvmpipe compiles a
    /// kernel on its first dispatch, and the tile loop is most of that work (about 3 s
    /// against 1-2 s, docs/perf.md): decoding and short prompts never pay it.
    Untiled,
    /// `mul_mat_ks1` (`Ks` and `KsU` only).
    Ks1(Ks1),
    /// `mul_mat_mm`, the tiled product `Mr`, `Wg` and `Sg` run batches of [`MM_MIN`]
    /// tokens or more on ([`mm_fits`]).
    Mm,
    /// `Mr` with `tile` tokens per pass and `lanes` invocations per workgroup
    /// ([`mr_lanes`]). Single tokens run a tile of one: without the tile's other sums
    /// and activations, fewer registers (on an H200, a gate/up product of 2x14336 rows
    /// went from 79 to 54 us, docs/perf.md).
    Mr { tile: u32, lanes: (u32, bool) },
}

/// How a `mul_mat_ks1` kernel is built.
#[derive(Clone, Copy, Debug)]
struct Ks1 {
    /// Chunks per lane ([`ks1_slots`]; [`ks1_shape`] for single tokens).
    slots: u32,
    /// Rows a single token's subgroup dots at once (`GROUPS`, [`ks1_shape`]); 1 in the
    /// batch builds.
    groups: u32,
    /// Whether it folds in the norm before the product (`mul_mat_ks1n`, `Ks` only).
    normed: bool,
    /// Tokens per tile: 1, one token at a time; 4, batches in tiles of four (`TILE`,
    /// or `mul_mat_ks1i` for the types of [`ks1_int`]); 8, `mul_mat_ks1i` in tiles of
    /// eight ([`ks1i_eight`]).
    tile: u32,
    /// The single-token build that ends with RoPE and the cache append
    /// (`mul_mat_ks1nr`, [`gpu_qkv_rope`]).
    rope: Option<RopeBuild>,
}

/// How `mul_mat_ks1nr` is built.
#[derive(Clone, Copy, Debug)]
struct RopeBuild {
    /// Whether each head is normalised first (`HEAD_NORMS`).
    head_norms: bool,
    /// Whether it writes the layer's kept cache textures too (region `tex`).
    tex: bool,
}

/// The pipeline of variant `v` in `build`, compiled `when`.
fn kernel_pipeline(
    ctx: &GpuContext,
    ty: GgmlType,
    v: Variant,
    memory: WeightMemory,
    (build, when): (Build, Compile),
) -> Result<Pipe> {
    let ks1 = match build {
        Build::Ks1(k) => Some(k),
        _ => None,
    };
    // Devices with few storage bindings get kernels with the one output.
    let fused = ctx.fused_outputs();
    let form = Form::new(!fused, memory);
    let normed = ks1.is_some_and(|k| k.normed);
    let int = ks1.is_some_and(|k| k.tile > 1 && v == Variant::Ks && ks1_int(ty));
    let rope = ks1.and_then(|k| k.rope);
    let shader = match (ks1, v) {
        (None, _) if matches!(build, Build::Mm) => "mul_mat_mm",
        (Some(k), Variant::Ks) if rope.is_some() && k.normed && k.tile == 1 => "mul_mat_ks1nr",
        (Some(k), Variant::KsU) if rope.is_some() && k.normed && k.tile == 1 => "mul_mat_ks1unr",
        (None, v) => v.shader(),
        (Some(k), Variant::Ks) if int && k.normed => "mul_mat_ks1in",
        (Some(_), Variant::Ks) if int => "mul_mat_ks1i",
        (Some(k), Variant::Ks) if k.normed => "mul_mat_ks1n",
        (Some(_), Variant::Ks) => "mul_mat_ks1",
        (Some(k), Variant::KsU) if !k.normed => "mul_mat_ks1u",
        (Some(_), Variant::KsU) => "mul_mat_ks1un",
        (Some(_), v) => {
            return Err(Error::gpu(format!(
                "mul_mat variant {} has no mul_mat_ks1 kernel",
                v.name()
            )))
        }
    };
    if rope.is_some() && !crate::gpu::shaders::is_rope_build(shader) {
        return Err(Error::gpu(format!(
            "{shader}: RoPE at the end of a product is a normed single-token build of ks or ksu only"
        )));
    }
    // The RoPE build that writes the layer's kept KV cache textures.
    let tex = match rope {
        Some(r) if r.tex => "_kvtex",
        _ => "",
    };
    let label = format!("{shader}_{ty}{}{tex}", form.suffix());
    // Whether a product replaces its output or is added to it is a parameter
    // (`Params::acc`), not a constant: one pipeline serves both.
    let consts: Vec<(&str, f64)> = match (v, ks1) {
        (Variant::Ks | Variant::KsU, Some(k)) => {
            let mut c = vec![
                ("WG", ctx.subgroup_min_size as f64),
                ("RUNS", ks_runs(ty) as u8 as f64),
                ("SLOTS", k.slots as f64),
                ("GROUPS", k.groups as f64),
            ];
            // `mul_mat_ks1i` is a tile build only.
            if !int {
                c.push(("TILE", (k.tile > 1) as u8 as f64));
            } else {
                c.push(("TILE", k.tile as f64));
            }
            if let Some(r) = rope {
                c.push(("HEAD_NORMS", r.head_norms as u8 as f64));
            }
            c
        }
        _ if matches!(build, Build::Mm) => Vec::new(),
        (Variant::Row, _) => vec![("WG", WG as f64)],
        (Variant::Win | Variant::WinU, _) => {
            vec![("WG", WG as f64), ("NV", Window::of(ty)?.nv as f64)]
        }
        (Variant::Wg | Variant::Sg, _) => vec![("WG", ROW_WG as f64)],
        (Variant::Mr, _) => {
            let (tile, (wg, whole)) = match build {
                Build::Mr { tile, lanes } => (tile, lanes),
                _ => (MR_TILE, mr_shape(ctx)),
            };
            vec![
                ("WG", wg as f64),
                ("SG_WHOLE", whole as u8 as f64),
                ("TILE", tile as f64),
            ]
        }
        (Variant::Ks | Variant::KsU, None) => {
            vec![
                ("WG", ctx.subgroup_min_size as f64),
                ("PAIRED", ks_paired(ty) as u8 as f64),
                ("RUNS", ks_runs(ty) as u8 as f64),
                ("TILES", matches!(build, Build::Whole) as u8 as f64),
            ]
        }
    };
    let mut layout = mul_mat_layout(matches!(v, Variant::KsU | Variant::WinU), memory).to_vec();
    if !fused {
        layout.truncate(6);
    }
    if normed {
        // The norm's weight (common/x_norm.wgsl).
        layout.push(Binding::Uniform);
    }
    if let Some(r) = rope {
        layout.extend(rope_layout(r.tex));
    }
    let source = || {
        let src = crate::gpu::shaders::quant_source_as(shader, ty, form)?;
        Ok(match ks1 {
            Some(k) => {
                let src = crate::gpu::shaders::keep_regions(&src, "rope", rope.is_some());
                let src =
                    crate::gpu::shaders::keep_regions(&src, "tex", rope.is_some_and(|r| r.tex));
                let src = crate::gpu::shaders::keep_slots(&src, k.slots);
                let src = crate::gpu::shaders::keep_regions(&src, "tile4", k.tile != 8);
                crate::gpu::shaders::keep_regions(&src, "tile8", k.tile == 8)
            }
            None => src,
        })
    };
    // Deferred either way: a chain (`ops::chain`) joins the kernel's source and layout.
    let d = ctx
        .pipelines
        .deferred(&ctx.device, &label, &consts, &layout, source)?;
    if when == Compile::Now {
        d.get()?;
    }
    Ok(Pipe::Deferred(d))
}

/// Which steps one of a product's kernels runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Steps {
    Every,
    /// Those with one output token (a single token, or the last one alone).
    One,
    /// Those with several.
    Several,
    /// Those whose tile loop in `mul_mat_ks` would not run: one output token, or fewer
    /// than [`KS_TILE_MIN`].
    Few,
    /// The others.
    Many,
    /// Those with whole tiles of [`KS1_TILE`] tokens (`mul_mat_ks1`'s tile build).
    Tiles,
    /// Batches that are not whole tiles of [`KS1_TILE`] (`OneOrTail` less single tokens).
    Tail,
    /// Batches of fewer than [`KS_TILE_MIN`] tokens (`Few` less single tokens).
    FewSeveral,
    /// Those with one output token, and those with several that are not whole tiles of
    /// four (`mul_mat_ks1`'s single-token build runs the tokens its tiles leave).
    OneOrTail,
    /// Those with several output tokens, fewer than [`MM_MIN`].
    SeveralBelowMm,
    /// Those with one output token or fewer than [`MM_MIN`].
    BelowMm,
    /// Those with at least [`MM_MIN`] (`mul_mat_mm`).
    Mm,
    /// Batches `mul_mat_ks1i` runs in tiles of four ([`ks1i_eight`] false).
    Fours,
    /// Batches it runs in tiles of eight.
    Eights,
}

impl Steps {
    /// These steps less those of one token (which another kernel takes), if any remain.
    fn beyond_one(self) -> Option<Steps> {
        match self {
            Steps::One => None,
            Steps::Every => Some(Steps::Several),
            Steps::OneOrTail => Some(Steps::Tail),
            Steps::Few => Some(Steps::FewSeveral),
            Steps::BelowMm => Some(Steps::SeveralBelowMm),
            s => Some(s),
        }
    }

    /// Whether steps of one token are among these.
    fn admits_one(self) -> bool {
        self.beyond_one() != Some(self)
    }

    fn admits(self, s: &StepInfo, cols: Columns) -> bool {
        let one = cols == Columns::Last || s.n_tokens == 1;
        match self {
            Steps::Every => true,
            Steps::One => one,
            Steps::Several => !one,
            Steps::OneOrTail => one || s.n_tokens % KS1_TILE != 0,
            Steps::Few => one || s.n_tokens < KS_TILE_MIN,
            Steps::Many => !one && s.n_tokens >= KS_TILE_MIN,
            Steps::Tiles => !one && s.n_tokens >= KS1_TILE,
            Steps::Tail => !one && s.n_tokens % KS1_TILE != 0,
            Steps::FewSeveral => !one && s.n_tokens < KS_TILE_MIN,
            Steps::SeveralBelowMm => !one && s.n_tokens < MM_MIN,
            Steps::BelowMm => one || s.n_tokens < MM_MIN,
            Steps::Mm => !one && s.n_tokens >= MM_MIN,
            Steps::Fours => !one && !ks1i_eight(s.n_tokens),
            Steps::Eights => !one && ks1i_eight(s.n_tokens),
        }
    }
}

/// One of a product's kernels ([`kernels`]) and the steps it runs in.
#[derive(Clone)]
struct Kernel {
    pipe: Pipe,
    steps: Steps,
    /// Whether it is `mul_mat_mm`, whose grid has a dimension of token tiles.
    tiled: bool,
    /// Whether it is a single-token build with the GLU store ([`Outputs::glu`]):
    /// `mul_mat_ks1`'s or `mul_mat_mr`'s.
    stores_glu: bool,
    /// For the builds of `mul_mat_ks1` and `mul_mat_ks1i`, whose rows per workgroup the
    /// host chooses ([`ks1_rows`]), what they walk.
    ks1: Option<Ks1Walk>,
}

impl Kernel {
    fn new(pipe: Pipe, steps: Steps) -> Kernel {
        Kernel {
            pipe,
            steps,
            tiled: false,
            stores_glu: false,
            ks1: None,
        }
    }

    /// A build of `mul_mat_ks1` or `mul_mat_ks1i` walking `walk`.
    fn ks1(pipe: Pipe, steps: Steps, walk: Ks1Walk) -> Kernel {
        Kernel {
            ks1: Some(walk),
            ..Kernel::new(pipe, steps)
        }
    }
}

/// The kernels of a product of `cols` and the steps each runs in: the variant's (for
/// `Ks` and `KsU`, its build without tiles in steps too short for one); or where
/// [`ks1_fits`], `mul_mat_ks1` for single tokens and, in batches, its build with tiles
/// of four tokens over the whole tiles beside the single-token build over the one to
/// three tokens left (`Ks`; `KsU` batches run its own tiles; for the types of
/// [`ks1_int`], `mul_mat_ks1i` over every token of a batch, in tiles of four or, from
/// [`KS1I_EIGHT_MIN`] tokens, of eight). Builds that only batches run compile when a
/// step first runs them ([`warm`] compiles those of a given batch size). A product of
/// the last token alone never compiles a tile build. With `normed`, both fold in the
/// norm before the product ([`folds_norm`]). With `ones_elsewhere`, another kernel
/// runs the single tokens (`KsU`'s, [`single_tokens_uniform`]): these run only the
/// other steps, and the builds that single tokens would have run compile when a step
/// first needs them.
fn kernels(
    ctx: &GpuContext,
    shape: (GgmlType, u64, u64, WeightMemory),
    v: Variant,
    (cols, normed): (Columns, bool),
    ones_elsewhere: bool,
) -> Result<Vec<Kernel>> {
    if !ones_elsewhere {
        return kernels_compiled(ctx, shape, v, (cols, normed), NOW);
    }
    let mut ks = kernels_compiled(ctx, shape, v, (cols, normed), LATER)?;
    ks.retain_mut(|k| match k.steps.beyond_one() {
        Some(steps) => {
            k.steps = steps;
            true
        }
        None => false,
    });
    Ok(ks)
}

/// [`kernels`], the builds that single tokens run compiled `ones`.
fn kernels_compiled(
    ctx: &GpuContext,
    (ty, n_rows, n_cols, memory): (GgmlType, u64, u64, WeightMemory),
    v: Variant,
    (cols, normed): (Columns, bool),
    ones: Compile,
) -> Result<Vec<Kernel>> {
    if !ks1_fits(ctx, v, ty, n_cols) {
        if normed {
            return Err(Error::Unsupported(format!(
                "a norm folded into a {} {ty} product of {n_cols} columns",
                v.name()
            )));
        }
        if v == Variant::Mr {
            // Single tokens run a build without the tile's other three tokens.
            let lanes = mr_lanes(ctx, n_rows, n_cols);
            let one = Kernel {
                stores_glu: true,
                ..Kernel::new(
                    kernel_pipeline(ctx, ty, v, memory, (Build::Mr { tile: 1, lanes }, NOW))?,
                    Steps::One,
                )
            };
            if cols == Columns::Last {
                return Ok(vec![one]);
            }
            let tile = MR_TILE;
            let build = (Build::Mr { tile, lanes }, LATER);
            let whole = kernel_pipeline(ctx, ty, v, memory, build)?;
            if !mm_fits(ctx) {
                return Ok(vec![one, Kernel::new(whole, Steps::Several)]);
            }
            let mm = mm_kernel(ctx, ty, v, memory)?;
            return Ok(vec![one, Kernel::new(whole, Steps::SeveralBelowMm), mm]);
        }
        let whole = || pipeline(ctx, ty, v, memory, NOW);
        if matches!(v, Variant::Wg | Variant::Sg) && cols == Columns::All && mm_fits(ctx) {
            // A row per workgroup reads the row once per token: batches run tiled.
            return Ok(vec![
                Kernel::new(whole()?, Steps::BelowMm),
                mm_kernel(ctx, ty, v, memory)?,
            ]);
        }
        if !matches!(v, Variant::Ks | Variant::KsU) {
            return Ok(vec![Kernel::new(whole()?, Steps::Every)]);
        }
        let untiled = kernel_pipeline(ctx, ty, v, memory, (Build::Untiled, ones))?;
        if cols == Columns::Last {
            return Ok(vec![Kernel::new(untiled, Steps::One)]);
        }
        let whole = pipeline(ctx, ty, v, memory, LATER)?;
        return Ok(vec![
            Kernel::new(untiled, Steps::Few),
            Kernel::new(whole, Steps::Many),
        ]);
    }
    let (groups, slots) = ks1_shape(ctx, n_cols / 32);
    let one = Ks1 {
        slots,
        groups,
        normed,
        tile: 1,
        rope: None,
    };
    let single = kernel_pipeline(ctx, ty, v, memory, (Build::Ks1(one), ones))?;
    let single = |steps| Kernel {
        stores_glu: true,
        ..Kernel::ks1(single.clone(), steps, Ks1Walk::Tokens)
    };
    if cols == Columns::Last {
        return Ok(vec![single(Steps::One)]);
    }
    Ok(match v {
        // The tile build runs a batch's whole tiles, the single-token build the rest.
        Variant::Ks => {
            let build = |tile| {
                let build = Build::Ks1(Ks1 {
                    tile,
                    slots: ks1_slots(ctx, n_cols / 32),
                    groups: 1,
                    ..one
                });
                kernel_pipeline(ctx, ty, v, memory, (build, LATER))
            };
            let tiles = build(KS1_TILE)?;
            if ks1_int(ty) {
                // `mul_mat_ks1i` runs every token of a batch, its last tile padded.
                vec![
                    single(Steps::One),
                    Kernel::ks1(tiles, Steps::Fours, Ks1Walk::Tiles),
                    Kernel::ks1(build(8)?, Steps::Eights, Ks1Walk::Tiles),
                ]
            } else {
                let tiles = Kernel::ks1(tiles, Steps::Tiles, Ks1Walk::Tiles);
                vec![single(Steps::OneOrTail), tiles]
            }
        }
        // `KsU` folds a norm only into products of the last token (`for_product`).
        _ if normed => {
            return Err(Error::Unsupported(format!(
                "a norm folded into a {} {ty} product of every token",
                v.name()
            )))
        }
        _ => vec![
            single(Steps::One),
            Kernel::new(pipeline(ctx, ty, v, memory, LATER)?, Steps::Several),
        ],
    })
}

/// `mul_mat_mm` for the batches of [`MM_MIN`] tokens or more of a `v` product.
fn mm_kernel(ctx: &GpuContext, ty: GgmlType, v: Variant, memory: WeightMemory) -> Result<Kernel> {
    Ok(Kernel {
        tiled: true,
        ..Kernel::new(
            kernel_pipeline(ctx, ty, v, memory, (Build::Mm, LATER))?,
            Steps::Mm,
        )
    })
}

/// Weights from which a product of the last token alone runs `KsU` instead of `Ks`.
const KSU_MIN_WEIGHTS: u64 = 1 << 22;

/// The variant a product runs: `v`, except that a `Ks` product of the last token alone
/// over at least [`KSU_MIN_WEIGHTS`] weights (a model's output head) runs as `KsU`,
/// its activations copied into a uniform buffer first. Measured on lavapipe
/// (`wgllm-bench kernels --variant ks,ksu --compare`, batch 1, docs/perf.md): 1.2-1.55x
/// from 576x8192 up (Gemma's 640x262144 head 1.32-1.45x, 4096-column rows 1.28-1.55x),
/// 1.03-1.05x at 640x4096, and 0.76-0.84x on rows of 1536 or fewer, where the copy's
/// dispatch costs more than the kernel gains.
fn for_product(
    ctx: &GpuContext,
    v: Variant,
    (n_rows, n_cols): (u64, u64),
    cols: Columns,
) -> Variant {
    let big = n_rows.saturating_mul(n_cols) >= KSU_MIN_WEIGHTS;
    let uniform_fits = tokens_per_xu(ctx, n_cols) > 0;
    if v == Variant::Ks && cols == Columns::Last && big && uniform_fits {
        Variant::KsU
    } else {
        v
    }
}

/// Whether a `Ks` product of every token (`v`, as resolved) runs its single-token steps
/// on `KsU`'s kernels with the activations bound where they lie, as a uniform
/// ([`reads_uniform`]): no copy's dispatch, and `ksu`'s kernel alone measured
/// 1.03-1.32x faster than `ks` at every layer shape of the two test models (docs/perf.md).
fn single_tokens_uniform(ctx: &GpuContext, v: Variant, cols: Columns, n_cols: u64) -> bool {
    v == Variant::Ks
        && cols == Columns::All
        && binds_x_view(ctx)
        && tokens_per_xu(ctx, n_cols) > 0
        && !ctx.chains()
}

/// Whether the device binds uniforms of [`X_UNIFORM_BYTES`], the size `KsU` declares.
pub fn binds_x_view(ctx: &GpuContext) -> bool {
    ctx.limits.max_uniform_buffer_binding_size >= X_UNIFORM_BYTES
}

/// Whether `x` can be bound as the uniform activations of `KsU` (its first
/// [`X_UNIFORM_BYTES`]): the models' activation buffers ([`crate::gpu::upload::activations`]).
pub(crate) fn reads_uniform(x: &wgpu::Buffer) -> bool {
    x.usage().contains(wgpu::BufferUsages::UNIFORM) && x.size() >= X_UNIFORM_BYTES
}

/// How `mul_mat_win` walks a row of type `ty`: windows of whole blocks, at most
/// `WIN_MAX` bytes so that the window, its misalignment (< 16 bytes) and one straddling
/// word fit the kernel's 256-byte private array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// 32-element chunks per window.
    pub chunks: u32,
    /// Bytes of W per window.
    pub bytes: u32,
    /// vec4 loads per window.
    pub nv: u32,
}

const WIN_ARRAY_BYTES: u64 = 256;
const WIN_MAX: u64 = WIN_ARRAY_BYTES - 15 - 4;

impl Window {
    /// The window fields of the variants that do not walk windows.
    const NONE: Window = Window {
        chunks: 0,
        bytes: 0,
        nv: 0,
    };

    pub fn of(ty: GgmlType) -> Result<Window> {
        // A unit is one chunk, or one block when blocks are larger (K types: 256).
        let unit = (ty.block_size() as u64).max(32);
        let unit_bytes = ty
            .row_bytes(unit)
            .ok_or_else(|| Error::Unsupported(format!("mul_mat_win for {ty}")))?;
        if unit_bytes > WIN_MAX {
            return Err(Error::Unsupported(format!(
                "mul_mat_win: {ty} blocks of {unit_bytes} bytes exceed the window"
            )));
        }
        let units = WIN_MAX / unit_bytes;
        let bytes = units * unit_bytes;
        // Rows and windows are whole units, so windows start on 16-byte boundaries when
        // units are multiples of 16 bytes; otherwise allow for up to 15 bytes before.
        let misalign = if unit_bytes % 16 == 0 { 0 } else { 15 };
        Ok(Window {
            chunks: (units * unit / 32) as u32,
            bytes: bytes as u32,
            nv: (misalign + bytes + 4).div_ceil(16) as u32,
        })
    }
}

/// Every variant's uniform, `common/mul_mat_params.wgsl`'s `Params`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct WinParams {
    base: Params,
    win_chunks: u32,
    win_bytes: u32,
    tok0: u32,
    tok_n: u32,
    seg: Segments,
    /// The folded norm's epsilon ([`Norm`]).
    norm_eps: f32,
    /// 0, or 1 + the activation of a GLU store ([`Outputs::glu`]).
    glu: u32,
    /// Rows per workgroup of `mul_mat_ks1` ([`ks1_rows`]); the other kernels' are
    /// constants.
    wg_rows: u32,
    /// Output tokens per workgroup of the `Ks` family ([`ks_tok_win`]).
    tok_win: u32,
    _pad: u32,
}

impl WinParams {
    /// One parameter block for every variant (`common/mul_mat_params.wgsl`): part `part`
    /// of `w` into `out`, over output tokens `tok0 .. tok0 + tok_n`; the window fields are
    /// the windowed walk's.
    fn new(
        w: &GpuTensor,
        part: &Part,
        cols: Columns,
        out: &Outputs<'_>,
        win: Window,
        (tok0, tok_n): (u32, u32),
    ) -> WinParams {
        WinParams {
            base: Params {
                n_rows: part.n_rows,
                n_cols: w.n_cols() as u32,
                row_bytes: w.row_bytes as u32,
                row0: part.row0,
                x_stride: (w.n_cols() / 4) as u32,
                y_stride: out.y_stride,
                last_only: (cols == Columns::Last) as u32,
                acc: (out.store == Store::Add) as u32,
            },
            win_chunks: win.chunks,
            win_bytes: win.bytes,
            tok0,
            tok_n,
            seg: out.seg,
            norm_eps: 0.0,
            glu: out.glu,
            wg_rows: KS_ROWS,
            tok_win: KS_TOK_WIN_ALL,
            _pad: 0,
        }
    }
}

/// Where a fused product's rows go (`store_out` in common/mul_mat_params.wgsl): rows
/// `seg1..seg2` to the second output, `seg2..seg_end` to the third.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Segments {
    seg1: u32,
    seg2: u32,
    seg_end: u32,
}

impl Segments {
    /// A plain product: every row to the first output.
    const NONE: Segments = Segments {
        seg1: u32::MAX,
        seg2: u32::MAX,
        seg_end: u32::MAX,
    };

    /// Products of `rows[i]` rows each (one to three), one after another.
    fn of(rows: &[u32]) -> Result<Segments> {
        let sum = |r: &[u32]| u32::try_from(r.iter().map(|&n| n as u64).sum::<u64>());
        let too_many = || Error::invalid(format!("a fused product of {rows:?} rows"));
        match *rows {
            [_] => Ok(Segments::NONE),
            [a, _] | [a, _, _] => Ok(Segments {
                seg1: a,
                seg2: sum(&rows[..2]).map_err(|_| too_many())?,
                seg_end: sum(rows).map_err(|_| too_many())?,
            }),
            _ => Err(too_many()),
        }
    }
}

/// Parameters of `mul_mat_xcopy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct CopyParams {
    x_stride: u32,
    tok0: u32,
    tok_n: u32,
    last_only: u32,
}

/// Bytes of the uniform activation buffer of `WinU` (the WGSL array is 4096 vec4s).
pub const X_UNIFORM_BYTES: u64 = 65536;

/// Output tokens per uniform-buffer load for rows of `n_cols`, 0 if not even one fits.
fn tokens_per_xu(ctx: &GpuContext, n_cols: u64) -> u64 {
    let cap = X_UNIFORM_BYTES.min(ctx.limits.max_uniform_buffer_binding_size);
    cap / (n_cols * 4).max(1)
}

/// y = W x (or y += W x); W: [n_cols, n_rows] (any part layout), x: [n_cols, n_tokens],
/// y: [n_rows, ..]. One dispatch per part of W, with the variant [`variant`] picks for
/// `ctx`.
#[allow(clippy::too_many_arguments)]
pub fn gpu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    cols: Columns,
    store: Store,
) -> Result<Vec<Dispatch>> {
    gpu_variant(ctx, variant(ctx, w.ty)?, step, w, x, y, cols, store)
}

/// [`gpu`] with an explicit variant (tests, benchmarks).
#[allow(clippy::too_many_arguments)]
pub fn gpu_variant(
    ctx: &GpuContext,
    v: Variant,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    cols: Columns,
    store: Store,
) -> Result<Vec<Dispatch>> {
    let out = Outputs::plain(ctx, y, w.n_rows(), store);
    Ok(gpu_out(ctx, v, step, w, x, (&out, None), cols, None)?.0)
}

/// ys[i] = rows `rows[i]` of W x, for a W holding several products' rows one after
/// another ([`crate::model::graph::Proj::Fused`]): one dispatch for all of them.
pub fn gpu_rows(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    ys: &[&wgpu::Buffer],
    rows: &[u32],
) -> Result<Vec<Dispatch>> {
    gpu_rows_variant(ctx, variant(ctx, w.ty)?, step, w, x, ys, rows)
}

/// [`gpu_rows`] with an explicit variant (tests).
pub fn gpu_rows_variant(
    ctx: &GpuContext,
    v: Variant,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    ys: &[&wgpu::Buffer],
    rows: &[u32],
) -> Result<Vec<Dispatch>> {
    let out = fused_outputs(ctx, w, ys, rows)?;
    Ok(gpu_out(ctx, v, step, w, x, (&out, None), Columns::All, None)?.0)
}

/// The outputs of a fused product, checked against its rows.
fn fused_outputs<'a>(
    ctx: &'a GpuContext,
    w: &GpuTensor,
    ys: &[&'a wgpu::Buffer],
    rows: &[u32],
) -> Result<Outputs<'a>> {
    if rows.iter().map(|&r| r as u64).sum::<u64>() != w.n_rows() || ys.len() != rows.len() {
        return Err(Error::invalid(format!(
            "{}: {} rows cannot be split as {rows:?} into {} outputs",
            w.name,
            w.n_rows(),
            ys.len()
        )));
    }
    if !ctx.fused_outputs() {
        return Err(Error::Unsupported(format!(
            "{}: fused products on {}, which binds too few storage buffers per stage",
            w.name, ctx.info.name
        )));
    }
    Outputs::fused(ctx, ys, rows)
}

/// The gated activation that a fused gate/up product ([`gpu_gate_up`]) applies itself:
/// act(gate) * up into `out`, [n_ff, n_tokens].
#[derive(Clone, Copy)]
pub struct Glu<'a> {
    pub out: &'a wgpu::Buffer,
    pub act: Activation,
}

/// The rows of a fused gate/up product `w` (n_ff of gate, then n_ff of up) of `x`, or
/// with `norm`, of the norm it folds in ([`gpu_normed`]), into `gate` and `up`; except
/// that single tokens store act(gate) * up into `glu.out` themselves where the kernel
/// running them has the GLU store (`mul_mat_ks1`, `mul_mat_mr`). Returns the dispatches and whether
/// single tokens do: a `glu` dispatch follows for the steps they do not.
pub fn gpu_gate_up(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    (x, norm): (&wgpu::Buffer, Option<Norm<'_>>),
    [gate, up]: [&wgpu::Buffer; 2],
    glu: Glu<'_>,
) -> Result<(Vec<Dispatch>, bool)> {
    let n_ff = (w.n_rows() / 2) as u32;
    let out = fused_outputs(ctx, w, &[gate, up], &[n_ff, n_ff])?;
    let glu_out = Outputs::glu(ctx, glu.out, n_ff, glu.act);
    let io = (&out, Some(&glu_out));
    match norm {
        Some(n) => {
            check_norm(ctx, w, n)?;
            gpu_out(ctx, Variant::Ks, step, w, n.x, io, Columns::All, norm)
        }
        None => gpu_out(ctx, variant(ctx, w.ty)?, step, w, x, io, Columns::All, None),
    }
}

/// The norm a product folds into its kernels (`mul_mat_ks1n`): instead of reading
/// `rms_norm(x) * w` from a buffer a norm dispatch wrote, the kernel reads the residual
/// stream `x` and normalises it itself, so the step needs no norm dispatch before the
/// product (on CPU-hosted drivers each dispatch costs tens of microseconds whatever its
/// size).
#[derive(Clone, Copy)]
pub struct Norm<'a> {
    /// The residual stream, [n_cols, n_tokens].
    pub x: &'a wgpu::Buffer,
    /// The norm's weight, [n_cols] f32.
    pub w: &'a wgpu::Buffer,
    pub eps: f32,
}

/// Whether products of rows of `n_cols` elements of `ty` held in `memory` can fold the
/// norm before them into their kernels ([`gpu_normed`]): where they run `mul_mat_ks1`
/// in the `Ks` variant, the device binds the norm's weight as a uniform
/// ([`VECTOR_UNIFORM_BYTES`]), and there are few enough rows. Every workgroup of 64
/// rows computes the norm again, which a separate norm's dispatch does once: Gemma 3's
/// output head (262144 rows) took 38-39 ms folded against 27 ms after a norm of its own
/// on lavapipe (docs/perf.md).
pub fn folds_norm(
    ctx: &GpuContext,
    ty: GgmlType,
    (n_rows, n_cols): (u64, u64),
    memory: WeightMemory,
) -> bool {
    let v = variant(ctx, ty).and_then(|v| resolve(ctx, v, ty, n_cols, memory));
    ctx.fused_outputs()
        && ctx.limits.max_uniform_buffer_binding_size >= VECTOR_UNIFORM_BYTES
        && n_cols * 4 <= VECTOR_UNIFORM_BYTES
        && n_rows <= FOLD_MAX_ROWS
        && matches!(v, Ok(Variant::Ks))
        && ks1_fits(ctx, Variant::Ks, ty, n_cols)
}

/// The most rows of a product that folds the norm before it ([`folds_norm`]).
pub const FOLD_MAX_ROWS: u64 = 16384;

/// ys[i] = rows `rows[i]` of W xn (one output: `ys = [y]`, `rows = [n_rows]`), where
/// xn = rms_norm(norm.x) * norm.w is computed by the kernels themselves ([`Norm`]; only
/// where [`folds_norm`]).
pub fn gpu_normed(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    norm: Norm<'_>,
    ys: &[&wgpu::Buffer],
    rows: &[u32],
    cols: Columns,
) -> Result<Vec<Dispatch>> {
    check_norm(ctx, w, norm)?;
    let out = match ys {
        [y] => Outputs::plain(ctx, y, w.n_rows(), Store::Write),
        _ => Outputs::fused(ctx, ys, rows)?,
    };
    Ok(gpu_out(
        ctx,
        Variant::Ks,
        step,
        w,
        norm.x,
        (&out, None),
        cols,
        Some(norm),
    )?
    .0)
}

/// Whether a layer's Q/K/V product `w` runs as [`gpu_qkv_rope`] on `ctx`, with its
/// keys and values joining the cache as `append` says: it folds the norm before it
/// ([`folds_norm`]), lies in one part, its heads are whole texels of eight, and the
/// device binds the RoPE's buffers and textures beside the product's.
pub fn fuses_rope(ctx: &GpuContext, w: &GpuTensor, append: &CacheAppend<'_>) -> bool {
    let (hd, n_rot) = (append.rope.head_dim, append.rope.n_rot);
    // The product's weights (two views), x, its three outputs, the two caches.
    let (buffers, textures) = match w.memory {
        WeightMemory::Buffer => (8, 0),
        WeightMemory::Texture => (6, 2),
    };
    let textures = textures + 2 * append.tex.is_some() as u32;
    let l = &ctx.limits;
    folds_norm(ctx, w.ty, (w.n_rows(), w.n_cols()), w.memory)
        && w.parts.len() == 1
        && hd > 0
        && hd % 8 == 0
        && n_rot % 2 == 0
        && n_rot <= hd
        && l.max_storage_buffers_per_shader_stage >= buffers
        && l.max_storage_textures_per_shader_stage >= textures
        // step, params, the norm's weight, the RoPE's parameters, the heads' norms
        && l.max_uniform_buffers_per_shader_stage >= 6
        && append.check(ctx).is_ok()
}

/// A layer's Q/K/V product `w` of the norm it folds in ([`gpu_normed`]) into `ys` (Q, K,
/// V), whose single tokens go on, inside the product, to rotate Q in place and append
/// K and V to the cache as `append` says (`mul_mat_ks1nr`, common/ks1_rope.wgsl): the
/// step then runs no `rope_store`. `rows` are Q's, K's and V's rows; or Q's and K's
/// where V is a product of its own, which must have run into `ys[2]` before this one.
/// Returns the dispatches and whether single tokens append: a `rope_store` (batches
/// only, if they do) follows.
pub fn gpu_qkv_rope(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    norm: Norm<'_>,
    (ys, rows): ([&wgpu::Buffer; 3], &[u32]),
    append: &CacheAppend<'_>,
) -> Result<(Vec<Dispatch>, bool)> {
    check_norm(ctx, w, norm)?;
    if !fuses_rope(ctx, w, append) {
        return Err(Error::Unsupported(format!(
            "{}: RoPE and the cache append inside the product on {}",
            w.name, ctx.info.name
        )));
    }
    let (hd, kv_dim) = (append.rope.head_dim, append.dims.0);
    let q_rows = hd * append.rope.n_heads;
    let shaped = match *rows {
        [q, k, v] => q == q_rows && k == kv_dim && v == kv_dim,
        [q, k] => q == q_rows && k == kv_dim,
        _ => false,
    };
    if !shaped {
        return Err(Error::invalid(format!(
            "{}: rows {rows:?} are not {} heads of Q and {kv_dim} of K (and of V)",
            w.name, append.rope.n_heads
        )));
    }
    let out = fused_outputs(ctx, w, &ys[..rows.len()], rows)?;
    let one = Outputs {
        // With V apart, the third output is where its product left it.
        ys,
        rope: Some(RopeOut::new(ctx, append, norm, rows.len() == 2)),
        ..fused_outputs(ctx, w, &ys[..rows.len()], rows)?
    };
    let io = (&out, Some(&one));
    gpu_out(
        ctx,
        Variant::Ks,
        step,
        w,
        norm.x,
        io,
        Columns::All,
        Some(norm),
    )
}

/// Compile (or find) the single-token build of a Q/K/V product of `shape` (its type,
/// rows and row length) that ends with RoPE and the cache append ([`gpu_qkv_rope`]),
/// with or without the heads' norms and the kept textures' writes, as recording a model
/// whose activations are its own buffers (`gpu::upload::activations`) will ask for it:
/// so that it can be built on another thread while the weights upload.
pub fn warm_rope(
    ctx: &GpuContext,
    (ty, n_rows, n_cols): (GgmlType, u64, u64),
    (head_norms, tex): (bool, bool),
) -> Result<()> {
    let memory = ctx.matrix_memory(ty);
    let v = resolve(ctx, variant(ctx, ty)?, ty, n_cols, memory)?;
    let v = for_product(ctx, v, (n_rows, n_cols), Columns::All);
    let direct = single_tokens_uniform(ctx, v, Columns::All, n_cols) && binds_x_view(ctx);
    let v = if direct { Variant::KsU } else { v };
    let rope = RopeOut::kernel_build(ctx, n_cols, RopeBuild { head_norms, tex });
    kernel_pipeline(ctx, ty, v, memory, (Build::Ks1(rope), NOW)).map(drop)
}

/// What `mul_mat_ks1nr` binds past the product's own bindings (common/ks1_rope.wgsl).
struct RopeOut<'a> {
    params: wgpu::Buffer,
    caches: [&'a wgpu::Buffer; 2],
    /// The heads' norms' weights, or where there are none the folded norm's (bound,
    /// unread).
    norms: [&'a wgpu::Buffer; 2],
    tex: Option<CacheViews<'a>>,
    head_dim: u32,
    build: RopeBuild,
}

impl<'a> RopeOut<'a> {
    fn new(ctx: &GpuContext, a: &CacheAppend<'a>, norm: Norm<'a>, v_apart: bool) -> RopeOut<'a> {
        RopeOut {
            params: super::uniform(ctx, "mul_mat_ks1nr rope", &a.params(v_apart)),
            caches: a.caches,
            norms: a.norms.map_or([norm.w, norm.w], |n| [n.q, n.k]),
            tex: a.tex,
            head_dim: a.rope.head_dim,
            build: RopeBuild {
                head_norms: a.norms.is_some(),
                tex: a.tex.is_some(),
            },
        }
    }

    /// The single-token kernel of a `v` product of `shape` that ends with this.
    fn kernel(
        &self,
        ctx: &GpuContext,
        v: Variant,
        shape: (GgmlType, u64, u64, WeightMemory),
    ) -> Result<Kernel> {
        let (ty, _, n_cols, memory) = shape;
        let build = RopeOut::kernel_build(ctx, n_cols, self.build);
        let pipe = kernel_pipeline(ctx, ty, v, memory, (Build::Ks1(build), NOW))?;
        Ok(Kernel {
            stores_glu: true,
            ..Kernel::ks1(pipe, Steps::One, Ks1Walk::Heads(self.head_dim))
        })
    }

    /// The single-token build of rows of `n_cols` that ends with `rope`.
    fn kernel_build(ctx: &GpuContext, n_cols: u64, rope: RopeBuild) -> Ks1 {
        let (groups, slots) = ks1_shape(ctx, n_cols / 32);
        Ks1 {
            slots,
            groups,
            normed: true,
            tile: 1,
            rope: Some(rope),
        }
    }

    /// Bindings 9.. ([`rope_layout`]).
    fn bindings(&self) -> Vec<wgpu::BindingResource<'_>> {
        let mut b = vec![
            self.params.as_entire_binding(),
            self.caches[0].as_entire_binding(),
            self.caches[1].as_entire_binding(),
            self.norms[0].as_entire_binding(),
            self.norms[1].as_entire_binding(),
        ];
        if let Some(t) = self.tex {
            b.push(wgpu::BindingResource::TextureView(t.k));
            b.push(wgpu::BindingResource::TextureView(t.v));
        }
        b
    }
}

/// Bindings 9.. of `mul_mat_ks1nr`: the RoPE's parameters, the K and V caches, the
/// heads' norms' weights, and with `tex` the kept K and V textures.
fn rope_layout(tex: bool) -> Vec<Binding> {
    let mut b = vec![
        Binding::Uniform,
        Binding::ReadWrite,
        Binding::ReadWrite,
        Binding::Uniform,
        Binding::Uniform,
    ];
    if tex {
        b.extend([Binding::TextureWrite, Binding::TextureWrite]);
    }
    b
}

/// Whether a product of `w` can fold in `norm` ([`folds_norm`], and its weight bound as
/// a uniform).
fn check_norm(ctx: &GpuContext, w: &GpuTensor, norm: Norm<'_>) -> Result<()> {
    if !folds_norm(ctx, w.ty, (w.n_rows(), w.n_cols()), w.memory) {
        return Err(Error::Unsupported(format!(
            "{}: a norm folded into its product on {}",
            w.name, ctx.info.name
        )));
    }
    let nw = norm.w;
    if !is_vector_uniform(nw) {
        return Err(Error::gpu(format!(
            "{}: a folded norm's weight must be a uniform buffer of at least {VECTOR_UNIFORM_BYTES} bytes (gpu::upload::vector_init), got {} bytes",
            w.name,
            nw.size()
        )));
    }
    Ok(())
}

/// Where a dispatch's products go: up to three buffers and the rows of each.
struct Outputs<'a> {
    /// Whether the kernels bind the second and third ([`GpuContext::fused_outputs`]).
    bound: bool,
    ys: [&'a wgpu::Buffer; 3],
    seg: Segments,
    /// Floats between the first output's columns.
    y_stride: u32,
    /// Whether the products replace the outputs or are added to them (`Params::acc`).
    store: Store,
    /// 0, or 1 + the activation of a GLU store ([`Outputs::glu`]).
    glu: u32,
    /// The RoPE and cache append a single token's Q/K/V product ends with
    /// ([`gpu_qkv_rope`]).
    rope: Option<RopeOut<'a>>,
}

impl<'a> Outputs<'a> {
    fn plain(ctx: &'a GpuContext, y: &'a wgpu::Buffer, n_rows: u64, store: Store) -> Outputs<'a> {
        let spare = &ctx.unused_output;
        Outputs {
            bound: ctx.fused_outputs(),
            ys: [y, spare, spare],
            seg: Segments::NONE,
            y_stride: n_rows as u32,
            store,
            glu: 0,
            rope: None,
        }
    }

    /// act(gate) * up into `y` ([n_ff, n_tokens]), from a product holding n_ff rows of
    /// gate then n_ff of up (`mul_mat_ks1`'s GLU store, single tokens only).
    fn glu(ctx: &'a GpuContext, y: &'a wgpu::Buffer, n_ff: u32, act: Activation) -> Outputs<'a> {
        Outputs {
            glu: act as u32 + 1,
            ..Outputs::plain(ctx, y, n_ff as u64, Store::Write)
        }
    }

    fn fused(ctx: &'a GpuContext, ys: &[&'a wgpu::Buffer], rows: &[u32]) -> Result<Outputs<'a>> {
        let seg = Segments::of(rows)?;
        let spare = &ctx.unused_output;
        let y = |i: usize| ys.get(i).copied().unwrap_or(spare);
        Ok(Outputs {
            bound: ctx.fused_outputs(),
            ys: [y(0), y(1), y(2)],
            seg,
            y_stride: rows[0],
            store: Store::Write,
            glu: 0,
            rope: None,
        })
    }

    /// Bindings 2..: weights, activations, outputs ([`mul_mat_layout`]).
    fn bindings(&self, w: &'a Part, x: &'a wgpu::Buffer) -> Vec<wgpu::BindingResource<'a>> {
        let mut b = weight_bindings(w, x, self.ys[0]);
        if self.bound {
            b.extend([
                self.ys[1].as_entire_binding(),
                self.ys[2].as_entire_binding(),
            ]);
        }
        b
    }
}

/// The dispatches of a product into `out`; with `glu`, its single tokens go there
/// instead where the kernel that runs them has the GLU store. Returns whether they do.
#[allow(clippy::too_many_arguments)]
fn gpu_out(
    ctx: &GpuContext,
    v: Variant,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    (out, glu): (&Outputs<'_>, Option<&Outputs<'_>>),
    cols: Columns,
    norm: Option<Norm<'_>>,
) -> Result<(Vec<Dispatch>, bool)> {
    if w.n_cols() % 32 != 0 {
        return Err(Error::Unsupported(format!(
            "{}: rows of {} elements (the GPU matmul needs a multiple of 32)",
            w.name,
            w.n_cols()
        )));
    }
    let v = resolve(ctx, v, w.ty, w.n_cols(), w.memory)?;
    let v = for_product(ctx, v, (w.n_rows(), w.n_cols()), cols);
    let per_xu = tokens_per_xu(ctx, w.n_cols());
    if matches!(v, Variant::WinU | Variant::KsU) {
        let plan = gpu_uniform_x(ctx, v, step, w, (x, norm), out, cols, per_xu)?;
        return Ok((plan, false));
    }
    // The GLU store reads gate and up from one part; so does the RoPE at the end of a
    // Q/K/V product read back its heads ([`fuses_rope`]).
    let glu = glu
        .filter(|g| w.parts.len() == 1 && (g.rope.is_some() || glu_rows_fit(ctx, v, g.y_stride)));
    let mut plan = Vec::new();
    let mut glu_stored = false;
    let shape = (w.ty, w.n_rows(), w.n_cols(), w.memory);
    let x_read = norm.map_or(x, |n| n.x);
    let direct = single_tokens_uniform(ctx, v, cols, w.n_cols()) && reads_uniform(x_read);
    // (variant, every token or the first load's, kernels)
    let mut runs = Vec::new();
    if direct {
        // Single tokens: `KsU`'s single-token build, reading x where it lies.
        let ks = kernels(
            ctx,
            shape,
            Variant::KsU,
            (Columns::Last, norm.is_some()),
            false,
        )?;
        runs.push((Variant::KsU, (0, per_xu as u32), ks));
    }
    let ks = kernels(ctx, shape, v, (cols, norm.is_some()), direct)?;
    runs.push((v, (0, u32::MAX), ks));
    for (v, toks, ks) in runs {
        for k in ks {
            let mut parts = |k: &Kernel, steps: Steps, out: &Outputs<'_>| {
                let on = move |s: &StepInfo| steps.admits(s, cols);
                let io = (x, out, norm);
                let d = part_dispatches(ctx, (v, k), step, w, io, cols, toks, on)?;
                plan.extend(d);
                Result::Ok(())
            };
            match glu {
                // Single tokens store act(gate) * up, or rotate and append their heads
                // (in the build that does); the other steps store their products.
                Some(g)
                    if k.stores_glu
                        && k.steps.admits_one()
                        && (g.rope.is_none() || ks_family(v)) =>
                {
                    let one = match &g.rope {
                        Some(r) => r.kernel(ctx, v, shape)?,
                        None => k.clone(),
                    };
                    parts(&one, Steps::One, g)?;
                    glu_stored = true;
                    if let Some(rest) = k.steps.beyond_one() {
                        parts(&k, rest, out)?;
                    }
                }
                _ => parts(&k, k.steps, out)?,
            }
        }
    }
    Ok((plan, glu_stored))
}

/// Whether `v` is of the `Ks` family, whose single tokens run `mul_mat_ks1`.
fn ks_family(v: Variant) -> bool {
    matches!(v, Variant::Ks | Variant::KsU)
}

/// Whether `v`'s single-token build stores the GLU of `n_ff` gate rows: `mul_mat_ks1`
/// walks the rows in blocks of a subgroup's lanes, `mr` in pairs of any number.
fn glu_rows_fit(ctx: &GpuContext, v: Variant, n_ff: u32) -> bool {
    v == Variant::Mr || n_ff % ctx.subgroup_min_size.max(1) == 0
}

/// One dispatch per part of W with `kernel` (of variant `v`), reading activations from
/// `x` (storage, or the uniform copy; with a [`Norm`], its residual stream) for output
/// tokens `tok0 .. tok0 + tok_n`; a step for which `on` is false gets an empty grid.
#[allow(clippy::too_many_arguments)]
fn part_dispatches(
    ctx: &GpuContext,
    (v, kernel): (Variant, &Kernel),
    step: &wgpu::Buffer,
    w: &GpuTensor,
    (x, out, norm): (&wgpu::Buffer, &Outputs<'_>, Option<Norm<'_>>),
    cols: Columns,
    toks: (u32, u32),
    on: impl Fn(&StepInfo) -> bool + Copy + Send + Sync + 'static,
) -> Result<Vec<Dispatch>> {
    // Only the windowed walks read the window fields.
    let window = match v {
        Variant::Win | Variant::WinU => Window::of(w.ty)?,
        _ => Window::NONE,
    };
    let max_groups = ctx.limits.max_compute_workgroups_per_dimension.max(1);
    let label = format!("mul_mat {}", w.name);
    w.parts
        .iter()
        .map(|part| {
            let mut wp = WinParams::new(w, part, cols, out, window, toks);
            if let Some(walk) = kernel.ks1 {
                wp.wg_rows = ks1_rows(ctx, part.n_rows, walk);
            }
            let g = grid(v, part.n_rows, wp.wg_rows, max_groups);
            let walks_rows = matches!(v, Variant::Ks | Variant::KsU) && !kernel.tiled;
            if walks_rows {
                let lane_chunks = match kernel.ks1 {
                    Some(_) => 1,
                    None => (w.n_cols() as u32 / 32).div_ceil(ctx.subgroup_min_size.max(1)),
                };
                wp.tok_win = ks_tok_win(wp.wg_rows, lane_chunks);
            }
            let tok_win = wp.tok_win;
            let x = norm.map_or(x, |n| n.x);
            let mut bindings = out.bindings(part, x);
            if let Some(n) = norm {
                wp.norm_eps = n.eps;
                bindings.push(n.w.as_entire_binding());
            }
            if let Some(r) = &out.rope {
                bindings.extend(r.bindings());
            }
            if matches!(v, Variant::WinU | Variant::KsU) {
                // Binding 3 is a uniform of X_UNIFORM_BYTES: the copy's buffer, or the
                // first bytes of a larger one holding the activations.
                bindings[1] = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: x,
                    offset: 0,
                    size: wgpu::BufferSize::new(X_UNIFORM_BYTES),
                });
            }
            let pipe = kernel.pipe.clone();
            if kernel.tiled {
                let grid = mm_grid(part.n_rows, toks, max_groups, &w.name)?;
                let grid = move |s: &StepInfo| if on(s) { grid(s) } else { [0, 1, 1] };
                return dispatch_bound(ctx, &label, pipe, step, &wp, bindings, grid);
            }
            let grid = move |s: &StepInfo| match on(s) {
                // One workgroup along z per window of the step's output tokens.
                true if walks_rows => {
                    let n = match cols {
                        Columns::Last => 1,
                        Columns::All => tokens_in(s, toks),
                    };
                    [g[0], g[1], n.div_ceil(tok_win).max(1)]
                }
                true => g,
                false => [0, 1, 1],
            };
            let d = dispatch_bound(ctx, &label, pipe, step, &wp, bindings, grid)?;
            Ok(match kernel.ks1 {
                Some(Ks1Walk::Tokens | Ks1Walk::Heads(_)) => d.chainable(ks1_chainable(wp.wg_rows)),
                None if v == Variant::Ks && walks_rows => {
                    d.chainable(ks_chainable(ctx, w.n_cols()))
                }
                _ => d,
            })
        })
        .collect()
}

/// The variant that actually runs `v` for rows of `n_cols` elements of type `ty` held
/// in `memory`.
fn resolve(
    ctx: &GpuContext,
    v: Variant,
    ty: GgmlType,
    n_cols: u64,
    memory: WeightMemory,
) -> Result<Variant> {
    if !v.available(ctx) {
        return Err(Error::Unsupported(format!(
            "mul_mat variant {} on {}",
            v.name(),
            ctx.info.name
        )));
    }
    Ok(match v {
        // Windows are runs of whole blocks, which planar rows (gpu::layout) do not have.
        Variant::Win | Variant::WinU if crate::gpu::layout::planes(ty).is_some() => Variant::Row,
        // The windowed walks read a storage buffer of their own.
        Variant::Win | Variant::WinU if memory == WeightMemory::Texture => Variant::Row,
        // Rows too long for the uniform buffer: the same walk with storage activations.
        Variant::WinU if tokens_per_xu(ctx, n_cols) == 0 => Variant::Win,
        Variant::KsU if tokens_per_xu(ctx, n_cols) == 0 => Variant::Ks,
        v => v,
    })
}

/// Compile (or find) the pipelines [`gpu`] (or with `normed`, [`gpu_normed`]) will use
/// for products of `cols` on rows of `n_cols` elements of type `ty` in single tokens and
/// in steps of `batch` tokens, so that they can be built ahead of recording, on another
/// thread; the builds that other batch sizes run are compiled when a step first runs
/// them. Matrices are held where the context keeps the type's
/// ([`GpuContext::matrix_memory`]).
pub fn warm(
    ctx: &GpuContext,
    (ty, n_rows, n_cols): (GgmlType, u64, u64),
    cols: Columns,
    normed: bool,
    batch: u32,
) -> Result<()> {
    let memory = ctx.matrix_memory(ty);
    let v = resolve(ctx, variant(ctx, ty)?, ty, n_cols, memory)?;
    let v = for_product(ctx, v, (n_rows, n_cols), cols);
    if matches!(v, Variant::WinU | Variant::KsU) {
        super::op_pipeline(ctx, "mul_mat_xcopy")?;
    }
    let shape = (ty, n_rows, n_cols, memory);
    // The models' activations can be bound as uniforms (`upload::activations`).
    let ones_elsewhere = single_tokens_uniform(ctx, v, cols, n_cols);
    if ones_elsewhere {
        kernels(ctx, shape, Variant::KsU, (Columns::Last, normed), false)?;
    }
    let step = StepInfo::new(0, batch.max(1));
    for k in kernels(ctx, shape, v, (cols, normed), ones_elsewhere)? {
        if let Pipe::Deferred(d) = &k.pipe {
            if k.steps.admits(&step, cols) {
                d.get()?;
            }
        }
    }
    Ok(())
}

/// Bindings 2.. of a kernel that reads weights through common/w_storage.wgsl or
/// w_texture.wgsl: the weights, the activations (or ids), the output and the weights
/// again (seen as vec4s in storage; the same texture). The windowed variants read only
/// the vec4 view, at the first of the two.
pub(crate) fn weight_bindings<'a>(
    w: &'a Part,
    x: &'a wgpu::Buffer,
    y: &'a wgpu::Buffer,
) -> Vec<wgpu::BindingResource<'a>> {
    vec![
        w.binding(),
        x.as_entire_binding(),
        y.as_entire_binding(),
        w.binding(),
    ]
}

/// Group 0 of a kernel that reads weights through common/w_storage.wgsl: step,
/// parameters, weights as u32s, activations (a uniform copy for `x_uniform`), output,
/// weights as vec4s; or the weights' texture at both (w_texture.wgsl). Laid out
/// explicitly because a decoder may use either view of the weights alone.
pub(crate) fn weight_layout(x_uniform: bool, memory: WeightMemory) -> [Binding; 6] {
    let x = if x_uniform {
        Binding::Uniform
    } else {
        Binding::Read
    };
    let w = match memory {
        WeightMemory::Buffer => Binding::Read,
        WeightMemory::Texture => Binding::Texture,
    };
    [
        Binding::Uniform,
        Binding::Uniform,
        w,
        x,
        Binding::ReadWrite,
        w,
    ]
}

/// Group 0 of every mul_mat variant: [`weight_layout`] and the second and third
/// outputs of fused products. The windowed variants read only the vec4 view of the
/// weights (at binding 2, where the others have the u32 view); the same buffer is bound
/// at both.
fn mul_mat_layout(x_uniform: bool, memory: WeightMemory) -> [Binding; 8] {
    let [a, b, c, d, e, f] = weight_layout(x_uniform, memory);
    [a, b, c, d, e, f, Binding::ReadWrite, Binding::ReadWrite]
}

/// Workgroups of variant `v` for `n_rows` rows: one row per invocation (`Row`, `Win`,
/// `WinU`), per workgroup (`Wg`, `Sg`), `ks_rows` per workgroup (`Ks`, `KsU`: `KS_ROWS`,
/// or [`ks1_rows`] for the builds of `mul_mat_ks1`) or `MR_ROWS` (`Mr`); grids wider
/// than the per-dimension limit fold into y.
fn grid(v: Variant, n_rows: u32, ks_rows: u32, max_groups: u32) -> [u32; 3] {
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
fn mm_grid(
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
fn tokens_in(s: &StepInfo, (tok0, tok_n): (u32, u32)) -> u32 {
    s.n_tokens
        .min(tok0.saturating_add(tok_n))
        .saturating_sub(tok0)
}

/// `WinU`, `KsU`: per load of the uniform buffer, a copy of the next `per_xu` output
/// tokens' activations, then one dispatch per part of W. Enough loads are recorded for
/// the largest batch `x` holds; those past a step's tokens have empty grids.
#[allow(clippy::too_many_arguments)]
fn gpu_uniform_x(
    ctx: &GpuContext,
    v: Variant,
    step: &wgpu::Buffer,
    w: &GpuTensor,
    (x, norm): (&wgpu::Buffer, Option<Norm<'_>>),
    out: &Outputs<'_>,
    cols: Columns,
    per_xu: u64,
) -> Result<Vec<Dispatch>> {
    let shape = (w.ty, w.n_rows(), w.n_cols(), w.memory);
    let kernels = kernels(ctx, shape, v, (cols, norm.is_some()), false)?;
    let copy = super::op_pipeline(ctx, "mul_mat_xcopy")?;
    let col_bytes = w.n_cols() * 4;
    let max_tokens = match cols {
        Columns::Last => 1,
        Columns::All => (x.size() / col_bytes).max(1),
    };
    // The copy writes xu as storage and the matmul then reads it as a uniform.
    let xu = ctx.scoped("allocating the mul_mat activation uniform", || {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("mul_mat x uniform"),
            size: X_UNIFORM_BYTES,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: false,
        })
    })?;
    let x_stride = (w.n_cols() / 4) as u32;
    let last_only = (cols == Columns::Last) as u32;
    let tok_n = per_xu as u32;
    let mut plan = Vec::new();
    for k in 0..max_tokens.div_ceil(per_xu) as u32 {
        let tok0 = k * tok_n;
        let first = move |s: &StepInfo| {
            if last_only != 0 {
                s.n_tokens.saturating_sub(1)
            } else {
                0
            }
        };
        let live = move |s: &StepInfo| tok0 < s.n_tokens - first(s).min(s.n_tokens);
        let cp = CopyParams {
            x_stride,
            tok0,
            tok_n,
            last_only,
        };
        let n_copy = tok_n * x_stride;
        plan.push(dispatch(
            ctx,
            &format!("mul_mat x copy {}", w.name),
            copy.clone(),
            step,
            &cp,
            &[x, &xu],
            move |s| [if live(s) { groups(n_copy, WG) } else { 0 }, 1, 1],
        )?);
        let toks = (tok0, tok_n);
        for k in &kernels {
            // Single tokens are all in the first load.
            if tok0 > 0 && k.steps == Steps::One {
                continue;
            }
            let steps = k.steps;
            let on = move |s: &StepInfo| live(s) && steps.admits(s, cols);
            let (v, xu) = (v, &xu);
            // A folded norm reads the residual stream from the copy too.
            let norm = norm.map(|n| Norm { x: xu, ..n });
            plan.extend(part_dispatches(
                ctx,
                (v, k),
                step,
                w,
                (xu, out, norm),
                cols,
                toks,
                on,
            )?);
        }
    }
    Ok(plan)
}

/// Whether steps of more than one token of a product of `w` over `cols`, run as
/// variant `v`, quantize their activations to 8 bits (`mul_mat_ks1i`, [`ks1_int`]):
/// their reference is then [`reference_q8`].
pub fn quantizes_batches(ctx: &GpuContext, v: Variant, w: &GpuTensor, cols: Columns) -> bool {
    let (ty, n_cols) = (w.ty, w.n_cols());
    let Ok(v) = resolve(ctx, v, ty, n_cols, w.memory) else {
        return false;
    };
    let v = for_product(ctx, v, (w.n_rows(), n_cols), cols);
    cols == Columns::All && v == Variant::Ks && ks1_fits(ctx, v, ty, n_cols) && ks1_int(ty)
}

/// [`quantizes_batches`] for the variant [`gpu`] runs.
pub fn gpu_quantizes_batches(ctx: &GpuContext, w: &GpuTensor, cols: Columns) -> Result<bool> {
    Ok(quantizes_batches(ctx, variant(ctx, w.ty)?, w, cols))
}

/// CPU reference: y[t * n_rows + r] = dequant(W row r) . x[t * n_cols ..].
pub fn reference(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    let row_bytes = ty
        .row_bytes(n_cols as u64)
        .ok_or_else(|| Error::invalid("row is not whole blocks"))? as usize;
    let mut row = vec![0f32; n_cols];
    for r in 0..n_rows {
        crate::quant::dequantize(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut row)?;
        for t in 0..n_tokens {
            let xs = &x[t * n_cols..(t + 1) * n_cols];
            let s: f64 = row.iter().zip(xs).map(|(a, b)| *a as f64 * *b as f64).sum();
            y[t * n_rows + r] = s as f32;
        }
    }
    Ok(())
}

/// The CPU reference of `mul_mat_ks1i`: [`reference`] with each token's activations
/// quantized per chunk of 32 as the kernel does (ggml's Q8_0 / Q8_1: scale absmax / 127
/// kept as an f16, quants rounded half to even), and the offset of Q4_1 / Q5_1 weights
/// multiplying the Q8_1 sum (`s`, the quants' sum times the scale, as an f16) as
/// ggml's dot products do.
pub fn reference_q8(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    use half::f16;
    let row_bytes = ty
        .row_bytes(n_cols as u64)
        .ok_or_else(|| Error::invalid("row is not whole blocks"))? as usize;
    // Q4_1 and Q5_1 blocks start with (d, m); their dequantized values hold m.
    let has_min = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    // Per token and chunk: the dequantized activations, and s less their sum.
    let mut xq = vec![0f32; n_cols * n_tokens];
    let mut s_err = vec![0f64; n_cols / 32 * n_tokens];
    for (c, (xs, xo)) in x.chunks_exact(32).zip(xq.chunks_exact_mut(32)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let d16 = f16::from_f32(d).to_f32();
        let mut sum = 0i32;
        for (o, v) in xo.iter_mut().zip(xs) {
            let q = (v * id).round_ties_even() as i32;
            sum += q;
            *o = q as f32 * d16;
        }
        let s = f16::from_f32(sum as f32 * d).to_f32() as f64;
        s_err[c] = s - sum as f64 * d16 as f64;
    }
    reference(ty, w, n_rows, n_cols, &xq, n_tokens, y)?;
    if has_min {
        // The offset multiplies s where the dequantized activations' sum stood.
        for r in 0..n_rows {
            let wr = &w[r * row_bytes..(r + 1) * row_bytes];
            for t in 0..n_tokens {
                let errs = &s_err[t * (n_cols / 32)..(t + 1) * (n_cols / 32)];
                let fix: f64 = wr
                    .chunks_exact(ty.type_size())
                    .zip(errs)
                    .map(|(blk, e)| f16::from_le_bytes([blk[2], blk[3]]).to_f64() * e)
                    .sum();
                y[t * n_rows + r] += fix as f32;
            }
        }
    }
    Ok(())
}
