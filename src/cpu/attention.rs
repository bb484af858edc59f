//! Causal attention on the CPU and the KV cache it reads.
//!
//! The cache is position-major for both keys and values (`[kv_dim, n_ctx]` in ggml
//! order: position p's row at `p * kv_dim`), so scores and the weighted sum both walk
//! contiguous rows.
//!
//! Work is cut into items of up to [`MAX_ROWS`] query rows that share a KV head: the
//! heads of one GQA group times a few consecutive tokens. Each key and value row loaded
//! then serves every row of the item, and the products are formed in register tiles
//! (4 rows x 2 keys for the scores, 4 rows x 16 dimensions for the weighted sum), which
//! cuts the loads per multiply-add from two to under one. Items are handed out one at a
//! time, longest (latest tokens) first, so causal masking does not leave a thread idle.

use std::sync::Mutex;

use super::ops::{exp_fast, zeroed_f32};
use super::pool::{Pool, SharedMut};
use crate::ops::attention::Attention;
use crate::{Error, Result};

/// The most query rows one work item holds (its scores are `MAX_ROWS` rows of scratch).
const MAX_ROWS: usize = 8;

/// One layer's keys and values: [kv_dim, n_ctx] each, position-major.
pub struct KvCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub kv_dim: usize,
    pub n_ctx: usize,
}

impl KvCache {
    pub fn new(kv_dim: usize, n_ctx: usize) -> Result<KvCache> {
        let n = kv_dim
            .checked_mul(n_ctx)
            .ok_or_else(|| Error::invalid("KV cache size overflows"))?;
        // A context too large for memory is an error, not an abort. The zeroed pages come
        // from the allocator lazily, so a large cache costs nothing until it is used.
        let zeros = || -> Result<Vec<f32>> {
            zeroed_f32(n).ok_or_else(|| {
                Error::invalid(format!(
                    "the KV cache for a context of {n_ctx} needs {} MiB per layer, more than \
                     this machine can allocate; lower -c",
                    (n as u64 * 8) >> 20
                ))
            })
        };
        Ok(KvCache {
            k: zeros()?,
            v: zeros()?,
            kv_dim,
            n_ctx,
        })
    }

    /// Stores k, v ([kv_dim, n_tokens]) at positions pos, pos + 1, ...
    pub fn store(&mut self, k: &[f32], v: &[f32], pos: usize, n_tokens: usize) -> Result<()> {
        let n = n_tokens * self.kv_dim;
        let at = pos * self.kv_dim;
        if pos + n_tokens > self.n_ctx || k.len() < n || v.len() < n {
            return Err(Error::invalid(format!(
                "KV store of {n_tokens} tokens at {pos} in a context of {}",
                self.n_ctx
            )));
        }
        self.k[at..at + n].copy_from_slice(&k[..n]);
        self.v[at..at + n].copy_from_slice(&v[..n]);
        Ok(())
    }
}

/// Per-thread score rows for [`attention`]: [`MAX_ROWS`] rows of the context each.
pub struct AttnScratch {
    rows: Vec<Mutex<Vec<f32>>>,
    n_ctx: usize,
}

