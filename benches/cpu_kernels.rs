//! Throughput of the CPU matmul per weight type: GB/s of weight bytes streamed, at one
//! token (generation) and 64 tokens (prompt processing), on the pool's threads.
//! `cargo bench --bench cpu_kernels [-- THREADS] [big | shape=COLSxROWS] [batch=N]
//! [copies=N]`; with
//! `attn` it times attention over a cache of f16 keys and values instead (`heads=Q/KV`,
//! `hd=N`, `keys=N`, `batch=N`: GB/s of keys and values read); with `model` it times the CpuModel
//! on the models in `models/` instead, as `llama-bench -p 64 -n 32` does (pp64: one
//! batch of 64 tokens; tg32: 32 single-token steps), mean ± sd over the repetitions.

use std::time::Instant;

use wgllm::cpu::act::{quantize_rows, ActType};
use wgllm::cpu::dot::Isa;
use wgllm::cpu::matmul::{mul_mat_quantized, WeightView};
use wgllm::cpu::pool::Pool;
use wgllm::quant::{self, GgmlType};

const TYPES: [GgmlType; 13] = GgmlType::WEIGHT_TYPES;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
            (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() {
    let threads = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(0);
    if std::env::args().any(|a| a == "model") {
        for name in [
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "gemma-3-270m-q4_k_m.gguf",
        ] {
            // BENCH_MODEL=gemma (a part of the file name) times one model.
            if std::env::var("BENCH_MODEL").is_ok_and(|m| !name.contains(m.as_str())) {
                continue;
            }
            model_speed(name, threads);
        }
        return;
    }
    let pool = Pool::new(threads);
    if std::env::args().any(|a| a == "attn") {
        attention_speed(&pool);
        return;
    }
    // `avx2`, `neon` (NEON without `sdot`) or `scalar` on the command line picks a
    // lesser instruction set.
    let isa = if std::env::args().any(|a| a == "scalar") {
        Isa::Scalar
    } else if std::env::args().any(|a| a == "avx2") {
        Isa::Avx2
    } else if std::env::args().any(|a| a == "neon") {
        Isa::Neon
    } else {
        Isa::detect()
    };
    println!("threads {}, {isa:?}", pool.n_threads());
    // Batches are arithmetic: their multiply-adds per second against the byte-dot
    // instruction's own rate on these threads, measured here.
    let peak = byte_dot_peak(&pool, isa);
    match peak {
        Some(p) => println!("byte-dot peak {:.1} GMAC/s", p / 1e9),
        None => println!("byte-dot peak: not measured for {isa:?}"),
    }
    println!(
        "{:<6} {:>11} {:>6} {:>10} {:>9} {:>9} {:>6}",
        "type", "shape", "tokens", "ms/op", "GB/s", "GMAC/s", "%peak"
    );
    // `shape=COLSxROWS` times one shape, `batch=N` only batches of N tokens.
    let arg = |key: &str| std::env::args().find_map(|a| a.strip_prefix(key).map(str::to_string));
    let custom = arg("shape=").and_then(|s| {
        let (c, r) = s.split_once('x')?;
        Some([(c.parse().ok()?, r.parse().ok()?)])
    });
    let batch: Option<usize> = arg("batch=").and_then(|b| b.parse().ok());
    // One token and a batch of 64, or only the batch asked for.
    let token_counts = match batch {
        Some(n) => vec![n],
        None => vec![1, 64],
    };
    let shapes: &[(usize, usize)] = if let Some(c) = &custom {
        c
    } else if std::env::args().any(|a| a == "big") {
        &[(4096, 32768)]
    } else {
        &[(576, 1536), (4096, 4096)]
    };
    for &(n_cols, n_rows) in shapes {
        for ty in TYPES {
            if n_cols % ty.block_size() != 0 {
                println!(
                    "{:<6} {:>11}   (rows of {n_cols} are not whole blocks)",
                    ty.name(),
                    format!("{n_cols}x{n_rows}")
                );
                continue;
            }
            let wq = {
                let mut q = Vec::new();
                // Quantizing K-types is slow; quantize one row block and repeat it.
                let rows = 16.min(n_rows);
                quant::quantize(ty, &values(n_cols * rows, 1), &mut q).unwrap_or(());
                let mut all = Vec::with_capacity(q.len() * n_rows / rows);
                for _ in 0..n_rows / rows {
                    all.extend_from_slice(&q);
                }
                all
            };
            // `copies=N` cycles through N copies of the weights, so that each op reads
            // them from memory as a model too large for the caches does.
            let copies: usize = arg("copies=")
                .and_then(|c| c.parse().ok())
                .unwrap_or(1)
                .max(1);
            let wq = wq.repeat(copies);
            let one = wq.len() / copies;
            let views: Vec<WeightView> = wq
                .chunks_exact(one)
                .map(|data| WeightView {
                    ty,
                    data,
                    n_cols,
                    n_rows,
                })
                .collect();
            for &n_tokens in &token_counts {
                let at = ActType::for_weight(ty).unwrap();
                let mut a = Vec::new();
                quantize_rows(at, &values(n_cols * n_tokens, 2), n_cols, &mut a).unwrap();
                let mut y = vec![0.0; n_rows * n_tokens];
                let next = std::cell::Cell::new(0);
                let run = |y: &mut [f32]| {
                    let w = &views[next.get() % copies];
                    next.set(next.get() + 1);
                    mul_mat_quantized(&pool, isa, w, &a, n_tokens, y).unwrap()
                };
                run(&mut y);
                let budget = 0.3;
                let t0 = Instant::now();
                let mut iters = 0u32;
                while t0.elapsed().as_secs_f64() < budget {
                    run(&mut y);
                    iters += 1;
                }
                let s = t0.elapsed().as_secs_f64() / iters as f64;
                let macs = (n_cols * n_rows * n_tokens) as f64 / s;
                let pct = peak.map_or("-".to_string(), |p| format!("{:.0}", 100.0 * macs / p));
                println!(
                    "{:<6} {:>11} {:>6} {:>10.4} {:>9.2} {:>9.1} {:>6}",
                    ty.name(),
                    format!("{n_cols}x{n_rows}"),
                    n_tokens,
                    s * 1e3,
                    one as f64 / s / 1e9,
                    macs / 1e9,
                    pct
                );
            }
        }
    }
}

/// Multiply-adds per second of the byte dot product the tile kernels use (`vpdpbusd` on
/// 512-bit registers with AVX-512 VNNI; two `maddubs`, an add and a `madd` per 64 on
/// AVX2), in independent chains on every thread of the pool.
fn byte_dot_peak(pool: &Pool, isa: Isa) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        let (f, macs): (unsafe fn(usize) -> i32, f64) = match isa {
            Isa::Avx512Vnni => (peak::vnni, 8.0 * 64.0),
            Isa::Avx2 => (peak::avx2, 8.0 * 64.0),
            _ => return None,
        };
        let iters = 4_000_000;
        let run = || {
            pool.run(&|_, _| {
                // SAFETY: `isa` was detected (or asked for) on this CPU.
                std::hint::black_box(unsafe { f(std::hint::black_box(iters)) });
            })
        };
        run();
        let t0 = Instant::now();
        run();
        let s = t0.elapsed().as_secs_f64();
        Some(macs * iters as f64 * pool.n_threads() as f64 / s)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (pool, isa);
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;

    /// `n` rounds of eight independent `vpdpbusd` (64 multiply-adds each).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn vnni(n: usize) -> i32 {
        let (u, s) = (_mm512_set1_epi8(3), _mm512_set1_epi8(-2));
        let mut acc = [_mm512_setzero_si512(); 8];
        for _ in 0..n {
            for a in acc.iter_mut() {
                *a = _mm512_dpbusd_epi32(*a, u, s);
            }
        }
        let sum = acc
            .iter()
            .fold(_mm512_setzero_si512(), |x, &y| _mm512_add_epi32(x, y));
        _mm512_reduce_add_epi32(sum)
    }

    /// `n` rounds of eight independent two-piece AVX2 byte dots (64 multiply-adds each,
    /// as the blocked kernel does them).
    #[target_feature(enable = "avx2")]
    pub unsafe fn avx2(n: usize) -> i32 {
        let one = _mm256_set1_epi16(1);
        // Operands that differ between the chains and change every round (one add per
        // 512 multiply-adds), or the compiler would compute the products once.
        let mut s = _mm256_set1_epi8(-2);
        let us: [__m256i; 8] = std::array::from_fn(|k| _mm256_set1_epi8(k as i8 + 1));
        let mut acc = [_mm256_setzero_si256(); 8];
        for _ in 0..n {
            s = _mm256_add_epi8(s, one);
            for (a, &u) in acc.iter_mut().zip(&us) {
                let p = _mm256_add_epi16(_mm256_maddubs_epi16(u, s), _mm256_maddubs_epi16(s, u));
                *a = _mm256_add_epi32(*a, _mm256_madd_epi16(p, one));
            }
        }
        let sum = acc
            .iter()
            .fold(_mm256_setzero_si256(), |x, &y| _mm256_add_epi32(x, y));
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, sum);
        out.iter().sum()
    }
}

