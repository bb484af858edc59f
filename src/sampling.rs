//! Token sampling over a logits vector.
//!
//! The chain mirrors llama.cpp's common sampler for the options we expose, in its order:
//! repetition penalty over the last `repeat_last_n` tokens, top-k, top-p, min-p,
//! temperature, then a seeded draw. A temperature of zero or below is greedy: the argmax
//! of the penalised logits, ties going to the lowest id.
//!
//! Vocabularies reach 262144 entries (Gemma 3), so no step sorts the whole vocabulary
//! when it can avoid it: top-k is a partial selection, and top-p sorts a growing prefix
//! only until the cumulative probability reaches `top_p`.
//!
//! The random stream is xoshiro256** seeded through splitmix64, written here so that a
//! seed gives the same tokens on every platform and build.

use std::cmp::Ordering;

/// Sampling options; defaults are llama.cpp's.
#[derive(Clone, Debug)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` selects greedy decoding.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 turns the cut off.
    pub top_k: u32,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 turns it off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the best one's; 0 turns it off.
    pub min_p: f32,
    /// Penalty on tokens seen in the last `repeat_last_n` history entries; 1 turns it off.
    pub repeat_penalty: f32,
    /// How many trailing history tokens the penalty looks at; 0 turns it off.
    pub repeat_last_n: usize,
    /// Seed of the random stream. The same seed, logits and history give the same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

/// A candidate token: (id, logit).
pub type Cand = (u32, f32);

/// Stateful sampler: owns the random stream and a scratch buffer reused between calls
/// (a 262144-entry vocabulary makes a 2 MiB candidate list; allocating it per token is waste).
pub struct Sampler {
    params: SamplingParams,
    rng: Xoshiro256,
    cands: Vec<Cand>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = Xoshiro256::seed_from(params.seed);
        Sampler {
            params,
            rng,
            cands: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether every token this sampler picks is the argmax of the raw logits (greedy
    /// decoding without a penalty): then a step need not return the logits at all
    /// ([`crate::session::Session::greedy`]).
    pub fn is_plain_greedy(&self) -> bool {
        let p = &self.params;
        (p.temperature.is_nan() || p.temperature <= 0.0) && !penalises(p)
    }

    /// The k of the top-k this sampler picks from, where it has one: its top-k when it
    /// draws, 1 when it is greedy (after a penalty; plain greedy needs the argmax
    /// alone, [`Sampler::is_plain_greedy`]). Its pick then depends on the k best logits
    /// and those of the tokens it penalises alone ([`Sampler::penalised`]), and a step
    /// may return just those ([`crate::session::Keep::TopK`], chosen on the device) for
    /// [`Sampler::sample_best`].
    pub fn picks_from_top_k(&self) -> Option<u32> {
        let p = &self.params;
        if p.temperature.is_nan() || p.temperature <= 0.0 {
            return Some(1);
        }
        (p.top_k > 0).then_some(p.top_k)
    }

    /// How many trailing history entries the penalty looks at: 0 when it changes no
    /// logit.
    pub fn penalty_window(&self) -> usize {
        if penalises(&self.params) {
            self.params.repeat_last_n
        } else {
            0
        }
    }

    /// The distinct tokens whose logits the penalty changes after `history`, ascending.
    pub fn penalised(&self, history: &[u32]) -> Vec<u32> {
        penalised_ids(history, self.penalty_window())
    }

    /// [`Sampler::sample`] given only some candidates of the logits over more than k
    /// tokens, in any order, for a sampler whose [`Sampler::picks_from_top_k`] is that
    /// k. With h tokens penalised after `history` ([`Sampler::penalised`]), the
    /// candidates must hold at least the k + h best logits ([`top_k`]) and those h
    /// tokens': however the penalty reorders them, the k best after it are among them.
    /// The same token, and the same draw from the random stream.
    pub fn sample_best(&mut self, cands: &[Cand], history: &[u32]) -> u32 {
        self.cands.clear();
        self.cands.extend_from_slice(cands);
        let seen = self.penalised(history);
        let p = &self.params;
        for c in self.cands.iter_mut() {
            if seen.binary_search(&c.0).is_ok() {
                c.1 = penalise(c.1, p.repeat_penalty);
            }
        }
        if p.temperature.is_nan() || p.temperature <= 0.0 {
            return argmax_cands(&self.cands);
        }
        keep_best(&mut self.cands, p.top_k as usize);
        self.draw_from_best()
    }

    /// Picks the next token. `history` holds the tokens seen so far (prompt and output),
    /// oldest first. Empty logits give 0; NaN logits count as -inf; if every logit is
    /// -inf the result is 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = &self.params;
        let greedy = p.temperature.is_nan() || p.temperature <= 0.0;
        let k = p.top_k as usize;
        // Without a penalty no logit changes before the cut, so the candidates need not
        // be listed whole: the same tokens in a fraction of the time (Gemma's 262144
        // logits: 0.58 ms -> 0.18 ms per token with top-k, 0.20 ms greedy).
        if !penalises(p) && !logits.is_empty() {
            if greedy {
                return argmax(logits);
            }
            if k > 0 && k < logits.len() {
                top_k_into(logits, k, &mut self.cands);
                return self.draw_from_best();
            }
        }
        self.sample_listing_all(logits, history)
    }

    /// [`Sampler::sample`] over the whole candidate list.
    fn sample_listing_all(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if logits.is_empty() {
            return 0;
        }
        self.cands.clear();
        self.cands.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, sanitize(l))),
        );
        apply_repeat_penalty(&mut self.cands, history, &self.params);

        let p = &self.params;
        // A NaN temperature is greedy as well.
        if p.temperature.is_nan() || p.temperature <= 0.0 {
            return argmax_cands(&self.cands);
        }
        if max_logit(&self.cands) == f32::NEG_INFINITY {
            // No finite logit: there is no distribution to draw from.
            return argmax_cands(&self.cands);
        }

        // `sorted`: how many leading candidates are known to be the best ones, in order.
        let mut sorted = 0;
        if p.top_k > 0 && (p.top_k as usize) < self.cands.len() {
            sorted = sort_prefix(&mut self.cands, 0, p.top_k as usize);
            self.cands.truncate(sorted);
        }
        self.cut_and_draw(sorted)
    }

    /// The draw over the candidates when they are the k best, in order.
    fn draw_from_best(&mut self) -> u32 {
        match self.cands.first() {
            None => 0,
            // No finite logit: there is no distribution to draw from.
            Some(&(id, l)) if l == f32::NEG_INFINITY => id,
            Some(_) => self.cut_and_draw(self.cands.len()),
        }
    }

    /// Top-p, min-p and the draw over the candidates, whose first `sorted` are the best
    /// ones in order.
    fn cut_and_draw(&mut self, sorted: usize) -> u32 {
        let p = &self.params;
        if p.top_p < 1.0 {
            apply_top_p(&mut self.cands, sorted, p.top_p);
        }
        if p.min_p > 0.0 {
            apply_min_p(&mut self.cands, p.min_p);
        }
        draw(&self.cands, p.temperature, self.rng.next_f64())
    }
}

