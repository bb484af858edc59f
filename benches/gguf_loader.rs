//! GGUF loader timing on the real models in models/: open + parse (mmap, header,
//! metadata, tensor table) and a walk over the tensor table touching each tensor's
//! first page. `cargo bench --bench gguf_loader`.

use std::path::Path;
use std::time::Instant;

use wgllm::gguf::GgufFile;

const MODELS: [&str; 2] = [
    "models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "models/gemma-3-270m-q4_k_m.gguf",
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let reps = 20;
    println!("| model | tensors | open+parse ms (median) | table walk us (median) |");
    println!("|---|---:|---:|---:|");
    for m in MODELS {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(m);
        if !path.exists() {
            eprintln!("skipping {m}: not present (tools/fetch-models)");
            continue;
        }
        let mut open = Vec::new();
        let mut walk = Vec::new();
        let mut n_tensors = 0;
        for _ in 0..reps {
            let t0 = Instant::now();
            let f = GgufFile::open(&path).expect("open");
            open.push(t0.elapsed().as_secs_f64() * 1e3);
            let t1 = Instant::now();
            let mut acc = 0u64;
            for t in f.tensors() {
                acc = acc.wrapping_add(t.n_bytes ^ t.offset);
                acc = acc.wrapping_add(t.dims.iter().product::<u64>());
            }
            walk.push(t1.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(acc);
            n_tensors = f.tensors().len();
        }
        println!(
            "| {m} | {n_tensors} | {:.3} | {:.1} |",
            median(open),
            median(walk)
        );
    }
}
