//! The vocabulary: token strings, attributes, scores, special ids and the rules llama.cpp
//! applies when it loads them (end-of-generation set, auto-detected control tokens, the
//! per-token piece text used for detokenization).

use std::collections::BTreeSet;

use super::text_index::TextIndex;
use crate::packed::{Packed, PackedStr};

use aho_corasick::AhoCorasick;
use memchr::memmem::Finder;

use super::unicode::{char_to_byte_table, cpts_from_utf8, push_utf8};
use crate::{Error, Result};

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub(crate) mod attr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;

    /// GGUF `tokenizer.ggml.token_type` value -> attribute.
    pub fn from_token_type(t: i32) -> u32 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => UNDEFINED,
        }
    }
}

/// Which tokenizer algorithm the vocab is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VocabKind {
    /// SentencePiece BPE driven by scores (`tokenizer.ggml.model = "llama"`).
    Spm,
    /// Byte-level BPE driven by ranked merges (`"gpt2"`).
    Bpe,
}

/// Special token ids as given by the GGUF (or llama.cpp's per-kind defaults).
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Everything the vocab is built from, already read out of the GGUF.
pub(crate) struct VocabInput<'a> {
    pub kind: VocabKind,
    /// Borrowed from the file's metadata: the vocab packs its own copy.
    pub tokens: Vec<&'a str>,
    pub token_types: Option<Vec<i32>>,
    pub scores: Option<Vec<f32>>,
    /// Ids from the file, before range checks; `None` = key absent.
    pub special: SpecialIds,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// Default for `add_bos` when the file does not say (depends on kind and pre-tokenizer).
    pub default_add_bos: bool,
    /// Lower-cased `general.name` and `tokenizer.ggml.pre`, for per-model attribute fixes.
    pub model_name: String,
    pub pre: String,
    pub arch: String,
}

pub(crate) struct Vocab {
    pub kind: VocabKind,
    pub texts: PackedStr,
    pub attrs: Vec<u32>,
    pub scores: Vec<f32>,
    pub text_to_id: TextIndex,
    pub ids: SpecialIds,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub eog: BTreeSet<u32>,
    /// Tokens matched in raw text before the model tokenizer runs, longest text first.
    pub special_cache: Vec<(u32, Finder<'static>)>,
    /// Finds which of `special_cache` (same order) occur in a text at all, in one pass.
    pub special_finder: Option<AhoCorasick>,
    /// Piece bytes per token (detokenization with special tokens rendered).
    pub pieces: Packed,
}

/// Selects one id field of [`SpecialIds`].
type SlotOf = fn(&mut SpecialIds) -> &mut Option<u32>;

/// Token texts that llama.cpp treats as end-of-turn when no EOT id is given.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Token texts that end generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Vocab {
    pub fn build(input: VocabInput<'_>) -> Result<Vocab> {
        let n = input.tokens.len();
        if n == 0 {
            return Err(Error::Tokenizer("the vocabulary is empty".into()));
        }
        check_len(
            "tokenizer.ggml.token_type",
            input.token_types.as_ref().map(Vec::len),
            n,
        )?;
        check_len(
            "tokenizer.ggml.scores",
            input.scores.as_ref().map(Vec::len),
            n,
        )?;

        let mut texts = PackedStr::default();
        for (i, &t) in input.tokens.iter().enumerate() {
            if t.is_empty() {
                texts.push(&format!("[EMPTY_{i}]"))?;
            } else {
                texts.push(t)?;
            }
        }
        let text_to_id = TextIndex::build(&texts)?;
        let attrs = match &input.token_types {
            Some(tt) => tt
                .iter()
                .take(n)
                .map(|&t| attr::from_token_type(t))
                .collect(),
            None => vec![attr::NORMAL; n],
        };
        let scores = match input.scores {
            Some(mut s) => {
                s.truncate(n);
                s
            }
            None => vec![0.0; n],
        };

        let mut v = Vocab {
            kind: input.kind,
            texts,
            attrs,
            scores,
            text_to_id,
            ids: resolve_ids(input.kind, &input.special, n),
            add_bos: input.add_bos.unwrap_or(input.default_add_bos),
            add_eos: input.add_eos.unwrap_or(false),
            add_space_prefix: input
                .add_space_prefix
                .unwrap_or(input.kind == VocabKind::Spm),
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
            special_finder: None,
            pieces: Packed::default(),
        };
        if v.add_bos && v.ids.bos.is_none() {
            return Err(Error::Tokenizer(
                "add_bos_token is true but there is no BOS id".into(),
            ));
        }
        if v.add_eos && v.ids.eos.is_none() {
            return Err(Error::Tokenizer(
                "add_eos_token is true but there is no EOS id".into(),
            ));
        }
        v.detect_special_by_text();
        v.mark_unused();
        v.build_eog();
        v.build_special_cache();
        let mut pieces = Packed::default();
        for i in 0..n {
            pieces.push(&v.compute_piece(i))?;
        }
        v.pieces = pieces;
        v.per_model_attrs(&input.model_name, &input.pre, &input.arch);
        Ok(v)
    }