/// Whether the repetition penalty changes any logit.
fn penalises(p: &SamplingParams) -> bool {
    p.repeat_last_n > 0 && p.repeat_penalty != 1.0 && p.repeat_penalty.is_finite()
}

/// The `k` best of `logits` (`0 < k < logits.len()`), sanitised and best first, into
/// `out`: one pass holding at most 2k candidates, cut back to the best k whenever full.
/// Ids arrive in ascending order, so a logit equal to the worst one kept ranks below it
/// (ties go to the lower id) and is skipped, as is anything lower.
fn top_k_into(logits: &[f32], k: usize, out: &mut Vec<Cand>) {
    out.clear();
    let mut floor: Option<f32> = None;
    for (i, &l) in logits.iter().enumerate() {
        let l = sanitize(l);
        // In the candidates' order (`total_cmp`: -0 ranks below +0), not IEEE's.
        if floor.is_some_and(|f| l.total_cmp(&f).is_le()) {
            continue;
        }
        out.push((i as u32, l));
        if out.len() == 2 * k {
            out.select_nth_unstable_by(k - 1, by_desc);
            out.truncate(k);
            floor = Some(out[k - 1].1);
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, by_desc);
        out.truncate(k);
    }
    out.sort_unstable_by(by_desc);
}

/// The `k` best of `logits`, sanitised and best first: descending logit, ties to the
/// lower id (all of them when `k` is not below their count).
pub fn top_k(logits: &[f32], k: usize) -> Vec<Cand> {
    let mut out = Vec::new();
    if k > 0 && k < logits.len() {
        top_k_into(logits, k, &mut out);
    } else {
        out.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, sanitize(l))),
        );
        out.sort_unstable_by(by_desc);
    }
    out
}

