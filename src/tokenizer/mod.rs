//! Tokenizers that reproduce llama.cpp's tokenization of GGUF vocabularies.
//!
//! ```text
//! text ─special.rs─> [special token | raw text]* ─┬─ spm.rs  (tokenizer.ggml.model = "llama")
//!                                                 └─ bpe.rs  ("gpt2": pretokenize.rs + merges)
//! ids ──pieces (vocab.rs)──> bytes ──stream.rs──> UTF-8 text for streaming
//! ```
//!
//! - `vocab.rs`: token strings, attributes, special ids, end-of-generation set, piece text.
//! - `special.rs`: cuts control / user-defined token texts out of the input first.
//! - `pretokenize.rs`, `unicode.rs`: word splitting for byte-level BPE, code point classes.

mod bpe;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod text_index;
mod unicode;
mod vocab;

pub use stream::StreamDecoder;

use bpe::BpeModel;
use special::{partition, Fragment};
use vocab::{SpecialIds, Vocab, VocabInput, VocabKind};

use crate::gguf::Metadata;
use crate::{Error, Result};

/// The algorithm behind the vocabulary.
enum Model {
    Spm,
    Bpe(Box<BpeModel>),
}

/// A tokenizer loaded from GGUF metadata; built once, then shared read-only.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.vocab.kind)
            .field("n_vocab", &self.vocab.texts.len())
            .field("bos", &self.vocab.ids.bos)
            .field("eos", &self.vocab.ids.eos)
            .finish()
    }
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";

impl Tokenizer {
    /// Builds the tokenizer from the `tokenizer.ggml.*` keys.
    pub fn from_gguf(md: &Metadata) -> Result<Tokenizer> {
        let model = md.require_str(KEY_MODEL)?;
        let pre = md.get_str(KEY_PRE)?;
        let kind = match model {
            "llama" => VocabKind::Spm,
            "gpt2" => VocabKind::Bpe,
            other => {
                return Err(Error::Unsupported(format!(
                    "tokenizer model '{other}' ({KEY_MODEL})"
                )))
            }
        };
        let tokens = md
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| Error::Tokenizer("missing tokenizer.ggml.tokens".into()))?;
        let bpe = match kind {
            VocabKind::Bpe => {
                let merges = md
                    .get_str_array("tokenizer.ggml.merges")?
                    .ok_or_else(|| Error::Tokenizer("missing tokenizer.ggml.merges".into()))?;
                Some(BpeModel::new(&merges, pre)?)
            }
            VocabKind::Spm => None,
        };
        let default_add_bos = match kind {
            VocabKind::Spm => true,
            VocabKind::Bpe => BpeModel::default_add_bos(pre)?,
        };
        let input = VocabInput {
            kind,
            tokens,
            token_types: md.get_i32_array("tokenizer.ggml.token_type")?,
            scores: read_scores(md)?,
            special: read_special_ids(md)?,
            add_bos: md.get_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: md.get_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: md.get_bool("tokenizer.ggml.add_space_prefix")?,
            default_add_bos,
            model_name: md.get_str("general.name")?.unwrap_or("").to_lowercase(),
            pre: pre.unwrap_or("").to_string(),
            arch: md
                .get_str("general.architecture")?
                .unwrap_or("")
                .to_string(),
        };
        let vocab = Vocab::build(input)?;
        let model = match bpe {
            Some(b) => Model::Bpe(Box::new(b)),
            None => Model::Spm,
        };
        Ok(Tokenizer { vocab, model })
    }

    /// Tokenizes `text`. `add_special`: add BOS/EOS where the GGUF asks for them;
    /// `parse_special`: match control-token texts (`<|im_start|>`…) in the input.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        self.encode_bytes(text.as_bytes(), add_special, parse_special)
    }

    /// Like [`Tokenizer::encode`] for raw bytes. Invalid UTF-8 follows llama.cpp: the
    /// SentencePiece tokenizer spells such bytes with byte tokens; byte-level BPE reads each
    /// undecodable byte as U+FFFD. Input that decodes past U+10FFFF is an error.
    pub fn encode_bytes(
        &self,
        text: &[u8],
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let frags = partition(&self.vocab, text, parse_special);
        let v = &self.vocab;
        let mut out = Vec::new();
        if add_special && v.add_bos {
            out.push(
                self.bos()
                    .ok_or_else(|| Error::Tokenizer("no BOS token".into()))?,
            );
        }
        match &self.model {
            Model::Spm => {
                let mut prev_special = true;
                for f in &frags {
                    match f {
                        Fragment::Token(id) => {
                            out.push(*id);
                            prev_special = true;
                        }
                        Fragment::Text(r) => {
                            let mut t = Vec::with_capacity(r.len() + 4);
                            if v.add_space_prefix && prev_special {
                                t.push(b' ');
                            }
                            t.extend_from_slice(&text[r.clone()]);
                            spm::tokenize(v, &escape_spaces(&t), &mut out)?;
                            prev_special = false;
                        }
                    }
                }
            }
            Model::Bpe(bpe) => {
                for f in &frags {
                    match f {
                        Fragment::Token(id) => out.push(*id),
                        Fragment::Text(r) => bpe.tokenize(v, &text[r.clone()], &mut out)?,
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.push(
                self.eos()
                    .ok_or_else(|| Error::Tokenizer("no EOS token".into()))?,
            );
        }
        Ok(out)
    }

    /// The bytes a token stands for (special tokens render as their text). Empty for ids
    /// outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.vocab.pieces.get(id as usize)
    }

    /// Concatenated pieces of `ids`: the exact bytes, which need not be valid UTF-8.
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id));
        }
        out
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.texts.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.vocab.ids.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.vocab.ids.eos
    }
    /// End-of-turn token (given by the file or found by its text).
    pub fn eot(&self) -> Option<u32> {
        self.vocab.ids.eot
    }
    /// Does this token end generation (EOS, EOT, `<|im_end|>`, `<end_of_turn>`…)?
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }
    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.vocab.eog.iter().copied().collect()
    }
    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }
    /// The raw vocabulary string of a token ("" outside the vocabulary).
    pub fn token_text(&self, id: u32) -> &str {
        self.vocab.texts.get(id as usize)
    }
    /// The id whose raw vocabulary string is exactly `text`.
    pub fn find_token(&self, text: &str) -> Option<u32> {
        self.vocab.id(text.as_bytes())
    }
    /// Is this a control token (rendered only when special tokens are shown)?
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & vocab::attr::CONTROL != 0
    }
}

