//! `wgllm perplexity`: perplexity of a text, computed as llama.cpp's perplexity tool
//! does so the numbers compare directly: the whole text is tokenized (BOS per the
//! model), cut into chunks of the context size, each chunk evaluated from an empty
//! cache with its first token replaced by BOS when the model uses one, and only the
//! second half of each chunk scored.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use wgllm::{Error, Result};

use super::common::{prompt_text, ModelArgs, Opened};

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Number of chunks to score (default: all).
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
}

/// Running negative log-likelihood sums.
#[derive(Default)]
struct Nll {
    sum: f64,
    sum2: f64,
    count: usize,
}

impl Nll {
    fn add(&mut self, log_prob: f32) {
        let nll = -(log_prob as f64);
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }

    fn ppl(&self) -> f64 {
        (self.sum / self.count.max(1) as f64).exp()
    }

    /// PPL and its standard error, as llama.cpp estimates it.
    fn estimate(&self) -> (f64, f64) {
        let n = self.count.max(1) as f64;
        let mean = self.sum / n;
        let var = self.sum2 / n - mean * mean;
        let ppl = mean.exp();
        let err = if var > 0.0 && n > 1.0 {
            (var / (n - 1.0)).sqrt() * ppl
        } else {
            0.0
        };
        (ppl, err)
    }
}

/// log p(target) of each row of `n_vocab` logits, rows split over the machine's threads
/// (a vocabulary of 262144 is 67 million exponentials a chunk) and returned in order.
fn log_probs(logits: &[f32], n_vocab: usize, targets: &[u32]) -> Vec<f32> {
    let rows: Vec<(&[f32], u32)> = logits
        .chunks_exact(n_vocab)
        .zip(targets.iter().copied())
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.len().div_ceil(threads).max(1);
    let score = |part: &[(&[f32], u32)]| -> Vec<f32> {
        part.iter()
            .map(|&(l, t)| wgllm::sampling::log_prob(l, t))
            .collect()
    };
    if threads == 1 || rows.len() < 2 {
        return score(&rows);
    }
    std::thread::scope(|s| {
        let parts: Vec<_> = rows
            .chunks(per)
            .map(|part| s.spawn(move || score(part)))
            .collect();
        // A thread that panicked panics here too, as a serial loop would have.
        parts
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

pub fn run(a: PerplexityArgs) -> Result<()> {
    let text = prompt_text(&None, &Some(a.file.clone()))?.unwrap_or_default();
    // Every step is a whole batch of a chunk (the load clamps the size to them): its
    // kernels compile with the upload.
    let mut m = Opened::new(&a.model)?.load(&a.model, true, (None, Some(usize::MAX)))?;
    let n_ctx = m.session.n_ctx() as usize;
    let tokens = m.tokenizer.encode(&text, true, false)?;
    let available = tokens.len() / n_ctx;
    if available == 0 {
        return Err(Error::invalid(format!(
            "{} tokens is less than one chunk of {n_ctx} (-c); use a longer text or a smaller -c",
            tokens.len()
        )));
    }
    let n_chunk = a.chunks.map_or(available, |c| c.min(available));
    let n_vocab = m.config.n_vocab as usize;
    let bos = if m.tokenizer.add_bos() {
        m.tokenizer.bos()
    } else {
        None
    };
    eprintln!(
        "{}: {} tokens, {n_chunk} chunks of {n_ctx}, device {}",
        a.file.display(),
        tokens.len(),
        m.device
    );
    let first = n_ctx / 2;
    let mut nll = Nll::default();
    let t0 = std::time::Instant::now();
    for i in 0..n_chunk {
        let mut chunk = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        // Row j - first holds the logits after token j, which score token j + 1.
        let logits = m.session.scored_logits(&chunk, 0, first)?;
        let targets = &tokens[i * n_ctx + first + 1..(i + 1) * n_ctx];
        for lp in log_probs(&logits, n_vocab, targets) {
            nll.add(lp);
        }
        print!("[{}]{:.4},", i + 1, nll.ppl());
        let _ = std::io::stdout().flush();
    }
    let (ppl, err) = nll.estimate();
    println!();
    println!("Final estimate: PPL = {ppl:.4} +/- {err:.5}");
    eprintln!(
        "{} tokens scored in {:.1} s ({:.1} tokens/s evaluated)",
        nll.count,
        t0.elapsed().as_secs_f64(),
        (n_chunk * n_ctx) as f64 / t0.elapsed().as_secs_f64()
    );
    Ok(())
}