/// What [`Sampler::sample_best`] needs of `logits` for top-`k` after penalising the
/// distinct tokens `listed`: the `k + listed.len()` best, then the listed tokens' not
/// among them.
pub fn candidates(logits: &[f32], k: usize, listed: &[u32]) -> Vec<Cand> {
    let mut out = top_k(logits, k + listed.len());
    let best = out.len();
    for &id in listed {
        if let Some(&l) = logits.get(id as usize) {
            if !out[..best].iter().any(|c| c.0 == id) {
                out.push((id, sanitize(l)));
            }
        }
    }
    out
}

/// Sorts `cands` best first, in [`top_k`]'s order, and keeps the best `k`.
pub fn keep_best(cands: &mut Vec<Cand>, k: usize) {
    let m = sort_prefix(cands, 0, k);
    cands.truncate(m);
}

/// NaN carries no ranking information; treat it as impossible. +inf is clamped to the
/// largest finite value so that differences against it stay finite.
pub fn sanitize(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l.min(f32::MAX)
    }
}

/// llama.cpp's repetition penalty: each distinct token among the last `repeat_last_n`
/// history entries has its logit divided by the penalty when positive, multiplied when
/// not, once however often it occurs. `cands` is still indexed by id here.
fn apply_repeat_penalty(cands: &mut [Cand], history: &[u32], p: &SamplingParams) {
    if !penalises(p) {
        return;
    }
    for id in penalised_ids(history, p.repeat_last_n) {
        if let Some(c) = cands.get_mut(id as usize) {
            c.1 = penalise(c.1, p.repeat_penalty);
        }
    }
}

/// The distinct tokens among the last `window` entries of `history`, ascending.
pub fn penalised_ids(history: &[u32], window: usize) -> Vec<u32> {
    let mut seen = history[history.len().saturating_sub(window)..].to_vec();
    seen.sort_unstable();
    seen.dedup();
    seen
}

/// A penalised token's logit.
fn penalise(l: f32, penalty: f32) -> f32 {
    if l > 0.0 {
        l / penalty
    } else {
        l * penalty
    }
}

/// Descending logit, ties to the lower id: the one order every step uses.
fn by_desc(a: &Cand, b: &Cand) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

fn argmax_cands(cands: &[Cand]) -> u32 {
    cands
        .iter()
        .copied()
        .min_by(by_desc)
        .map(|c| c.0)
        .unwrap_or(0)
}

fn max_logit(cands: &[Cand]) -> f32 {
    cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1))
}

/// Makes `cands[..m]` the `m` best candidates in descending order, given that the first
/// `sorted` already are; returns `m` clamped to the length. One O(n) selection plus a sort
/// of the new part, never a sort of the whole list.
fn sort_prefix(cands: &mut [Cand], sorted: usize, m: usize) -> usize {
    let m = m.min(cands.len());
    if m <= sorted {
        return sorted;
    }
    let rest = &mut cands[sorted..];
    let want = m - sorted;
    if want < rest.len() {
        rest.select_nth_unstable_by(want - 1, by_desc);
    }
    rest[..want].sort_unstable_by(by_desc);
    m
}

/// Nucleus cut: keep the smallest prefix of the sorted candidates whose probability
/// (softmax of the current logits, before temperature, as llama.cpp does) reaches `top_p`.
/// `sorted` leading candidates are already the best ones in order.
fn apply_top_p(cands: &mut Vec<Cand>, mut sorted: usize, top_p: f32) {
    let max = max_logit(cands) as f64;
    let sum: f64 = cands.iter().map(|c| (c.1 as f64 - max).exp()).sum();
    let target = top_p as f64;
    let mut cum = 0.0f64;
    let mut i = 0;
    // Grow the sorted prefix geometrically: the nucleus is usually a few dozen tokens.
    let mut chunk = 64usize;
    while i < cands.len() {
        if i == sorted {
            sorted = sort_prefix(cands, sorted, sorted.saturating_add(chunk));
            chunk = chunk.saturating_mul(2);
        }
        cum += (cands[i].1 as f64 - max).exp() / sum;
        i += 1;
        if cum >= target {
            // Rounding may keep the sum under `top_p`: then everything stays.
            cands.truncate(i);
            return;
        }
    }
}

/// Keep tokens whose probability is at least `min_p` times the best one's, i.e. whose
/// logit is at least `max + ln(min_p)`. The best token always stays.
fn apply_min_p(cands: &mut Vec<Cand>, min_p: f32) {
    let max = max_logit(cands);
    let threshold = (max as f64 + (min_p as f64).ln()).min(max as f64);
    cands.retain(|c| c.1 as f64 >= threshold);
}