    pub fn id(&self, text: &[u8]) -> Option<u32> {
        self.text_to_id.get(&self.texts, text)
    }

    pub fn attr(&self, id: u32) -> u32 {
        self.attrs
            .get(id as usize)
            .copied()
            .unwrap_or(attr::UNDEFINED)
    }

    fn set_attr(&mut self, id: u32, bits: u32, on: bool) {
        if let Some(a) = self.attrs.get_mut(id as usize) {
            *a = if on { *a | bits } else { *a & !bits };
        }
    }

    /// Marks a token found by its text as control (llama.cpp does so with a warning).
    fn force_control(&mut self, id: u32) {
        self.set_attr(id, attr::CONTROL, true);
    }

    /// Lowest id whose text is in `texts`.
    fn first_with_text(&self, texts: &[&str]) -> Option<u32> {
        texts.iter().filter_map(|t| self.id(t.as_bytes())).min()
    }

    /// EOT, EOM and fill-in-the-middle ids that the file did not give, found by text.
    fn detect_special_by_text(&mut self) {
        let slots: [(SlotOf, &[&str]); 8] = [
            (|s| &mut s.eot, EOT_TEXTS),
            (|s| &mut s.eom, &["<|eom_id|>"]),
            (|s| &mut s.fim_pre, FIM_PRE_TEXTS),
            (|s| &mut s.fim_suf, FIM_SUF_TEXTS),
            (|s| &mut s.fim_mid, FIM_MID_TEXTS),
            (|s| &mut s.fim_pad, FIM_PAD_TEXTS),
            (|s| &mut s.fim_rep, FIM_REP_TEXTS),
            (|s| &mut s.fim_sep, FIM_SEP_TEXTS),
        ];
        for (slot, texts) in slots {
            if slot(&mut self.ids).is_some() {
                continue;
            }
            if let Some(id) = self.first_with_text(texts) {
                *slot(&mut self.ids) = Some(id);
                self.force_control(id);
            }
        }
    }

    /// Control tokens whose text says "unused" are unused.
    fn mark_unused(&mut self) {
        for (a, t) in self.attrs.iter_mut().zip(self.texts.iter()) {
            if *a & attr::CONTROL != 0 && t.contains("unused") {
                *a |= attr::UNUSED;
            }
        }
    }

    fn build_eog(&mut self) {
        let mut eog = BTreeSet::new();
        eog.extend(
            [self.ids.fim_pad, self.ids.fim_rep, self.ids.fim_sep]
                .into_iter()
                .flatten(),
        );
        for t in EOG_TEXTS {
            if let Some(id) = self.id(t.as_bytes()) {
                eog.insert(id);
                self.force_control(id);
            }
        }
        // Tokens that chat formats render as text, never as control.
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.id(t.as_bytes()) {
                if let Some(a) = self.attrs.get_mut(id as usize) {
                    *a = attr::USER_DEFINED;
                }
            }
        }
        eog.extend(
            [self.ids.eos, self.ids.eot, self.ids.eom]
                .into_iter()
                .flatten(),
        );

