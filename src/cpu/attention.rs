//! Causal attention on the CPU.
//!
//! The cache it reads ([`KvCache`]) holds f16: values position-major, so the weighted
//! sum walks contiguous rows, keys in panels of eight positions, so the scores load one
//! component of eight keys at a time.
//!
//! Work is cut into items of up to [`MAX_ROWS`] query rows that share a KV head: the
//! heads of one GQA group times a few consecutive tokens. An item walks its keys in
//! blocks small enough to stay in cache (`key_block`), keeping a running softmax per
//! row (its maximum so far and its sum of weights, earlier sums rescaled when the
//! maximum rises), so each key and value row is read from memory once per item and
//! then serves every row of it, whatever the context's length. Within a block the
//! products are formed in register tiles (4 rows x 2 keys for the scores, 4 rows x 16
//! dimensions for the weighted sum), which cuts the loads per multiply-add from two to
//! under one. Items are handed out one at a time, longest (latest tokens) first, so
//! causal masking does not leave a thread idle.

use std::sync::Mutex;

use super::kv_cache::{widen, widen8, KvCache, PANEL};
use super::ops::exp_fast;
use super::pool::{Pool, SharedMut};
use crate::ops::attention::Attention;
use crate::{Error, Result};

/// The most query rows one work item holds: each block of keys and values loaded
/// serves all of them.
const MAX_ROWS: usize = 32;
const _: () = assert!(MAX_ROWS % 4 == 0, "tiles of four rows fill the scratch");

/// Working memory for [`attention`]: per thread, one item's scores for a key block, its
/// running sums and its softmax state. Sized on first use for the model's head size.
pub struct AttnScratch {
    rows: Vec<Mutex<Vec<f32>>>,
    /// The results of items that walk part of the keys, before they are combined.
    parts: Mutex<Vec<f32>>,
}

impl AttnScratch {
    pub fn new(n_threads: usize) -> AttnScratch {
        AttnScratch {
            rows: (0..n_threads.max(1))
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
            parts: Mutex::new(Vec::new()),
        }
    }
}

/// Causal attention of q ([head_dim, n_head, n_tokens], tokens at pos, pos + 1, ...)
/// over the cache, which already holds positions 0 .. pos + n_tokens; out has q's shape.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &Pool,
    a: &Attention,
    q: &[f32],
    cache: &KvCache,
    out: &mut [f32],
    pos: usize,
    n_tokens: usize,
    scratch: &AttnScratch,
) -> Result<()> {
    let (hd, nh, nkv) = (a.head_dim as usize, a.n_head as usize, a.n_head_kv as usize);
    let n_kv = pos + n_tokens;
    if hd == 0 || nkv == 0 || nh % nkv != 0 || hd * nkv != cache.kv_dim || n_kv > cache.n_ctx {
        return Err(Error::invalid(format!(
            "attention: {nh} heads over {nkv} KV heads of {hd} with a cache row of {}",
            cache.kv_dim
        )));
    }
    let n = hd * nh * n_tokens;
    if q.len() < n || out.len() < n || scratch.rows.len() < pool.n_threads() {
        return Err(Error::invalid("attention: buffers too small for the batch"));
    }
    let n_keys = match a.window as usize {
        0 => n_kv,
        w => n_kv.min(w + n_tokens - 1),
    };
    let shape = Shape::new(nh / nkv, nkv, n_tokens, n_keys, pool.n_threads());
    let job = Job {
        a,
        q,
        cache,
        pos,
        n_head: nh,
        block: key_block(hd),
        wide: wide_vectors(),
    };
    let need = job.scratch_len();
    // A poisoned lock only means an earlier call panicked; every value is rewritten.
    let mut parts = scratch.parts.lock().unwrap_or_else(|e| e.into_inner());
    if shape.splits > 1 && parts.len() < shape.n_items() * job.part_len() {
        parts.resize(shape.n_items() * job.part_len(), 0.0);
    }
    let o = SharedMut::new(out);
    let sink = if shape.splits > 1 {
        Sink::Parts(SharedMut::new(&mut parts))
    } else {
        Sink::Out(&o)
    };
    pool.run_items(shape.n_items(), &|ith, i| {
        // Each thread's own scratch: never contended.
        let mut s = scratch.rows[ith].lock().unwrap_or_else(|e| e.into_inner());
        if s.len() < need {
            s.resize(need, 0.0);
        }
        job.run(i, &shape.item(i), &mut s, &sink);
    });
    if shape.splits > 1 {
        job.combine(&shape, &parts, &o);
    }
    Ok(())
}