/// Draws from softmax(logit / temperature) over the candidates with the uniform `u` in [0, 1).
fn draw(cands: &[Cand], temperature: f32, u: f64) -> u32 {
    let t = temperature as f64;
    let max = max_logit(cands) as f64;
    let weight = |c: &Cand| ((c.1 as f64 - max) / t).exp();
    let sum: f64 = cands.iter().map(weight).sum();
    if sum.is_nan() || sum <= 0.0 || sum.is_infinite() {
        return argmax_cands(cands);
    }
    let r = u * sum;
    let mut cum = 0.0;
    for c in cands {
        cum += weight(c);
        if r < cum {
            return c.0;
        }
    }
    // Rounding left `r` just past the total: the last token with weight takes it.
    cands
        .iter()
        .rev()
        .find(|c| weight(c) > 0.0)
        .map(|c| c.0)
        .unwrap_or_else(|| argmax_cands(cands))
}

/// Index of the largest logit; ties go to the lowest id, NaN counts as -inf, and an
/// empty or all -inf vector gives 0.
pub fn argmax(logits: &[f32]) -> u32 {
    // Two passes, the maximum then its first position: one pass carrying the best index
    // is a chain of dependent compares (262144 logits: 0.26 ms, against 0.20).
    let max = logits
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| m.max(sanitize(l)));
    logits.iter().position(|&l| sanitize(l) == max).unwrap_or(0) as u32
}

/// log(sum(exp(l))) over the logits in f64, NaN as -inf; -inf when nothing is finite.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits
        .iter()
        .map(|&l| sanitize(l))
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    if max == f64::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    // A vocabulary's exponentials, in eight running sums of the CPU's polynomial e^x
    // (2e-7 relative, in code the compiler vectorises): a library call per value put
    // a perplexity run's scoring at a quarter of its time.
    let m = max as f32;
    let term = |l: f32| crate::cpu::ops::exp_fast(sanitize(l) - m) as f64;
    let mut acc = [0f64; 8];
    let chunks = logits.chunks_exact(8);
    let mut sum: f64 = chunks.remainder().iter().map(|&l| term(l)).sum();
    for c in chunks {
        for (a, &l) in acc.iter_mut().zip(c) {
            *a += term(l);
        }
    }
    sum += acc.iter().sum::<f64>();
    max + sum.ln()
}

/// Top-n (id, probability) after softmax of the raw logits, most likely first (ties to the
/// lower id). Empty when there are no logits or none is finite.
pub fn top_n_probs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let lse = log_sum_exp(logits);
    if n == 0 || lse == f64::NEG_INFINITY {
        return Vec::new();
    }
    let mut cands: Vec<Cand> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, sanitize(l)))
        .collect();
    let m = sort_prefix(&mut cands, 0, n);
    cands[..m]
        .iter()
        .map(|&(id, l)| (id, (l as f64 - lse).exp() as f32))
        .collect()
}

/// log-softmax of `id`: its logit minus the log-sum-exp of all logits, accumulated in f64.
/// -inf when `id` is out of range or its logit is NaN/-inf.
pub fn log_prob(logits: &[f32], id: u32) -> f32 {
    match logits.get(id as usize) {
        Some(&l) => {
            let l = sanitize(l);
            if l == f32::NEG_INFINITY {
                return f32::NEG_INFINITY;
            }
            (l as f64 - log_sum_exp(logits)) as f32
        }
        None => f32::NEG_INFINITY,
    }
}

