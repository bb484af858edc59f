//! Throughput of the CPU matmul per weight type: GB/s of weight bytes streamed, at one
//! token (generation) and 64 tokens (prompt processing), on the pool's threads.
//! `cargo bench --bench cpu_kernels [-- THREADS]`; with `model` it times the CpuModel
//! on the models in `models/` instead (prompt of 128 tokens, then 64 generated).

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
            model_speed(name, threads);
        }
        return;
    }
    let pool = Pool::new(threads);
    let isa = Isa::detect();
    println!("threads {}, {isa:?}", pool.n_threads());
    println!(
        "{:<6} {:>11} {:>6} {:>10} {:>9}",
        "type", "shape", "tokens", "ms/op", "GB/s"
    );
    for (n_cols, n_rows) in [(576usize, 1536usize), (4096, 4096)] {
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
            let w = WeightView {
                ty,
                data: &wq,
                n_cols,
                n_rows,
            };
            for n_tokens in [1usize, 64] {
                let at = ActType::for_weight(ty).unwrap();
                let mut a = Vec::new();
                quantize_rows(at, &values(n_cols * n_tokens, 2), n_cols, &mut a).unwrap();
                let mut y = vec![0.0; n_rows * n_tokens];
                let run =
                    |y: &mut [f32]| mul_mat_quantized(&pool, isa, &w, &a, n_tokens, y).unwrap();
                run(&mut y);
                let budget = 0.3;
                let t0 = Instant::now();
                let mut iters = 0u32;
                while t0.elapsed().as_secs_f64() < budget {
                    run(&mut y);
                    iters += 1;
                }
                let s = t0.elapsed().as_secs_f64() / iters as f64;
                println!(
                    "{:<6} {:>11} {:>6} {:>10.4} {:>9.2}",
                    ty.name(),
                    format!("{n_cols}x{n_rows}"),
                    n_tokens,
                    s * 1e3,
                    wq.len() as f64 / s / 1e9
                );
            }
        }
    }
}

fn model_speed(name: &str, threads: usize) {
    use std::sync::Arc;
    use wgllm::cpu::backend::CpuModel;
    use wgllm::model::gpu_backend::Logits;
    let path = format!("{}/models/{name}", env!("CARGO_MANIFEST_DIR"));
    let file = Arc::new(wgllm::gguf::GgufFile::open(&path).unwrap());
    let cfg = wgllm::model::Config::from_metadata(file.metadata()).unwrap();
    let n_vocab = cfg.n_vocab;
    let mut m = CpuModel::load(file, cfg, 512, 128, threads).unwrap();
    let prompt: Vec<u32> = (0..128u32).map(|i| (i * 7919 + 13) % n_vocab).collect();
    let t0 = Instant::now();
    let mut logits = m.step(&prompt, 0, Logits::Last).unwrap();
    let pp = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let n_gen = 64;
    for i in 0..n_gen {
        let mut best = 0;
        for (j, v) in logits.iter().enumerate() {
            if *v > logits[best] {
                best = j;
            }
        }
        logits = m.step(&[best as u32], 128 + i, Logits::Last).unwrap();
    }
    let tg = t1.elapsed().as_secs_f64();
    println!(
        "{name}: {} threads, prompt {:.1} tok/s, generation {:.1} tok/s",
        m.n_threads(),
        prompt.len() as f64 / pp,
        n_gen as f64 / tg
    );
}