/// The fewest keys a part of a split item walks: below this, splitting costs more in
/// combining than it gains in threads.
const MIN_SPLIT_KEYS: usize = 256;

/// Where an item's results go: the output rows, or (keys split between items) slot `i`
/// of the parts, which [`Job::combine`] merges.
enum Sink<'a, 'o> {
    Out(&'a SharedMut<'o, f32>),
    Parts(SharedMut<'a, f32>),
}

/// Keys per block: a block of K (and then of V) is read once for all of an item's rows
/// while it sits in the second-level cache, 32 KiB of each in f16. (With the cache in
/// f32, blocks of these many keys were 3-9% faster on prompts and 10-14% on generation
/// at depth than blocks of half as many.)
fn key_block(head_dim: usize) -> usize {
    (16384 / head_dim).clamp(2 * PANEL, 256) / (2 * PANEL) * (2 * PANEL)
}

/// How attention is cut into items: `tq` tokens times `hc` heads of one KV head's group,
/// their keys in `splits` parts.
#[derive(Clone, Copy, Debug)]
struct Shape {
    group: usize,
    n_kv_head: usize,
    n_tokens: usize,
    hc: usize,
    tq: usize,
    splits: usize,
}

impl Shape {
    /// `n_keys`: the most keys a token sees.
    fn new(
        group: usize,
        n_kv_head: usize,
        n_tokens: usize,
        n_keys: usize,
        n_threads: usize,
    ) -> Shape {
        let mut s = Shape {
            group,
            n_kv_head,
            n_tokens,
            hc: group.min(MAX_ROWS),
            tq: 1,
            splits: 1,
        };
        s.tq = (MAX_ROWS / s.hc).max(1);
        // Every thread needs an item: fewer tokens per item first, then fewer heads
        // (generation of a model with a single KV head still uses all threads). Short
        // batches keep a few items per thread, so that the causal mask's uneven items
        // even out.
        while s.tq > 1 && s.n_items() < 4 * n_threads {
            s.tq /= 2;
        }
        // Still too few (generation): the keys are split between items before the heads
        // are, so that each key is still read once for all the heads that share it.
        if s.n_items() < 4 * n_threads {
            s.splits = (4 * n_threads)
                .div_ceil(s.n_items())
                .min(n_keys / MIN_SPLIT_KEYS)
                .max(1);
        }
        while s.hc > 1 && s.n_items() < n_threads {
            s.hc = s.hc.div_ceil(2);
        }
        s
    }

    fn head_chunks(&self) -> usize {
        self.group.div_ceil(self.hc)
    }

    fn n_items(&self) -> usize {
        self.n_tokens.div_ceil(self.tq) * self.n_kv_head * self.head_chunks() * self.splits
    }