/// SentencePiece spells spaces as U+2581.
fn escape_spaces(t: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.len() + t.len() / 4);
    for &b in t {
        if b == b' ' {
            out.extend_from_slice("\u{2581}".as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// Scores are f32 in practice; llama.cpp also accepts i32.
fn read_scores(md: &Metadata) -> Result<Option<Vec<f32>>> {
    const KEY: &str = "tokenizer.ggml.scores";
    match md.get_f32_array(KEY) {
        Ok(s) => Ok(s),
        Err(_) => Ok(md
            .get_i32_array(KEY)?
            .map(|v| v.into_iter().map(|x| x as f32).collect())),
    }
}

fn read_special_ids(md: &Metadata) -> Result<SpecialIds> {
    let get = |k: &str| md.get_u32(&format!("tokenizer.ggml.{k}"));
    // The deprecated prefix/suffix/middle keys apply when the fim_* ones are absent.
    let fim = |new: &str, old: &str| -> Result<Option<u32>> { Ok(get(new)?.or(get(old)?)) };
    Ok(SpecialIds {
        bos: get("bos_token_id")?,
        eos: get("eos_token_id")?,
        eot: get("eot_token_id")?,
        eom: get("eom_token_id")?,
        unk: get("unknown_token_id")?,
        sep: get("seperator_token_id")?,
        pad: get("padding_token_id")?,
        mask: get("mask_token_id")?,
        fim_pre: fim("fim_pre_token_id", "prefix_token_id")?,
        fim_suf: fim("fim_suf_token_id", "suffix_token_id")?,
        fim_mid: fim("fim_mid_token_id", "middle_token_id")?,
        fim_pad: get("fim_pad_token_id")?,
        fim_rep: get("fim_rep_token_id")?,
        fim_sep: get("fim_sep_token_id")?,
    })
}