impl AttnScratch {
    pub fn new(n_threads: usize, n_ctx: usize) -> AttnScratch {
        AttnScratch {
            rows: (0..n_threads.max(1))
                .map(|_| Mutex::new(vec![0.0; MAX_ROWS * n_ctx]))
                .collect(),
            n_ctx,
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
    if q.len() < n || out.len() < n || scratch.rows.len() < pool.n_threads() || scratch.n_ctx < n_kv
    {
        return Err(Error::invalid("attention: buffers too small for the batch"));
    }
    let shape = Shape::new(nh / nkv, nkv, n_tokens, pool.n_threads());
    let job = Job {
        a,
        q,
        cache,
        pos,
        n_head: nh,
        wide: wide_vectors(),
    };
    let o = SharedMut::new(out);
    pool.run_items(shape.n_items(), &|ith, i| {
        // Each thread's own scratch: never contended.
        if let Ok(mut s) = scratch.rows[ith].lock() {
            job.run(&shape.item(i), &mut s, &o);
        }
    });
    Ok(())
}

/// How attention is cut into items: `tq` tokens times `hc` heads of one KV head's group.
#[derive(Clone, Copy, Debug)]
struct Shape {
    group: usize,
    n_kv_head: usize,
    n_tokens: usize,
    hc: usize,
    tq: usize,
}

impl Shape {
    fn new(group: usize, n_kv_head: usize, n_tokens: usize, n_threads: usize) -> Shape {
        let mut s = Shape {
            group,
            n_kv_head,
            n_tokens,
            hc: group.min(MAX_ROWS),
            tq: 1,
        };
        s.tq = (MAX_ROWS / s.hc).max(1);
        // Every thread needs an item: fewer tokens per item first, then fewer heads
        // (generation of a model with a single KV head still uses all threads).
        while s.tq > 1 && s.n_items() < n_threads {
            s.tq /= 2;
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
        self.n_tokens.div_ceil(self.tq) * self.n_kv_head * self.head_chunks()
    }

    /// Item i, the items of the latest tokens (the most keys) first.
    fn item(&self, i: usize) -> Item {
        let per_block = self.n_kv_head * self.head_chunks();
        let tb = self.n_tokens.div_ceil(self.tq) - 1 - i / per_block;
        let hk = i % per_block / self.head_chunks();
        let h0 = hk * self.group + i % self.head_chunks() * self.hc;
        let t0 = tb * self.tq;
        Item {
            hk,
            heads: h0..(h0 + self.hc).min((hk + 1) * self.group),
            tokens: t0..(t0 + self.tq).min(self.n_tokens),
        }
    }
}

/// Query rows sharing KV head `hk`: row `(t - tokens.start) * heads.len() + (h -
/// heads.start)` is token t's head h.
struct Item {
    hk: usize,
    heads: std::ops::Range<usize>,
    tokens: std::ops::Range<usize>,
}

/// What every item of one [`attention`] call reads.
struct Job<'a> {
    a: &'a Attention,
    q: &'a [f32],
    cache: &'a KvCache,
    pos: usize,
    n_head: usize,
    wide: bool,
}

impl Job<'_> {
    fn run(&self, it: &Item, s: &mut [f32], o: &SharedMut<'_, f32>) {
        #[cfg(target_arch = "x86_64")]
        if self.wide {
            // SAFETY: `wide` is only true when the CPU has AVX2 and FMA (`wide_vectors`).
            return unsafe { self.run_avx2(it, s, o) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = self.wide;
        self.run_with::<{ cfg!(target_arch = "aarch64") }>(it, s, o)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2(&self, it: &Item, s: &mut [f32], o: &SharedMut<'_, f32>) {
        self.run_with::<true>(it, s, o)
    }

    /// The first key position query position `qpos` sees.
    fn first_key(&self, qpos: usize) -> usize {
        match self.a.window as usize {
            0 => 0,
            w => (qpos + 1).saturating_sub(w),
        }
    }

    /// Scores, softmax and weighted sum for one item; `F`: fused multiply-add is native.
    #[inline(always)]
    fn run_with<const F: bool>(&self, it: &Item, s: &mut [f32], o: &SharedMut<'_, f32>) {
        let hd = self.a.head_dim as usize;
        let nhi = it.heads.len();
        let m = nhi * it.tokens.len();
        let lo = self.first_key(self.pos + it.tokens.start);
        let nk = self.pos + it.tokens.end - lo;
        let s = &mut s[..m * nk];
        let row = |r: usize| (it.tokens.start + r / nhi) * self.n_head + it.heads.start + r % nhi;
        let qrow = |r: usize| &self.q[row(r) * hd..][..hd];
        let (kd, koff) = (self.cache.kv_dim, it.hk * hd);
        let krow = |j: usize| &self.cache.k[(lo + j) * kd + koff..][..hd];

        // Scores, in tiles of up to 4 rows by 2 keys (the last key repeated at an odd end).
        for r0 in (0..m).step_by(4) {
            let rn = (m - r0).min(4);
            let mut j = 0;
            while j < nk {
                let kn = (nk - j).min(2);
                let ks = [krow(j), krow(j + kn - 1)];
                let mut put = |i: usize, t: &[f32; 2]| {
                    for (k, v) in t.iter().enumerate().take(kn) {
                        s[(r0 + i) * nk + j + k] = v * self.a.scale;
                    }
                };
                macro_rules! tile {
                    ($r:literal) => {{
                        let qs: [&[f32]; $r] = std::array::from_fn(|i| qrow(r0 + i));
                        let t = score_tile::<F, $r>(&qs, &ks);
                        t.iter().enumerate().for_each(|(i, t)| put(i, t));
                    }};
                }
                match rn {
                    4 => tile!(4),
                    3 => tile!(3),
                    2 => tile!(2),
                    _ => tile!(1),
                }
                j += kn;
            }
        }

        // Softmax per row over the keys it sees; the rest weigh 0.
        for r in 0..m {
            let qpos = self.pos + it.tokens.start + r / nhi;
            let (a, b) = (self.first_key(qpos) - lo, qpos + 1 - lo);
            softmax_masked(&mut s[r * nk..(r + 1) * nk], a, b);
        }

        // Weighted sum of the values, in tiles of up to 4 rows by 16 dimensions.
        for r0 in (0..m).step_by(4) {
            let rn = (m - r0).min(4);
            let prow = |r: usize| &s[r * nk..(r + 1) * nk];
            let mut c = 0;
            while c < hd {
                let w = match hd - c {
                    16.. => 16,
                    8.. => 8,
                    _ => 1,
                };
                let v = &self.cache.v[lo * kd + koff + c..];
                let mut acc = [[0f32; 16]; 4];
                macro_rules! tile {
                    ($r:literal) => {{
                        let ps: [&[f32]; $r] = std::array::from_fn(|i| prow(r0 + i));
                        match w {
                            16 => pv_tile::<F, $r, 16>(&ps, v, kd, &mut acc),
                            8 => pv_tile::<F, $r, 8>(&ps, v, kd, &mut acc),
                            _ => pv_tile::<F, $r, 1>(&ps, v, kd, &mut acc),
                        }
                    }};
                }
                match rn {
                    4 => tile!(4),
                    3 => tile!(3),
                    2 => tile!(2),
                    _ => tile!(1),
                }
                for (i, ar) in acc.iter().enumerate().take(rn) {
                    // SAFETY: each query row belongs to one item, and so its output row.
                    let orow = unsafe { o.slice(row(r0 + i) * hd + c, w) };
                    orow.copy_from_slice(&ar[..w]);
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

/// Dot products of R query rows with 2 key rows (all of one length), in 8-wide partial
/// sums the compiler keeps in vector registers.
#[inline(always)]
fn score_tile<const F: bool, const R: usize>(q: &[&[f32]; R], k: &[&[f32]; 2]) -> [[f32; 2]; R] {
    let hd = q[0].len();
    let n8 = hd / 8 * 8;
    let mut acc = [[[0f32; 8]; 2]; R];
    let mut c = 0;
    while c < n8 {
        let k0 = &k[0][c..c + 8];
        let k1 = &k[1][c..c + 8];
        for (r, ar) in acc.iter_mut().enumerate() {
            let qc = &q[r][c..c + 8];
            for l in 0..8 {
                ar[0][l] = madd::<F>(qc[l], k0[l], ar[0][l]);
                ar[1][l] = madd::<F>(qc[l], k1[l], ar[1][l]);
            }
        }
        c += 8;
    }
    let mut out = [[0f32; 2]; R];
    for (r, or) in out.iter_mut().enumerate() {
        for (kk, o) in or.iter_mut().enumerate() {
            let tail: f32 = (n8..hd).map(|d| q[r][d] * k[kk][d]).sum();
            *o = acc[r][kk].iter().sum::<f32>() + tail;
        }
    }
    out
}

/// acc[r][..W] = sum over keys j of p[r][j] * v[j * stride ..][..W].
#[inline(always)]
fn pv_tile<const F: bool, const R: usize, const W: usize>(
    p: &[&[f32]; R],
    v: &[f32],
    stride: usize,
    acc: &mut [[f32; 16]; 4],
) {
    let nk = p[0].len();
    let mut a = [[0f32; W]; R];
    for j in 0..nk {
        let vr = &v[j * stride..][..W];
        for (r, ar) in a.iter_mut().enumerate() {
            let pj = p[r][j];
            for l in 0..W {
                ar[l] = madd::<F>(pj, vr[l], ar[l]);
            }
        }
    }
    for (o, a) in acc.iter_mut().zip(&a) {
        o[..W].copy_from_slice(a);
    }
}

/// Softmax of `s[a..b]` in place; the rest of `s` becomes 0.
#[inline(always)]
fn softmax_masked(s: &mut [f32], a: usize, b: usize) {
    let mx = s[a..b].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    s[..a].fill(0.0);
    s[b..].fill(0.0);
    let mut sum = 0.0;
    for x in &mut s[a..b] {
        *x = exp_fast(*x - mx);
        sum += *x;
    }
    let inv = 1.0 / sum;
    for x in &mut s[a..b] {
        *x *= inv;
    }
}

/// Whether the AVX2 + FMA build of the item kernel can run here (the crate's baseline
/// is SSE2, which halves the vector width and has no fused multiply-add).
fn wide_vectors() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (token, head) row is in exactly one item, whatever the shape.
    #[test]
    fn items_cover_every_row_once() {
        for (group, nkv, nt, nth) in [(4, 1, 1, 2), (4, 1, 37, 2), (3, 3, 9, 2), (16, 2, 5, 3)] {
            let s = Shape::new(group, nkv, nt, nth);
            let mut seen = vec![0u8; nt * group * nkv];
            for i in 0..s.n_items() {
                let it = s.item(i);
                assert!(it.heads.len() * it.tokens.len() <= MAX_ROWS, "{s:?}");
                for t in it.tokens.clone() {
                    for h in it.heads.clone() {
                        assert_eq!(h / group, it.hk);
                        seen[t * group * nkv + h] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{s:?}");
            assert!(s.n_items() >= nth.min(nt * group * nkv), "{s:?}");
        }
    }
}