/// Attention of `batch` query tokens (default 1: generation) over `keys` cached
/// positions, as a model layer runs it: GB/s of f16 keys and values read (each once per
/// call) and GFLOP/s of the two products.
fn attention_speed(pool: &Pool) {
    use wgllm::cpu::attention::{attention, AttnScratch};
    use wgllm::cpu::kv_cache::KvCache;
    use wgllm::ops::attention::Attention;
    let arg = |key: &str| std::env::args().find_map(|a| a.strip_prefix(key).map(str::to_string));
    let num = |key: &str, d: usize| arg(key).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (nh, nkv) = arg("heads=")
        .and_then(|h| {
            let (q, kv) = h.split_once('/')?;
            Some((q.parse().ok()?, kv.parse().ok()?))
        })
        .unwrap_or((9usize, 3usize));
    let (hd, n_keys, n_tokens) = (num("hd=", 64), num("keys=", 4096), num("batch=", 1));
    let a = Attention {
        head_dim: hd as u32,
        n_head: nh as u32,
        n_head_kv: nkv as u32,
        n_ctx: n_keys as u32,
        window: 0,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    let kd = hd * nkv;
    // `layers=N` caches, walked in turn as a model's layers are: more than the last-level
    // cache holds puts the reads on memory, where generation finds them.
    let caches: Vec<KvCache> = (0..num("layers=", 1))
        .map(|l| {
            let mut cache = KvCache::new(kd, n_keys).unwrap();
            let k = values(kd * n_keys, 3 + 2 * l as u32);
            let v = values(kd * n_keys, 4 + 2 * l as u32);
            cache.store(&k, &v, 0, n_keys).unwrap();
            cache
        })
        .collect();
    let q = values(hd * nh * n_tokens, 5);
    let mut out = vec![0f32; q.len()];
    let scratch = AttnScratch::new(pool.n_threads());
    let pos = n_keys - n_tokens;
    let mut run = |cache: &KvCache| {
        attention(pool, &a, &q, cache, &mut out, pos, n_tokens, &scratch).unwrap()
    };
    caches.iter().for_each(&mut run);
    let t0 = Instant::now();
    let mut iters = 0u32;
    while t0.elapsed().as_secs_f64() < 0.5 {
        caches.iter().for_each(&mut run);
        iters += caches.len() as u32;
    }
    let s = t0.elapsed().as_secs_f64() / iters as f64;
    let bytes = (2 * kd * n_keys * 2) as f64;
    let flops = (4 * hd * nh * n_tokens * n_keys) as f64;
    println!(
        "attention heads {nh}/{nkv} hd {hd} keys {n_keys} tokens {n_tokens} layers {}, {} threads: \
         {:.4} ms, {:.2} GB/s of K and V, {:.1} GFLOP/s",
        caches.len(),
        pool.n_threads(),
        s * 1e3,
        bytes / s / 1e9,
        flops / s / 1e9
    );
}

fn model_speed(name: &str, threads: usize) {
    use std::sync::Arc;
    use wgllm::cpu::backend::CpuModel;
    use wgllm::model::gpu_backend::Logits;
    let path = format!("{}/models/{name}", env!("CARGO_MANIFEST_DIR"));
    let file = Arc::new(wgllm::gguf::GgufFile::open(&path).unwrap());
    let cfg = wgllm::model::Config::from_metadata(file.metadata()).unwrap();
    let n_vocab = cfg.n_vocab;
    let mut m = CpuModel::load(file, cfg, 512, 64, threads).unwrap();
    let tokens: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % n_vocab).collect();
    // As llama-bench: pp64 is one batch of 64 tokens into an empty cache, tg32 is 32
    // single-token steps from position 0; one warm-up run, then REPS timed ones.
    let pp = |m: &mut CpuModel| {
        let t0 = Instant::now();
        m.step(&tokens, 0, Logits::Last).unwrap();
        64.0 / t0.elapsed().as_secs_f64()
    };
    let tg = |m: &mut CpuModel| {
        let t0 = Instant::now();
        for (i, &t) in tokens.iter().take(32).enumerate() {
            m.step(&[t], i as u32, Logits::Last).unwrap();
        }
        32.0 / t0.elapsed().as_secs_f64()
    };
    // BENCH_ONLY=pp64 or tg32 runs one of the tests (for profiling).
    let only = std::env::var("BENCH_ONLY").ok();
    for (test, f) in [
        ("pp64", &pp as &dyn Fn(&mut CpuModel) -> f64),
        ("tg32", &tg),
    ] {
        if only.as_deref().is_some_and(|o| o != test) {
            continue;
        }
        f(&mut m);
        let runs: Vec<f64> = (0..REPS).map(|_| f(&mut m)).collect();
        let mean = runs.iter().sum::<f64>() / runs.len() as f64;
        let var = runs.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (runs.len() - 1) as f64;
        println!(
            "{name:<36} {:>2} threads {test} {mean:>8.2} ± {:.2} t/s",
            m.n_threads(),
            var.sqrt()
        );
    }
}

/// Timed repetitions per test, as llama-bench's `-r`.
const REPS: usize = 5;
