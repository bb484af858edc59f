//! `wgllm chat`: an interactive conversation. The model's own chat template (or the
//! architecture's known one) renders the conversation; only the text past what the KV
//! cache already holds is processed each turn. Ctrl-C stops a reply, `/exit` or end of
//! input ends the session.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;
use wgllm::chat::{ChatTemplate, Message};
use wgllm::sampling::Sampler;
use wgllm::session::Keep;
use wgllm::tokenizer::StreamDecoder;
use wgllm::{Error, Result};

use super::common::{load, open, ModelArgs, SamplingArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
    /// Longest reply in tokens (-1: until end of turn or the context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    pub n_predict: i64,
}

pub fn run(a: ChatArgs) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    ctrlc::set_handler(move || s.store(true, Ordering::SeqCst))
        .map_err(|e| Error::invalid(format!("cannot install the Ctrl-C handler: {e}")))?;
    let file = open(&a.model.model)?;
    let md = file.metadata();
    let template_src = md.get_str("tokenizer.chat_template")?.map(str::to_owned);
    let arch = md.architecture()?.to_owned();
    drop(file);
    let mut m = load(&a.model, true)?;
    let (template, bos_text) = {
        let tok = &m.tokenizer;
        let text_of =
            |id: Option<u32>| id.map(|i| tok.token_text(i).to_owned()).unwrap_or_default();
        let template = ChatTemplate::with_vocab(
            template_src.as_deref(),
            &arch,
            &text_of(tok.bos()),
            &text_of(tok.eos()),
            |t| tok.find_token(t).is_some(),
        )?;
        (template, text_of(tok.bos()))
    };
    let mut sampler = Sampler::new(a.sampling.params());
    // Greedy decoding needs no logits, top-k sampling only the best k: where the output
    // layer runs on a GPU, that is all a step reads back.
    m.session.keep = Keep::for_sampler(&sampler, m.session.engine.config().n_vocab);
    let mut messages: Vec<Message> = a.system.iter().map(|s| Message::new("system", s)).collect();
    // Text whose tokens the KV cache holds.
    let mut fed = String::new();
    eprintln!(
        "device: {} — type a message; /exit to quit, Ctrl-C stops a reply",
        m.device
    );
    let mut turn = 0u32;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| Error::invalid(format!("reading input: {e}")))?;
        let line = line.trim();
        if line == "/exit" {
            break;
        }
        if line.is_empty() {
            continue;
        }
        messages.push(Message::new("user", line));
        let full = template.render(&messages, true)?;
        let ids = match full.strip_prefix(fed.as_str()) {
            Some(d) if !fed.is_empty() => m.tokenizer.encode(d, false, true)?,
            _ => {
                // Nothing cached, or the template re-rendered earlier turns differently
                // (Gemma's trims the reply's trailing newline): tokenize the whole prompt
                // and keep the part of the cache that still matches it.
                let add_bos = !(bos_text.is_empty() || full.starts_with(&bos_text));
                let all = m.tokenizer.encode(&full, add_bos, true)?;
                let same = all
                    .iter()
                    .zip(&m.session.history)
                    .take_while(|(a, b)| a == b)
                    .count()
                    // At least one token is processed, so the logits are fresh.
                    .min(all.len().saturating_sub(1));
                m.session.truncate(same as u32);
                all[same..].to_vec()
            }
        };
        let cached = m.session.n_past();
        let t0 = std::time::Instant::now();
        m.session.feed(&ids)?;
        fed = full;
        stop.store(false, Ordering::SeqCst);
        let (reply, n_gen) = generate(&mut m, &mut sampler, &a, &stop)?;
        turn += 1;
        // One line per turn: shows the cache at work (only the new text is processed)
        // and the speed, without mixing into the reply on stdout.
        eprintln!(
            "[turn {turn}: {} prompt tokens processed, {cached} from cache; {n_gen} generated; {:.1} s]",
            ids.len(),
            t0.elapsed().as_secs_f64()
        );
        fed.push_str(&reply);
        messages.push(Message::new("assistant", reply));
    }
    let t = m.session.timings;
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s",
        t.prompt_tokens,
        t.prompt_tps(),
        t.gen_tokens,
        t.gen_tps()
    );
    Ok(())
}

/// Sample a reply until end of turn, the token limit, a full context or Ctrl-C.
/// Returns the reply's text and its number of tokens.
fn generate(
    m: &mut super::common::Loaded,
    sampler: &mut Sampler,
    a: &ChatArgs,
    stop: &AtomicBool,
) -> Result<(String, i64)> {
    let tok = &m.tokenizer;
    let mut dec = StreamDecoder::new();
    let mut out = String::new();
    let mut stdout = std::io::stdout();
    let mut n = 0i64;
    loop {
        if a.n_predict >= 0 && n >= a.n_predict {
            break;
        }
        if m.session.n_past() >= m.session.n_ctx() {
            eprintln!("\n[context full]");
            break;
        }
        let id = m.session.sample(sampler);
        if tok.is_eog(id) {
            break;
        }
        let piece = dec.push(tok, id);
        out.push_str(&piece);
        let _ = stdout.write_all(piece.as_bytes());
        let _ = stdout.flush();
        m.session.push(id)?;
        n += 1;
        if stop.load(Ordering::SeqCst) {
            eprintln!("\n[interrupted]");
            break;
        }
    }
    let tail = dec.finish();
    out.push_str(&tail);
    let _ = writeln!(stdout, "{tail}");
    Ok((out, n))
}