/// xoshiro256** (Blackman and Vigna), its state filled from the seed with splitmix64 as
/// the authors recommend, so that nearby seeds give unrelated streams.
#[derive(Clone, Debug)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn seed_from(seed: u64) -> Self {
        let mut sm = seed;
        let mut next = || {
            sm = sm.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = sm;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Xoshiro256 {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) from the top 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: u32, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 1234,
        }
    }

    /// Logits whose softmax is exactly `probs`.
    fn logits_of(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    /// Sampling `n` times, the fraction of draws per token.
    fn frequencies(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<f64> {
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            counts[s.sample(logits, &[]) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    /// The set of ids the sampler can produce, found by drawing many times.
    fn support(p: SamplingParams, logits: &[f32], history: &[u32]) -> Vec<u32> {
        let mut s = Sampler::new(p);
        let mut ids: Vec<u32> = (0..4000).map(|_| s.sample(logits, history)).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    #[test]
    fn xoshiro_matches_published_reference() {
        // splitmix64 from seed 0 gives these first outputs (the reference C code's values).
        let x = Xoshiro256::seed_from(0);
        assert_eq!(x.s[0], 0xE220_A839_7B1D_CDAF);
        assert_eq!(x.s[1], 0x6E78_9E6A_A1B9_65F4);
        // xoshiro256** from state {1, 2, 3, 4}: first outputs of the reference implementation.
        let mut x = Xoshiro256 { s: [1, 2, 3, 4] };
        assert_eq!(x.next_u64(), 11520);
        assert_eq!(x.next_u64(), 0);
        assert_eq!(x.next_u64(), 1_509_978_240);
        assert_eq!(x.next_u64(), 1_215_971_899_390_074_240);
    }

    #[test]
    fn argmax_picks_largest_lowest_on_ties_and_ignores_nan() {
        assert_eq!(argmax(&[0.1, 3.0, -2.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        assert_eq!(argmax(&[f32::NAN; 3]), 0);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[1.0, f32::INFINITY, 2.0]), 1);
    }

    #[test]
    fn greedy_returns_argmax_and_ignores_seed() {
        let logits = [0.5, 2.5, -1.0, 2.4, 0.0];
        for seed in 0..5 {
            let mut p = params(0.0, 40, 0.95, 0.05);
            p.seed = seed;
            let mut s = Sampler::new(p);
            for _ in 0..10 {
                assert_eq!(s.sample(&logits, &[]), 1);
            }
        }
        // Ties go to the lowest id, and a negative temperature is greedy as well.
        let mut s = Sampler::new(params(-1.0, 0, 1.0, 0.0));
        assert_eq!(s.sample(&[1.0, 7.0, 7.0, 7.0], &[]), 1);
    }

    #[test]
    fn plain_greedy_means_argmax_without_a_penalty() {
        let greedy = |t: f32, penalty: f32| {
            let mut p = params(t, 40, 0.95, 0.05);
            p.repeat_penalty = penalty;
            p.repeat_last_n = 64;
            Sampler::new(p).is_plain_greedy()
        };
        assert!(greedy(0.0, 1.0) && greedy(-1.0, 1.0) && greedy(f32::NAN, 1.0));
        // A penalty changes logits before the argmax; a temperature draws.
        assert!(!greedy(0.0, 1.1) && !greedy(0.8, 1.0));
    }

    #[test]
    fn temperature_zero_equals_argmax_on_random_logits() {
        let mut gen = Xoshiro256::seed_from(99);
        let mut s = Sampler::new(params(0.0, 40, 0.95, 0.05));
        for _ in 0..50 {
            let logits: Vec<f32> = (0..1000)
                .map(|_| (gen.next_f64() * 20.0 - 10.0) as f32)
                .collect();
            assert_eq!(s.sample(&logits, &[]), argmax(&logits));
        }
    }

    /// `n` logits from up to `levels` values (many ties), with NaN, infinities and
    /// both zeros mixed in.
    fn tied_logits(pick: &mut impl FnMut(u64) -> usize, n: usize, levels: u64) -> Vec<f32> {
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0];
        let levels = 1 + pick(levels) as u64;
        (0..n)
            .map(|_| match pick(20) {
                0 => specials[pick(5)],
                _ => pick(levels) as f32 * 0.7 - 2.0,
            })
            .collect()
    }

    #[test]
    fn fast_paths_give_the_tokens_of_the_whole_list() {
        // Logits with many ties and special values, over vocabularies around the top-k
        // sizes; the same seed on both paths.
        let mut gen = Xoshiro256::seed_from(11);
        let mut pick = |n: u64| (gen.next_u64() % n) as usize;
        for case in 0..300 {
            let n = 1 + pick(300);
            let logits = tied_logits(&mut pick, n, 8);
            let temperature = [0.0, 0.3, 1.0, 2.5][case % 4];
            let top_k = [1, 2, 3, 5, 40, 1000][pick(6)];
            let top_p = [1.0, 0.95, 0.5][pick(3)];
            let min_p = [0.0, 0.05, 0.5][pick(3)];
            let mut p = params(temperature, top_k, top_p, min_p);
            p.seed = case as u64;
            let (mut fast, mut whole) = (Sampler::new(p.clone()), Sampler::new(p));
            for _ in 0..20 {
                let a = fast.sample(&logits, &[]);
                let b = whole.sample_listing_all(&logits, &[]);
                assert_eq!(
                    a, b,
                    "case {case}: n {n}, t {temperature}, k {top_k}: {logits:?}"
                );
            }
        }
    }

    /// A step that keeps only the k + h best logits and the h penalised tokens' (chosen
    /// on a device: a superset in any order) samples what the whole vocabulary does,
    /// draw for draw, with penalties that lower logits and ones that raise them, and
    /// picks the same greedy token after a penalty.
    #[test]
    fn the_best_and_the_penalised_give_the_tokens_of_the_whole_list() {
        let mut gen = Xoshiro256::seed_from(12);
        let mut pick = |n: u64| (gen.next_u64() % n) as usize;
        let (mut checked, mut greedy) = (0, 0);
        for case in 0..300 {
            let n = 2 + pick(400);
            let logits = tied_logits(&mut pick, n, 12);
            let mut p = params(
                [0.0, 0.4, 1.0, 3.0][case % 4],
                [0, 1, 2, 7, 40, 500][pick(6)],
                [1.0, 0.95, 0.6][pick(3)],
                [0.0, 0.05, 0.4][pick(3)],
            );
            p.seed = case as u64;
            // Penalties that lower logits and ones that raise them, over histories
            // that repeat tokens.
            p.repeat_penalty = [1.0, 1.0, 1.3, 0.7][pick(4)];
            p.repeat_last_n = pick(20);
            let history: Vec<u32> = (0..pick(30)).map(|_| pick(n as u64) as u32).collect();
            let whole = Sampler::new(p.clone());
            let Some(k) = whole.picks_from_top_k().map(|k| k as usize) else {
                assert_eq!(p.top_k, 0);
                continue;
            };
            // Plain greedy keeps the argmax alone (`Keep::Greedy`).
            if whole.is_plain_greedy() {
                continue;
            }
            greedy += usize::from(p.temperature <= 0.0);
            if k >= n {
                continue;
            }
            // A device's list: every logit at or above some floor below the k + h
            // best, then the penalised tokens' not among them, shuffled.
            let seen = whole.penalised(&history);
            let mut found = top_k(&logits, (k + seen.len() + pick(5)).min(n));
            for &id in &seen {
                if !found.iter().any(|c| c.0 == id) {
                    found.push((id, sanitize(logits[id as usize])));
                }
            }
            for i in (1..found.len()).rev() {
                found.swap(i, pick(i as u64 + 1));
            }
            if seen.is_empty() {
                let mut cut = found.clone();
                keep_best(&mut cut, k);
                assert_eq!(cut, top_k(&logits, k), "case {case}");
            }
            let (mut whole, mut best) = (whole, Sampler::new(p));
            for _ in 0..10 {
                assert_eq!(
                    best.sample_best(&found, &history),
                    whole.sample(&logits, &history),
                    "case {case}: n {n}, k {k}, penalised {seen:?}: {logits:?}"
                );
            }
            checked += 1;
        }
        assert!(checked > 100, "{checked} cases drew from their best");
        assert!(greedy > 20, "{greedy} greedy cases after a penalty");
    }

    #[test]
    fn top_k_into_keeps_the_best_lowest_ids_first() {
        let mut out = Vec::new();
        top_k_into(
            &[1.0, 3.0, 3.0, f32::NAN, 2.0, 3.0, f32::INFINITY],
            3,
            &mut out,
        );
        assert_eq!(out, vec![(6, f32::MAX), (1, 3.0), (2, 3.0)]);
        top_k_into(&[f32::NEG_INFINITY; 9], 2, &mut out);
        assert_eq!(out, vec![(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)]);
    }

    #[test]
    fn top_k_one_equals_greedy() {
        let mut gen = Xoshiro256::seed_from(7);
        let mut s = Sampler::new(params(1.5, 1, 1.0, 0.0));
        for _ in 0..50 {
            let logits: Vec<f32> = (0..500).map(|_| gen.next_f64() as f32).collect();
            assert_eq!(s.sample(&logits, &[]), argmax(&logits));
        }
    }

    #[test]
    fn same_seed_same_tokens_other_seed_differs() {
        let mut gen = Xoshiro256::seed_from(3);
        let logits: Vec<f32> = (0..2000).map(|_| (gen.next_f64() * 4.0) as f32).collect();
        let run = |seed| {
            let mut p = params(1.0, 0, 1.0, 0.0);
            p.seed = seed;
            let mut s = Sampler::new(p);
            (0..100).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn empty_nan_and_infinite_logits_do_not_panic() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[], &[]), 0);
        assert_eq!(s.sample(&[f32::NAN; 4], &[1, 2]), 0);
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 4], &[]), 0);
        // One finite logit among NaNs must be the only possible draw.
        for _ in 0..20 {
            assert_eq!(s.sample(&[f32::NAN, f32::NAN, 0.3, f32::NAN], &[]), 2);
        }
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, f32::INFINITY, 1.0], &[]), 1);
        }
        // History ids beyond the vocabulary are ignored.
        let mut p = SamplingParams {
            repeat_penalty: 1.3,
            ..Default::default()
        };
        p.temperature = 0.0;
        let mut s = Sampler::new(p);
        assert_eq!(s.sample(&[1.0, 2.0], &[5, 1_000_000]), 1);
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_p() {
        // probs 0.5, 0.3, 0.15, 0.05: cumulative 0.5, 0.8, 0.95, 1.0.
        let logits = logits_of(&[0.15, 0.5, 0.05, 0.3]);
        assert_eq!(support(params(1.0, 0, 0.49, 0.0), &logits, &[]), vec![1]);
        assert_eq!(support(params(1.0, 0, 0.6, 0.0), &logits, &[]), vec![1, 3]);
        assert_eq!(support(params(1.0, 0, 0.79, 0.0), &logits, &[]), vec![1, 3]);
        assert_eq!(
            support(params(1.0, 0, 0.85, 0.0), &logits, &[]),
            vec![0, 1, 3]
        );
        assert_eq!(
            support(params(1.0, 0, 1.0, 0.0), &logits, &[]),
            vec![0, 1, 2, 3]
        );
    }

    #[test]
    fn top_p_on_large_vocab_grows_sorted_prefix() {
        // 300 equal tokens hold 0.9 of the mass and the other 99700 share the rest; the
        // nucleus for p = 0.8 must be at most those 300 (needs several prefix doublings).
        let n = 100_000;
        let mut probs = vec![0.1 / (n - 300) as f32; n];
        for p in probs.iter_mut().skip(1000).take(300) {
            *p = 0.9 / 300.0;
        }
        let logits = logits_of(&probs);
        let ids = support(params(1.0, 0, 0.8, 0.0), &logits, &[]);
        assert!(ids.iter().all(|&i| (1000..1300).contains(&i)));
        // Ties resolve to the lower ids: 0.8 / 0.003 = 267 tokens are kept.
        assert!(ids.len() > 200, "{}", ids.len());
        assert!(ids.iter().all(|&i| i < 1267), "{:?}", ids.last());
    }

    #[test]
    fn min_p_drops_tokens_below_fraction_of_best() {
        // Relative to the best (0.5): 0.3 -> 0.6, 0.15 -> 0.3, 0.05 -> 0.1.
        let logits = logits_of(&[0.15, 0.5, 0.05, 0.3]);
        assert_eq!(
            support(params(1.0, 0, 1.0, 0.05), &logits, &[]),
            vec![0, 1, 2, 3]
        );
        assert_eq!(
            support(params(1.0, 0, 1.0, 0.2), &logits, &[]),
            vec![0, 1, 3]
        );
        assert_eq!(support(params(1.0, 0, 1.0, 0.5), &logits, &[]), vec![1, 3]);
        assert_eq!(support(params(1.0, 0, 1.0, 0.7), &logits, &[]), vec![1]);
        // Above 1 it would drop everything; the best token stays.
        assert_eq!(support(params(1.0, 0, 1.0, 3.0), &logits, &[]), vec![1]);
    }

    #[test]
    fn top_k_cuts_before_top_p() {
        // top-k 3 renormalises over {1, 3, 0}: 0.5/0.95, 0.3/0.95 -> cumulative 0.526, 0.842.
        // With p = 0.83 the untruncated nucleus would be {1, 3, 0}; after top-k it is {1, 3}.
        let logits = logits_of(&[0.15, 0.5, 0.05, 0.3]);
        assert_eq!(
            support(params(1.0, 0, 0.83, 0.0), &logits, &[]),
            vec![0, 1, 3]
        );
        assert_eq!(support(params(1.0, 3, 0.83, 0.0), &logits, &[]), vec![1, 3]);
        assert_eq!(support(params(1.0, 2, 1.0, 0.0), &logits, &[]), vec![1, 3]);
    }

    #[test]
    fn repeat_penalty_divides_positive_multiplies_negative() {
        let mut p = params(0.0, 0, 1.0, 0.0);
        p.repeat_penalty = 2.0;
        p.repeat_last_n = 3;
        let mut s = Sampler::new(p);
        // Token 0 (3.0) penalised to 1.5, so token 1 (2.0) wins.
        assert_eq!(s.sample(&[3.0, 2.0, 1.0], &[0]), 1);
        // Only the last 3 history entries count: token 0 is outside the window.
        assert_eq!(s.sample(&[3.0, 2.0, 1.0], &[0, 2, 2, 2]), 0);
        // Negative logits get more negative: -1.0 -> -2.0 loses to -1.5.
        assert_eq!(s.sample(&[-1.0, -1.5], &[0]), 1);
        // Repeats count once: penalising 0 three times is still 3.0 / 2 = 1.5 > 1.4.
        assert_eq!(s.sample(&[3.0, 1.4], &[0, 0, 0]), 0);
        // Penalty 1.0 or window 0 leaves the logits alone.
        let mut p = params(0.0, 0, 1.0, 0.0);
        p.repeat_last_n = 0;
        p.repeat_penalty = 2.0;
        assert_eq!(Sampler::new(p).sample(&[3.0, 2.0], &[0]), 0);
    }

    #[test]
    fn repeat_penalty_shifts_sampled_distribution() {
        // Equal logits 1.0; penalty 2 on token 0 -> logit 0.5, so p0 = e^0.5 / (e^0.5 + e).
        let mut p = params(1.0, 0, 1.0, 0.0);
        p.repeat_penalty = 2.0;
        let mut s = Sampler::new(p);
        let n = 20_000;
        let hits = (0..n).filter(|_| s.sample(&[1.0, 1.0], &[0]) == 0).count();
        let expect = 0.5f64.exp() / (0.5f64.exp() + 1.0f64.exp());
        assert!((hits as f64 / n as f64 - expect).abs() < 0.015);
    }

    #[test]
    fn draws_follow_softmax_probabilities() {
        let probs = [0.2, 0.5, 0.3];
        let mut s = Sampler::new(params(1.0, 0, 1.0, 0.0));
        let f = frequencies(&mut s, &logits_of(&probs), 10_000);
        for (got, want) in f.iter().zip(probs) {
            // 4 standard deviations of a binomial proportion at n = 10000 is under 0.02.
            assert!((got - want as f64).abs() < 0.02, "{f:?}");
        }
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        // Logits ln(0.2), ln(0.5), ln(0.3) at T = 0.5 become probs proportional to p^2.
        let probs = [0.2f64, 0.5, 0.3];
        let z: f64 = probs.iter().map(|p| p * p).sum();
        let mut s = Sampler::new(params(0.5, 0, 1.0, 0.0));
        let logits = logits_of(&[0.2, 0.5, 0.3]);
        let f = frequencies(&mut s, &logits, 10_000);
        for (got, p) in f.iter().zip(probs) {
            assert!((got - p * p / z).abs() < 0.02, "{f:?}");
        }
    }

    #[test]
    fn top_n_probs_sorted_and_normalised() {
        let logits = logits_of(&[0.1, 0.4, 0.2, 0.3]);
        let top = top_n_probs(&logits, 3);
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        for ((_, got), want) in top.iter().zip([0.4, 0.3, 0.2]) {
            assert!((got - want).abs() < 1e-6);
        }
        // Shifting all logits changes nothing; n beyond the length is clamped.
        let shifted: Vec<f32> = logits.iter().map(|l| l + 100.0).collect();
        let all = top_n_probs(&shifted, 10);
        assert_eq!(all.len(), 4);
        let total: f32 = all.iter().map(|t| t.1).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(top_n_probs(&[], 5).is_empty());
        assert!(top_n_probs(&[f32::NAN], 5).is_empty());
    }

    #[test]
    fn log_prob_is_log_softmax() {
        let logits = logits_of(&[0.1, 0.4, 0.2, 0.3]);
        assert!((log_prob(&logits, 1) - 0.4f32.ln()).abs() < 1e-6);
        // Large offsets would overflow a naive exp sum in f32.
        let big: Vec<f32> = logits.iter().map(|l| l + 1000.0).collect();
        assert!((log_prob(&big, 3) - 0.3f32.ln()).abs() < 1e-4);
        assert_eq!(log_prob(&logits, 4), f32::NEG_INFINITY);
        assert_eq!(log_prob(&[f32::NAN, 0.0], 0), f32::NEG_INFINITY);
        assert!(log_prob(&[f32::NAN, 0.0], 1).abs() < 1e-7);
    }

    #[test]
    fn large_vocab_sampling_stays_in_top_k() {
        let n = 262_144;
        let mut gen = Xoshiro256::seed_from(11);
        let logits: Vec<f32> = (0..n).map(|_| (gen.next_f64() * 30.0) as f32).collect();
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        let top: std::collections::HashSet<u32> = order[..40].iter().copied().collect();
        let mut s = Sampler::new(params(1.0, 40, 0.95, 0.0));
        for _ in 0..20 {
            assert!(top.contains(&s.sample(&logits, &[])));
        }
    }
}
