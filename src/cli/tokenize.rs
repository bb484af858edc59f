//! `wgllm tokenize`: text to ids, as llama.cpp's tokenizer tool prints them.

use std::path::PathBuf;

use clap::Args;
use wgllm::tokenizer::Tokenizer;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Read the text from this file (exact bytes).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Do not add BOS even if the model asks for it.
    #[arg(long)]
    pub no_bos: bool,
    /// Tokenize special-token text (e.g. <|im_start|>) as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Print a JSON array of ids.
    #[arg(long)]
    pub json: bool,
    /// The text (when no -f).
    pub text: Option<String>,
}

pub fn run(a: TokenizeArgs) -> wgllm::Result<()> {
    let text = super::common::prompt_text(&a.text, &a.file)?
        .ok_or_else(|| wgllm::Error::invalid("no text: give TEXT or -f FILE"))?;
    let file = super::common::open(&a.model)?;
    let tok = Tokenizer::from_gguf(file.metadata())?;
    let ids = tok.encode(&text, !a.no_bos, !a.no_parse_special)?;
    if a.json {
        println!("{}", serde_json::to_string(&ids).unwrap_or_default());
    } else {
        for id in ids {
            let piece = String::from_utf8_lossy(tok.token_bytes(id));
            println!("{id:>6} -> '{piece}'");
        }
    }
    Ok(())
}