    /// Item i, the items of the latest tokens (the most keys) first; the parts of one
    /// item's keys are consecutive.
    fn item(&self, i: usize) -> Item {
        let (part, i) = (i % self.splits, i / self.splits);
        let per_block = self.n_kv_head * self.head_chunks();
        let tb = self.n_tokens.div_ceil(self.tq) - 1 - i / per_block;
        let hk = i % per_block / self.head_chunks();
        let h0 = hk * self.group + i % self.head_chunks() * self.hc;
        let t0 = tb * self.tq;
        Item {
            hk,
            heads: h0..(h0 + self.hc).min((hk + 1) * self.group),
            tokens: t0..(t0 + self.tq).min(self.n_tokens),
            part,
            parts: self.splits,
        }
    }
}

/// Query rows sharing KV head `hk`: row `(t - tokens.start) * heads.len() + (h -
/// heads.start)` is token t's head h.
struct Item {
    hk: usize,
    heads: std::ops::Range<usize>,
    tokens: std::ops::Range<usize>,
    /// Which of `parts` equal runs of the keys this item walks.
    part: usize,
    parts: usize,
}

impl Item {
    /// This item's part of the keys lo .. hi (lo at a panel), in whole panels.
    fn keys(&self, lo: usize, hi: usize) -> std::ops::Range<usize> {
        let chunk = (hi - lo).div_ceil(self.parts).next_multiple_of(PANEL);
        let k0 = (lo + self.part * chunk).min(hi);
        k0..(k0 + chunk).min(hi)
    }
}

/// What every item of one [`attention`] call reads.
struct Job<'a> {
    a: &'a Attention,
    q: &'a [f32],
    cache: &'a KvCache,
    pos: usize,
    n_head: usize,
    /// Keys per block ([`key_block`]).
    block: usize,
    /// The AVX2 phases run ([`wide_vectors`]; always false off x86-64).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    wide: bool,
}

/// One item's working memory, carved from its thread's scratch.
struct ItemScratch<'s> {
    /// Scores, then probabilities, of the current key block: `block` per row.
    s: &'s mut [f32],
    /// Running weighted sums of the values: `head_dim` per row.
    acc: &'s mut [f32],
    /// Per row: the largest score so far, and the sum of e^(score - max) so far.
    max: &'s mut [f32],
    sum: &'s mut [f32],
}

