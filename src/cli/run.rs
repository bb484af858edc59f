//! `wgllm run`: generate text from a prompt, streaming it to stdout.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;
use wgllm::sampling::Sampler;
use wgllm::session::Keep;
use wgllm::tokenizer::StreamDecoder;
use wgllm::{Error, Result};

use super::common::{prompt_text, ModelArgs, Opened, SamplingArgs};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1: until end of generation or the context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    pub n_predict: i64,
    /// Print one JSON object with prompt ids, generated ids, text and timings.
    #[arg(long)]
    pub json: bool,
    /// Do not show the upload progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Set by Ctrl-C: generation stops after the current token and the stats are printed.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    // A second handler cannot be installed (e.g. in tests); then Ctrl-C just exits.
    let _ = ctrlc::set_handler(move || f.store(true, Ordering::SeqCst));
    flag
}

pub fn run(a: RunArgs) -> Result<()> {
    let text = prompt_text(&a.prompt, &a.file)?.unwrap_or_default();
    if a.n_predict < -1 {
        return Err(Error::invalid(format!(
            "-n {}: use -1 or a count",
            a.n_predict
        )));
    }
    let stop = interrupt_flag();
    // A short run decodes too few tokens to repay the chains' compilation.
    let opened = Opened::decoding(&a.model, usize::try_from(a.n_predict).ok())?;
    let tok = &opened.tokenizer;
    let mut prompt = tok.encode(&text, true, true)?;
    if prompt.is_empty() {
        // Nothing to condition on: start from BOS as llama.cpp does for an empty prompt.
        let bos = tok.bos().ok_or_else(|| {
            Error::invalid("empty prompt and the model has no BOS token to start from")
        })?;
        prompt.push(bos);
    }
    // A bounded request needs the prompt and its tokens only (and one position to spare).
    let need = usize::try_from(a.n_predict)
        .ok()
        .map(|n| prompt.len().saturating_add(n).saturating_add(1));
    let mut m = opened.load(&a.model, !a.quiet && !a.json, (need, Some(prompt.len())))?;
    let tok = &m.tokenizer;
    let n_ctx = m.session.n_ctx() as usize;
    if prompt.len() >= n_ctx {
        return Err(Error::invalid(format!(
            "the prompt is {} tokens, the context only {n_ctx}: raise -c or shorten the prompt",
            prompt.len()
        )));
    }
    let room = n_ctx - prompt.len();
    let n_gen = if a.n_predict < 0 {
        room
    } else {
        (a.n_predict as usize).min(room)
    };
    if a.n_predict >= 0 && a.n_predict as usize > room {
        eprintln!(
            "warning: -n {} exceeds the context; generating at most {room} tokens",
            a.n_predict
        );
    }
    if !a.json {
        eprintln!("device: {}", m.device);
    }
    let mut sampler = Sampler::new(a.sampling.params());
    // Greedy decoding needs no logits, top-k sampling only the best k: where the output
    // layer runs on a GPU, that is all a step reads back.
    m.session.keep = Keep::for_sampler(&sampler, m.session.engine.config().n_vocab);
    m.session.feed(&prompt)?;
    let mut out_ids = Vec::new();
    let mut dec = StreamDecoder::new();
    let mut stdout = std::io::stdout().lock();
    let mut text_out = String::new();
    for i in 0..n_gen {
        let id = m.session.sample(&mut sampler);
        if tok.is_eog(id) {
            break;
        }
        out_ids.push(id);
        let piece = dec.push(tok, id);
        if a.json {
            text_out.push_str(&piece);
        } else {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        if stop.load(Ordering::SeqCst) {
            eprintln!("\ninterrupted");
            break;
        }
        // The last token needs no forward pass: nothing samples after it.
        if i + 1 < n_gen {
            m.session.push(id)?;
        }
    }
    let tail = dec.finish();
    let t = m.session.timings;
    if a.json {
        text_out.push_str(&tail);
        let obj = serde_json::json!({
            "prompt_tokens": prompt,
            "tokens": out_ids,
            "text": text_out,
            "n_ctx": n_ctx,
            "timings": {
                "load_ms": m.load_ms,
                "prompt_tokens_per_s": t.prompt_tps(),
                "gen_tokens_per_s": t.gen_tps(),
                "prompt_ms": t.prompt_ms,
                "gen_ms": t.gen_ms,
            }
        });
        let _ = writeln!(stdout, "{obj}");
    } else {
        let _ = writeln!(stdout, "{tail}");
        eprintln!(
            "load: {:.0} ms | prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s",
            m.load_ms,
            t.prompt_tokens,
            t.prompt_tps(),
            t.gen_tokens,
            t.gen_tps()
        );
    }
    Ok(())
}
