//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`): start from UTF-8 characters,
//! repeatedly merge the adjacent pair whose concatenation is the vocab entry with the
//! highest score, and spell anything left that is not in the vocab as `<0xNN>` byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::unicode::utf8_len;
use super::vocab::Vocab;
use crate::{Error, Result};

/// A run of bytes in a doubly linked list; `n == 0` once merged into its left neighbour.
struct Symbol {
    prev: Option<usize>,
    next: Option<usize>,
    start: usize,
    n: usize,
}

/// A candidate merge of `left` and its right neighbour.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl Ord for Bigram {
    /// Highest score first; among equal scores, the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .partial_cmp(&o.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| o.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// The token for one byte: `<0xNN>`, else the one-byte string itself.
pub(crate) fn byte_token(v: &Vocab, b: u8) -> Result<u32> {
    let hex = format!("<0x{b:02X}>");
    v.id(hex.as_bytes())
        .or_else(|| v.id(&[b]))
        .ok_or_else(|| Error::Tokenizer(format!("no token for byte 0x{b:02X}")))
}

/// Tokenizes `text` (spaces already replaced by U+2581) and appends the ids to `out`.
pub(crate) fn tokenize(v: &Vocab, text: &[u8], out: &mut Vec<u32>) -> Result<()> {
    let mut syms = Vec::with_capacity(text.len());
    let mut offs = 0;
    while offs < text.len() {
        let n = utf8_len(text[offs]).min(text.len() - offs);
        let i = syms.len();
        syms.push(Symbol {
            prev: i.checked_sub(1),
            next: (offs + n < text.len()).then_some(i + 1),
            start: offs,
            n,
        });
        offs += n;
    }
    if syms.is_empty() {
        return Ok(());
    }

    let mut queue = BinaryHeap::new();
    let try_add =
        |syms: &[Symbol], queue: &mut BinaryHeap<Bigram>, l: Option<usize>, r: Option<usize>| {
            let (Some(l), Some(r)) = (l, r) else { return };
            let (a, b) = (&syms[l], &syms[r]);
            let size = a.n + b.n;
            let Some(id) = v.id(&text[a.start..a.start + size]) else {
                return;
            };
            let score = v.scores.get(id as usize).copied().unwrap_or(0.0);
            queue.push(Bigram {
                left: l,
                right: r,
                score,
                size,
            });
        };
    for i in 1..syms.len() {
        try_add(&syms, &mut queue, Some(i - 1), Some(i));
    }
    while let Some(bg) = queue.pop() {
        let (ln, rn) = (syms[bg.left].n, syms[bg.right].n);
        // Stale: one side was merged away since this pair was queued.
        if ln == 0 || rn == 0 || ln + rn != bg.size {
            continue;
        }
        syms[bg.left].n += rn;
        syms[bg.right].n = 0;
        let after = syms[bg.right].next;
        syms[bg.left].next = after;
        if let Some(a) = after {
            syms[a].prev = Some(bg.left);
        }
        try_add(&syms, &mut queue, syms[bg.left].prev, Some(bg.left));
        try_add(&syms, &mut queue, Some(bg.left), after);
    }

    let mut i = Some(0);
    while let Some(k) = i {
        let s = &syms[k];
        let piece = &text[s.start..s.start + s.n];
        match v.id(piece) {
            Some(id) => out.push(id),
            // Only single characters can be missing (merges always form vocab entries).
            None => {
                for &b in piece {
                    out.push(byte_token(v, b)?);
                }
            }
        }
        i = s.next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::vocab::{SpecialIds, VocabInput, VocabKind};
    use super::*;

    fn vocab(tokens: &[(&str, f32)]) -> Vocab {
        let mut all = vec![("<unk>".to_string(), 0.0, 2)];
        all.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
        all.extend(tokens.iter().map(|(t, s)| (t.to_string(), *s, 1)));
        Vocab::build(VocabInput {
            kind: VocabKind::Spm,
            tokens: all.iter().map(|t| t.0.as_str()).collect(),
            token_types: Some(all.iter().map(|t| t.2).collect()),
            scores: Some(all.iter().map(|t| t.1).collect()),
            special: SpecialIds::default(),
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            default_add_bos: true,
            model_name: String::new(),
            pre: String::new(),
            arch: String::new(),
        })
        .unwrap()
    }

    fn texts(v: &Vocab, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        tokenize(v, text.as_bytes(), &mut out).unwrap();
        out.iter()
            .map(|&id| v.texts.get(id as usize).to_string())
            .collect()
    }

    #[test]
    fn highest_score_merges_first() {
        // "bc" outscores "ab", so "abc" -> a + bc, not ab + c.
        let v = vocab(&[
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -2.0),
            ("bc", -1.5),
        ]);
        assert_eq!(texts(&v, "abc"), ["a", "bc"]);
        let v = vocab(&[
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -1.0),
            ("bc", -1.5),
        ]);
        assert_eq!(texts(&v, "abc"), ["ab", "c"]);
    }

    #[test]
    fn equal_scores_merge_leftmost_first() {
        let v = vocab(&[("a", -1.0), ("aa", -1.0)]);
        assert_eq!(texts(&v, "aaa"), ["aa", "a"]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let v = vocab(&[("a", -1.0)]);
        assert_eq!(texts(&v, "aé"), ["a", "<0xC3>", "<0xA9>"]);
        let mut out = Vec::new();
        tokenize(&v, b"\xFFa", &mut out).unwrap();
        assert_eq!(
            out.len(),
            2,
            "an invalid lead byte swallows up to 4 bytes as one symbol"
        );
    }
}