impl Job<'_> {
    /// Floats of scratch one item needs.
    fn scratch_len(&self) -> usize {
        MAX_ROWS * self.block + self.part_len()
    }

    /// Floats of one item's results: its rows' sums, maxima and total weights.
    fn part_len(&self) -> usize {
        MAX_ROWS * (self.a.head_dim as usize + 2)
    }

    /// The row of q, and of the output, that an item's row r is.
    fn row_index(&self, it: &Item, r: usize) -> usize {
        let nhi = it.heads.len();
        (it.tokens.start + r / nhi) * self.n_head + it.heads.start + r % nhi
    }

    /// One block's scores, softmax and weighted sum; with `ahead` (a block follows in the
    /// item) the scores and the weighted sum ask for the next block's keys and values as
    /// they read this one's ([`prefetch_l2`]). On x86-64 with AVX2 each phase is
    /// a function of its own: inlined together, the exponential's constants took
    /// registers the weighted sum's tile needed, and its sums went to the stack.
    fn block(&self, it: &Item, j0: usize, nb: usize, ahead: bool, w: &mut ItemScratch<'_>) {
        #[cfg(target_arch = "x86_64")]
        if self.wide {
            // SAFETY: `wide` is only true when the CPU has AVX2, FMA and F16C (`wide_vectors`).
            unsafe {
                self.scores_avx2(it, j0, nb, ahead, w.s);
                self.softmax_avx2(it, j0, nb, w);
                self.values_avx2(it, j0, nb, ahead, w);
            }
            return;
        }
        // `F`: fused multiply-add is native.
        const F: bool = cfg!(target_arch = "aarch64");
        self.scores::<F>(it, j0, nb, ahead, w.s);
        self.softmax_block(it, j0, nb, w);
        self.weigh_values::<F>(it, j0, nb, ahead, w.s, w.acc);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn scores_avx2(&self, it: &Item, j0: usize, nb: usize, ahead: bool, s: &mut [f32]) {
        self.scores::<true>(it, j0, nb, ahead, s)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn softmax_avx2(&self, it: &Item, j0: usize, nb: usize, w: &mut ItemScratch<'_>) {
        self.softmax_block(it, j0, nb, w)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn values_avx2(
        &self,
        it: &Item,
        j0: usize,
        nb: usize,
        ahead: bool,
        w: &mut ItemScratch<'_>,
    ) {
        self.weigh_values::<true>(it, j0, nb, ahead, w.s, w.acc)
    }

    /// The first key position query position `qpos` sees.
    fn first_key(&self, qpos: usize) -> usize {
        match self.a.window as usize {
            0 => 0,
            w => (qpos + 1).saturating_sub(w),
        }
    }

    /// One item: its keys in blocks, each block's scores, their softmax against the
    /// running maximum (earlier blocks' sums rescaled when it rises) and the values'
    /// weighted sum; at the end each row's sums divided by its total weight, or (item
    /// `i` one part of split keys) the sums and weights kept for [`Job::combine`].
    fn run(&self, i: usize, it: &Item, scratch: &mut [f32], sink: &Sink<'_, '_>) {
        let hd = self.a.head_dim as usize;
        let m = it.heads.len() * it.tokens.len();
        let (s, part) = scratch.split_at_mut(MAX_ROWS * self.block);
        let (acc, rest) = part.split_at_mut(MAX_ROWS * hd);
        let (max, rest) = rest.split_at_mut(MAX_ROWS);
        let mut w = ItemScratch {
            s,
            acc: &mut acc[..m * hd],
            max: &mut max[..m],
            sum: &mut rest[..m],
        };
        w.acc.fill(0.0);
        w.max.fill(f32::NEG_INFINITY);
        w.sum.fill(0.0);
        let lo = self.first_key(self.pos + it.tokens.start) / PANEL * PANEL;
        let keys = it.keys(lo, self.pos + it.tokens.end);
        // Items of a few rows (generation) ask for the next block as they read this
        // one; batches' items, whose blocks take many times longer, ask for it all at
        // the block's start.
        let few = m <= 4;
        for j0 in keys.clone().step_by(self.block) {
            let nb = (keys.end - j0).min(self.block);
            let next = j0 + nb;
            if !few {
                self.prefetch_block(it, next, (keys.end - next).min(self.block));
            }
            self.block(it, j0, nb, few && next < keys.end, &mut w);
        }
        match sink {
            Sink::Out(o) => {
                for r in 0..m {
                    // Every row sees at least its own position, so its sum is at least 1.
                    let inv = 1.0 / w.sum[r];
                    // SAFETY: each query row belongs to one item, and so its output row.
                    let orow = unsafe { o.slice(self.row_index(it, r) * hd, hd) };
                    for (d, a) in orow.iter_mut().zip(&w.acc[r * hd..(r + 1) * hd]) {
                        *d = a * inv;
                    }
                }
            }
            Sink::Parts(p) => {
                // SAFETY: slot i is item i's alone.
                let slot = unsafe { p.slice(i * self.part_len(), self.part_len()) };
                slot.copy_from_slice(part);
            }
        }
    }

    /// Merges the parts of each split item into its output rows: each part's sums and
    /// weight scaled to the largest maximum among the parts, then summed.
    fn combine(&self, shape: &Shape, parts: &[f32], o: &SharedMut<'_, f32>) {
        let hd = self.a.head_dim as usize;
        let mut row = vec![0f32; hd];
        for b in (0..shape.n_items()).step_by(shape.splits) {
            let it = shape.item(b);
            let slot = |p: usize| &parts[(b + p) * self.part_len()..][..self.part_len()];
            for r in 0..it.heads.len() * it.tokens.len() {
                let max = |p: usize| slot(p)[MAX_ROWS * hd + r];
                let mx = (0..shape.splits).fold(f32::NEG_INFINITY, |m, p| m.max(max(p)));
                row.fill(0.0);
                let mut total = 0.0;
                for p in 0..shape.splits {
                    let w = slot(p)[MAX_ROWS * hd + MAX_ROWS + r];
                    if w == 0.0 {
                        continue; // This part holds none of the row's keys.
                    }
                    let f = exp_fast(max(p) - mx);
                    total += w * f;
                    for (a, x) in row.iter_mut().zip(&slot(p)[r * hd..][..hd]) {
                        *a += x * f;
                    }
                }
                // SAFETY: no item runs any more; each row is written once.
                let orow = unsafe { o.slice(self.row_index(&it, r) * hd, hd) };
                for (d, a) in orow.iter_mut().zip(&row) {
                    *d = a / total;
                }
            }
        }
    }

    /// Asks for the keys and values of the block at `j0` (`nb` keys) ahead of its turn,
    /// into the second-level cache, all at once (batches; see [`prefetch_l2`]).
    fn prefetch_block(&self, it: &Item, j0: usize, nb: usize) {
        let hd = self.a.head_dim as usize;
        let ask = |s: &[u16]| s.chunks(32).for_each(|line| prefetch_l2(line.as_ptr()));
        for i in 0..nb.div_ceil(PANEL) {
            ask(self.cache.key_panel(j0 / PANEL + i, it.hk * hd, hd));
        }
        for j in j0..j0 + nb {
            ask(&self.cache.values_from(j, it.hk * hd)[..hd]);
        }
    }

    /// The query row r of an item.
    fn qrow(&self, it: &Item, r: usize) -> &[f32] {
        let hd = self.a.head_dim as usize;
        &self.q[self.row_index(it, r) * hd..][..hd]
    }

    /// s[r * block + j] = scale * q_r . k_(j0 + j) for the item's rows and the block's
    /// `nb` keys (rounded up to whole panels; `j0` starts one), in tiles of up to 4 rows
    /// by two panels (the last panel repeated at an odd end). Three rows, SmolLM2's
    /// heads per KV head, run as a tile of three: once LLVM had left its arithmetic
    /// scalar and a tile of four with a repeated row ran faster, but with the loops'
    /// bounds checked once per tile the tile of three is vector code, and generation's
    /// attention at depth read 1.07x faster from memory (1.12-1.19x from cache) than as
    /// four. The first tile's rows ask for the next block's panels as they go (`ahead`).
    #[inline(always)]
    fn scores<const F: bool>(&self, it: &Item, j0: usize, nb: usize, ahead: bool, s: &mut [f32]) {
        let hd = self.a.head_dim as usize;
        let m = it.heads.len() * it.tokens.len();
        let panels = nb.div_ceil(PANEL);
        let panel = |i: usize| self.cache.key_panel(j0 / PANEL + i, it.hk * hd, hd);
        // The next block's panels lie `nb` keys on (whole panels: only a last block is
        // shorter, and it has no next one).
        let next = |k: &[u16]| k.as_ptr().wrapping_add(nb * self.cache.kv_dim);
        for r0 in (0..m).step_by(4) {
            let rn = (m - r0).min(4);
            let mut i = 0;
            while i < panels {
                let kn = (panels - i).min(2);
                let ks = [panel(i), panel(i + kn - 1)];
                let mut put = |r: usize, t: &[[f32; PANEL]; 2]| {
                    let row = &mut s[(r0 + r) * self.block + i * PANEL..][..kn * PANEL];
                    for (o, v) in row.iter_mut().zip(t.as_flattened()) {
                        *o = v * self.a.scale;
                    }
                };
                macro_rules! tile {
                    ($r:literal) => {{
                        let qs: [&[f32]; $r] =
                            std::array::from_fn(|i| self.qrow(it, r0 + i.min(rn - 1)));
                        let pf = (ahead && r0 == 0).then(|| ks.map(next));
                        // Separate builds with and without the requests, so that
                        // batches' loops carry no test for them.
                        let t = match pf {
                            Some(pf) => score_tile::<F, $r, true>(&qs, &ks, pf),
                            None => score_tile::<F, $r, false>(&qs, &ks, [ks[0].as_ptr(); 2]),
                        };
                        t.iter().enumerate().for_each(|(r, t)| put(r, t));
                    }};
                }
                match rn {
                    4.. => tile!(4),
                    3 => tile!(3),
                    2 => tile!(2),
                    _ => tile!(1),
                }
                i += kn;
            }
        }
    }

    /// Turns each row's block of scores into weights e^(score - max) over the keys the
    /// row sees (the rest weigh 0), raising the row's running maximum where the block
    /// holds a larger score and rescaling its earlier sums to match.
    #[inline(always)]
    fn softmax_block(&self, it: &Item, j0: usize, nb: usize, w: &mut ItemScratch<'_>) {
        let hd = self.a.head_dim as usize;
        let nhi = it.heads.len();
        for r in 0..w.max.len() {
            let qpos = self.pos + it.tokens.start + r / nhi;
            let a = self.first_key(qpos).clamp(j0, j0 + nb) - j0;
            let b = (qpos + 1).clamp(j0, j0 + nb) - j0;
            let p = &mut w.s[r * self.block..r * self.block + nb];
            if a >= b {
                p.fill(0.0);
                continue;
            }
            let mx = max_of(&p[a..b]).max(w.max[r]);
            p[..a].fill(0.0);
            p[b..].fill(0.0);
            let sum = exp_sum(&mut p[a..b], mx);
            if mx > w.max[r] {
                // The first block a row sees has nothing to rescale (its maximum was -inf).
                let f = if w.sum[r] > 0.0 {
                    exp_fast(w.max[r] - mx)
                } else {
                    0.0
                };
                w.sum[r] *= f;
                w.acc[r * hd..(r + 1) * hd].iter_mut().for_each(|a| *a *= f);
                w.max[r] = mx;
            }
            w.sum[r] += sum;
        }
    }

    /// acc[r] += sum over the block's keys j of p[r][j] * v_(j0 + j), in tiles of up to 4
    /// rows by 16 dimensions (three rows as a tile of three, as in `scores`), the first
    /// rows asking for the next block's values as they go (`ahead`).
    #[inline(always)]
    fn weigh_values<const F: bool>(
        &self,
        it: &Item,
        j0: usize,
        nb: usize,
        ahead: bool,
        p: &[f32],
        acc: &mut [f32],
    ) {
        let hd = self.a.head_dim as usize;
        let m = it.heads.len() * it.tokens.len();
        let (kd, koff) = (self.cache.kv_dim, it.hk * hd);
        for r0 in (0..m).step_by(4) {
            let rn = (m - r0).min(4);
            let prow = |r: usize| &p[r * self.block..][..nb];
            let mut c = 0;
            while c < hd {
                let w = match hd - c {
                    16.. => 16,
                    8.. => 8,
                    _ => 1,
                };
                let v = self.cache.values_from(j0, koff + c);
                let at = |i: usize| (r0 + i) * hd + c;
                // The first rows' passes over each 32 dimensions (64 bytes) ask for the
                // next block's values there, a line per key.
                let pf =
                    (ahead && r0 == 0 && c % 32 == 0).then(|| v.as_ptr().wrapping_add(nb * kd));
                macro_rules! tile {
                    ($r:literal) => {{
                        let ps: [&[f32]; $r] = std::array::from_fn(|i| prow(r0 + i.min(rn - 1)));
                        match w {
                            16 => pv_w::<F, $r, 16>(&ps, v, kd, acc, at, pf),
                            8 => pv_w::<F, $r, 8>(&ps, v, kd, acc, at, pf),
                            _ => pv_w::<F, $r, 1>(&ps, v, kd, acc, at, pf),
                        }
                    }};
                }
                match rn {
                    4.. => tile!(4),
                    3 => tile!(3),
                    2 => tile!(2),
                    _ => tile!(1),
                }
                c += w;
            }
        }
    }
}

/// a * b + c, fused where `F` (one instruction where the target has FMA; a library
/// call where it does not, hence the choice).
#[inline(always)]
fn madd<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Dot products of R query rows with the keys of two panels, lanes over keys: for each
/// dimension a broadcast of each row's component times the panels' eight keys, so no
/// sum ever runs across the lanes.
#[inline(always)]
fn score_tile<const F: bool, const R: usize, const PF: bool>(
    q: &[&[f32]; R],
    k: &[&[u16]; 2],
    pf: [*const u16; 2],
) -> [[[f32; PANEL]; 2]; R] {
    let hd = q[0].len();
    let mut acc = [[[0f32; PANEL]; 2]; R];
    for d in 0..hd {
        // Every fourth dimension starts a 64-byte line of each panel: the next block's
        // line there is asked for.
        if PF && d % 4 == 0 {
            for p in pf {
                prefetch_l2(p.wrapping_add(d * PANEL));
            }
        }
        let k0 = widen8::<F>(&k[0][d * PANEL..][..PANEL]);
        let k1 = widen8::<F>(&k[1][d * PANEL..][..PANEL]);
        for (r, ar) in acc.iter_mut().enumerate() {
            let qd = q[r][d];
            for l in 0..PANEL {
                ar[0][l] = madd::<F>(qd, k0[l], ar[0][l]);
                ar[1][l] = madd::<F>(qd, k1[l], ar[1][l]);
            }
        }
    }
    acc
}

/// acc[at(r)..][..W] += sum over keys j of p[r][j] * v[j * stride ..][..W].
#[inline(always)]
fn pv_w<const F: bool, const R: usize, const W: usize>(
    p: &[&[f32]; R],
    v: &[u16],
    stride: usize,
    acc: &mut [f32],
    at: impl Fn(usize) -> usize,
    pf: Option<*const u16>,
) {
    match pf {
        Some(pf) => pv_tile::<F, R, W, true>(p, v, stride, acc, at, pf),
        None => pv_tile::<F, R, W, false>(p, v, stride, acc, at, v.as_ptr()),
    }
}

/// [`pv_w`]'s loop, built with (`PF`) and without the requests for the next block's
/// values at `pf`, so that batches' loops carry no test for them.
#[inline(always)]
fn pv_tile<const F: bool, const R: usize, const W: usize, const PF: bool>(
    p: &[&[f32]; R],
    v: &[u16],
    stride: usize,
    acc: &mut [f32],
    at: impl Fn(usize) -> usize,
    pf: *const u16,
) {
    let nk = p[0].len();
    // Bounds checked once here: the loop over the keys reads through raw pointers, so
    // that it holds no checks and its row pointers stay in registers (with per-key
    // checks, the loop's speed on batches varied 1.2x between builds with its layout).
    assert!(p.iter().all(|p| p.len() >= nk));
    assert!(nk == 0 || v.len() >= (nk - 1) * stride + W);
    let ps: [*const f32; R] = p.map(|p| p.as_ptr());
    let vp = v.as_ptr();
    let mut a: [[f32; W]; R] = std::array::from_fn(|r| std::array::from_fn(|l| acc[at(r) + l]));
    for j in 0..nk {
        if PF {
            prefetch_l2(pf.wrapping_add(j * stride));
        }
        // SAFETY: j < nk, so row j's W values and each row's entry j are in bounds
        // (asserted above).
        let vr = widen::<F, W>(unsafe { std::slice::from_raw_parts(vp.add(j * stride), W) });
        for (r, ar) in a.iter_mut().enumerate() {
            // SAFETY: as above.
            let pj = unsafe { *ps[r].add(j) };
            for l in 0..W {
                ar[l] = madd::<F>(pj, vr[l], ar[l]);
            }
        }
    }
    for (r, a) in a.iter().enumerate() {
        acc[at(r)..][..W].copy_from_slice(a);
    }
}

/// The largest of `x`, in eight lanes (a running `max` over one value at a time is a
/// chain the compiler keeps scalar).
#[inline(always)]
fn max_of(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            m[l] = m[l].max(c[l]);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    m.iter().fold(tail, |a, &b| a.max(b))
}

/// x = e^(x - mx) in place, and their sum, in eight lanes: a single running sum would
/// keep the whole loop, exponentials included, one value at a time.
#[inline(always)]
fn exp_sum(x: &mut [f32], mx: f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        for l in 0..8 {
            c[l] = exp_fast(c[l] - mx);
            acc[l] += c[l];
        }
    }
    let mut sum = 0.0;
    for v in chunks.into_remainder() {
        *v = exp_fast(*v - mx);
        sum += *v;
    }
    sum + acc.iter().sum::<f32>()
}

/// Whether the AVX2 + FMA + F16C build of the item kernel can run here (the crate's
/// baseline is SSE2, which halves the vector width, has no fused multiply-add and
/// converts f16 one value at a time).
fn wide_vectors() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Asks for the line at `p` into the second-level cache. Generation reads each key and
/// value once, from memory, and the hardware prefetcher, which sees a KV head's rows a
/// cache row apart, leaves the loads waiting. The blocks ask for the next block's lines
/// a few at a time as their own work goes, which keeps loads in flight beside the
/// arithmetic. (Asked for all at once before each block, 1024 lines for SmolLM2's, they
/// waited on the memory system's queues with little arithmetic beside them: 12-13 GB/s
/// of keys and values from memory against 14.4-14.6 now, and 13.4-14.0 against
/// 18.6-20.3 for Gemma's 256-wide heads; `cargo bench --bench cpu_kernels -- attn
/// layers=30`.) The address may lie past the cache's end: a prefetch never faults.
#[inline(always)]
fn prefetch_l2(p: *const u16) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (token, head) row is in one item per part of the keys, whatever the shape;
    /// generation splits the keys of a long context between the threads, never those of
    /// a short one.
    #[test]
    fn items_cover_every_row_once() {
        let cases = [
            (4, 1, 1, 100, 2),
            (4, 1, 1, 4096, 2),
            (3, 3, 1, 4096, 2),
            (4, 1, 37, 4096, 2),
            (3, 3, 9, 600, 2),
            (16, 2, 5, 600, 3),
        ];
        for (group, nkv, nt, n_keys, nth) in cases {
            let s = Shape::new(group, nkv, nt, n_keys, nth);
            let mut seen = vec![0u32; nt * group * nkv];
            for i in 0..s.n_items() {
                let it = s.item(i);
                assert!(it.heads.len() * it.tokens.len() <= MAX_ROWS, "{s:?}");
                assert_eq!((it.part, it.parts), (i % s.splits, s.splits), "{s:?}");
                for t in it.tokens.clone() {
                    for h in it.heads.clone() {
                        assert_eq!(h / group, it.hk);
                        seen[t * group * nkv + h] |= 1 << it.part;
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == (1 << s.splits) - 1), "{s:?}");
            assert!(s.n_items() >= nth.min(nt * group * nkv), "{s:?}");
            assert!(s.splits == 1 || n_keys >= 2 * MIN_SPLIT_KEYS, "{s:?}");
            if nt == 1 && n_keys == 4096 {
                assert!(s.n_items() >= 4 * nth, "{s:?}");
            }
        }
    }

    /// The parts of a split run of keys cover it once, in whole panels.
    #[test]
    fn parts_cover_the_keys() {
        for (lo, hi, parts) in [(0, 4096, 8), (8, 1001, 3), (0, 9, 4), (16, 17, 2)] {
            let mut next = lo;
            for part in 0..parts {
                let it = Item {
                    hk: 0,
                    heads: 0..1,
                    tokens: 0..1,
                    part,
                    parts,
                };
                let k = it.keys(lo, hi);
                assert_eq!(k.start, next.min(hi));
                assert!(k.start % PANEL == 0 || k.start == hi);
                next = k.end;
            }
            assert_eq!(next, hi);
        }
    }
}