        // Harmony-style vocabs end a message with <|end|> but keep generating after it.
        let in_eog = |t: &str| self.id(t.as_bytes()).is_some_and(|id| eog.contains(&id));
        let call = in_eog("<|call|>") || in_eog("<|calls|>");
        let drop_end = call && (in_eog("<|return|>") || in_eog("<|flush|>"));
        let drop_s = in_eog("<|tool_response>");
        let end_id = self.id(b"<|end|>").filter(|id| eog.contains(id));
        let s_id = self.id(b"</s>").filter(|id| eog.contains(id));
        if let (Some(end), true) = (end_id, drop_end) {
            eog.remove(&end);
            if let Some(a) = self.attrs.get_mut(end as usize) {
                *a = attr::USER_DEFINED;
            }
        }
        if let (Some(s), true) = (s_id, drop_s) {
            eog.remove(&s);
            if let Some(a) = self.attrs.get_mut(s as usize) {
                *a = attr::NORMAL;
            }
        }
        self.eog = eog;
    }

    fn build_special_cache(&mut self) {
        let mut ids: Vec<u32> = (0..self.texts.len() as u32)
            .filter(|&id| self.attr(id) & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        // Longest first; ties keep id order so the result does not depend on the sort.
        ids.sort_by_key(|&id| std::cmp::Reverse(self.texts.get(id as usize).len()));
        self.special_cache = ids
            .into_iter()
            .map(|id| {
                (
                    id,
                    Finder::new(self.texts.get(id as usize).as_bytes()).into_owned(),
                )
            })
            .collect();
        // Without this prefilter, partitioning scans for every token (slower, same result).
        self.special_finder =
            AhoCorasick::new(self.special_cache.iter().map(|(_, f)| f.needle())).ok();
    }

    /// The piece text of one token, as llama.cpp renders it with `special = true`.
    fn compute_piece(&self, i: usize) -> Vec<u8> {
        let Some(&a) = self.attrs.get(i) else {
            return Vec::new();
        };
        let text = self.texts.get(i);
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.kind {
                VocabKind::Spm => text.replace('\u{2581}', " ").into_bytes(),
                VocabKind::Bpe => byte_decode(text),
            };
        }
        if a & attr::BYTE != 0 {
            return vec![byte_token_value(text)];
        }
        Vec::new()
    }

    /// Strip flags that llama.cpp sets for a few model families.
    fn per_model_attrs(&mut self, model_name: &str, pre: &str, arch: &str) {
        let any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
        if any(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
            || any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            if let Some(id) = self.id(b"<mask>") {
                self.set_attr(id, attr::LSTRIP, true);
            }
        } else if any(model_name, &["phi-3", "phi3"]) {
            let ids: Vec<u32> = self.special_cache.iter().map(|(id, _)| *id).collect();
            for id in ids {
                self.set_attr(id, attr::RSTRIP, true);
            }
            for (t, on) in [
                ("</s>", true),
                ("<unk>", false),
                ("<s>", false),
                ("<|endoftext|>", false),
            ] {
                if let Some(id) = self.id(t.as_bytes()) {
                    self.set_attr(id, attr::RSTRIP, on);
                }
            }
        } else if any(model_name, &["modern-bert"]) {
            if let Some(id) = self.id(b"[MASK]") {
                self.set_attr(id, attr::LSTRIP, true);
            }
        }
    }
}

fn check_len(key: &str, got: Option<usize>, n: usize) -> Result<()> {
    match got {
        Some(len) if len < n => Err(Error::Tokenizer(format!(
            "{key} has {len} entries for {n} tokens"
        ))),
        _ => Ok(()),
    }
}

/// Per-kind default ids, replaced by in-range ids from the file.
fn resolve_ids(kind: VocabKind, file: &SpecialIds, n: usize) -> SpecialIds {
    let mut ids = match kind {
        VocabKind::Spm => SpecialIds {
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            ..SpecialIds::default()
        },
        VocabKind::Bpe => SpecialIds {
            bos: Some(11),
            eos: Some(11),
            ..SpecialIds::default()
        },
    };
    let pick = |default: Option<u32>, given: Option<u32>| -> Option<u32> {
        let default = default.filter(|&d| (d as usize) < n);
        match given {
            Some(g) if (g as usize) < n => Some(g),
            _ => default,
        }
    };
    ids.bos = pick(ids.bos, file.bos);
    ids.eos = pick(ids.eos, file.eos);
    ids.eot = pick(None, file.eot);
    ids.eom = pick(None, file.eom);
    ids.unk = pick(ids.unk, file.unk);
    ids.sep = pick(None, file.sep);
    ids.pad = pick(None, file.pad);
    ids.mask = pick(None, file.mask);
    ids.fim_pre = pick(None, file.fim_pre);
    ids.fim_suf = pick(None, file.fim_suf);
    ids.fim_mid = pick(None, file.fim_mid);
    ids.fim_pad = pick(None, file.fim_pad);
    ids.fim_rep = pick(None, file.fim_rep);
    ids.fim_sep = pick(None, file.fim_sep);
    ids
}

/// Bytes of a byte-level BPE token: each character maps back to the byte it stands for;
/// a character outside the table renders as `[UNK_BYTE_0x..]`, as llama.cpp does.
fn byte_decode(text: &str) -> Vec<u8> {
    thread_local! {
        static TABLE: Vec<Option<u8>> = char_to_byte_table();
    }
    TABLE.with(|table| {
        let mut out = Vec::with_capacity(text.len());
        for c in cpts_from_utf8(text.as_bytes()) {
            match table.get(c as usize).copied().flatten() {
                Some(b) => out.push(b),
                None => {
                    let mut utf8 = Vec::new();
                    // Code points of a `&str` are always in range.
                    let _ = push_utf8(&mut utf8, c);
                    out.extend_from_slice(b"[UNK_BYTE_0x");
                    for b in &utf8 {
                        out.extend_from_slice(format!("{b:02x}").as_bytes());
                    }
                    out.extend_from_slice(text.as_bytes());
                    out.push(b']');
                }
            }
        }
        out
    })
}

/// The byte a `<0xNN>` token stands for (0 when the text is not of that form).
fn byte_token_value(text: &str) -> u8 {
    text.get(3..5)
        .and_then(|h| u8::from_str_radix(h, 16).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(kind: VocabKind, tokens: &[&'a str], types: &[i32]) -> VocabInput<'a> {
        VocabInput {
            kind,
            tokens: tokens.to_vec(),
            token_types: Some(types.to_vec()),
            scores: None,
            special: SpecialIds::default(),
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            default_add_bos: false,
            model_name: String::new(),
            pre: String::new(),
            arch: String::new(),
        }
    }

    #[test]
    fn eog_and_special_cache() {
        let toks = [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<reponame>",
            "a",
            "ab",
        ];
        let mut inp = input(VocabKind::Bpe, &toks, &[3, 3, 3, 3, 1, 1]);
        inp.special.eos = Some(2);
        inp.special.bos = Some(1);
        let v = Vocab::build(inp).unwrap();
        assert_eq!(v.eog.iter().copied().collect::<Vec<_>>(), vec![0, 2, 3]);
        assert_eq!(v.ids.eot, Some(0));
        let cache: Vec<u32> = v.special_cache.iter().map(|(id, _)| *id).collect();
        assert_eq!(cache, vec![0, 1, 2, 3]);
        assert_eq!(v.pieces.get(1), b"<|im_start|>");
    }

    #[test]
    fn pieces_by_kind() {
        let toks = ["<unk>", "\u{2581}hi", "<0x0A>", "x"];
        let v = Vocab::build(input(VocabKind::Spm, &toks, &[2, 1, 6, 5])).unwrap();
        assert_eq!(v.pieces.get(1), b" hi");
        assert_eq!(v.pieces.get(2), b"\n");
        assert!(v.pieces.get(3).is_empty());
        let toks = ["\u{120}hi", "\u{10A}", "\u{C3}\u{A9}"];
        let v = Vocab::build(input(VocabKind::Bpe, &toks, &[1, 1, 1])).unwrap();
        assert_eq!(v.pieces.get(0), b" hi");
        assert_eq!(v.pieces.get(1), b"\n");
        assert_eq!(v.pieces.get(2), "é".as_bytes());
    }

    #[test]
    fn rejects_duplicates_and_short_arrays() {
        assert!(Vocab::build(input(VocabKind::Bpe, &["a", "a"], &[1, 1])).is_err());
        assert!(Vocab::build(input(VocabKind::Bpe, &["a", "b"], &[1])).is_err());
    }
}
