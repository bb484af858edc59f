//! Special-token partitioning: before the model tokenizer runs, the texts of control,
//! user-defined and unknown tokens are cut out of the raw input and become tokens directly.
//!
//! Tokens are tried one at a time, longest text first; each one splits every remaining
//! text fragment at all of its non-overlapping occurrences, left to right. With
//! `parse_special` off, control and unknown tokens are skipped but user-defined ones still
//! apply (they are part of the vocabulary's pre-tokenization, as in Hugging Face's
//! tokenizers).

use std::ops::Range;

use super::vocab::{attr, Vocab};

/// A piece of the input: a token already decided, or raw text still to tokenize.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Token(u32),
    Text(Range<usize>),
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Splits `text` into special-token and raw-text fragments.
pub(crate) fn partition(v: &Vocab, text: &[u8], parse_special: bool) -> Vec<Fragment> {
    if text.is_empty() {
        return Vec::new();
    }
    // Fragments are substrings of `text`, so a token absent from it never matters: find the
    // present ones in one pass, then run the ordered splitting on those alone.
    let present = present_specials(v, text);
    let mut frags = vec![Fragment::Text(0..text.len())];
    for (k, (id, finder)) in v.special_cache.iter().enumerate() {
        if !present.get(k).copied().unwrap_or(true) {
            continue;
        }
        let a = v.attr(*id);
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        if !frags.iter().any(|f| matches!(f, Fragment::Text(_))) {
            break;
        }
        let mut next = Vec::with_capacity(frags.len());
        for f in frags {
            match f {
                Fragment::Token(_) => next.push(f),
                Fragment::Text(r) => split_one(text, r, *id, finder, a, &mut next),
            }
        }
        frags = next;
    }
    frags
}

/// For each entry of the special cache: does its text occur anywhere in `text`?
fn present_specials(v: &Vocab, text: &[u8]) -> Vec<bool> {
    let Some(ac) = &v.special_finder else {
        return vec![true; v.special_cache.len()];
    };
    let mut present = vec![false; v.special_cache.len()];
    for m in ac.find_overlapping_iter(text) {
        if let Some(p) = present.get_mut(m.pattern().as_usize()) {
            *p = true;
        }
    }
    present
}

/// Cuts every occurrence of one special token out of one text fragment.
fn split_one(
    text: &[u8],
    r: Range<usize>,
    id: u32,
    finder: &memchr::memmem::Finder<'_>,
    a: u32,
    out: &mut Vec<Fragment>,
) {
    let pat_len = finder.needle().len();
    let (mut base, end) = (r.start, r.end);
    while base < end {
        let Some(off) = finder.find(&text[base..end]) else {
            out.push(Fragment::Text(base..end));
            return;
        };
        let m = base + off;
        let mut left_end = m;
        if a & attr::LSTRIP != 0 {
            while left_end > base && is_c_space(text[left_end - 1]) {
                left_end -= 1;
            }
        }
        if left_end > base {
            out.push(Fragment::Text(base..left_end));
        }
        out.push(Fragment::Token(id));
        base = m + pat_len;
        if a & attr::RSTRIP != 0 {
            while base < end && is_c_space(text[base]) {
                base += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::vocab::{SpecialIds, VocabInput, VocabKind};
    use super::*;

    fn vocab(tokens: &[&str], types: &[i32], name: &str) -> Vocab {
        Vocab::build(VocabInput {
            kind: VocabKind::Bpe,
            tokens: tokens.to_vec(),
            token_types: Some(types.to_vec()),
            scores: None,
            special: SpecialIds::default(),
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            default_add_bos: false,
            model_name: name.into(),
            pre: String::new(),
            arch: String::new(),
        })
        .unwrap()
    }

    fn show(text: &str, frags: &[Fragment]) -> Vec<String> {
        frags
            .iter()
            .map(|f| match f {
                Fragment::Token(id) => format!("#{id}"),
                Fragment::Text(r) => text[r.clone()].to_string(),
            })
            .collect()
    }

    #[test]
    fn longest_first_and_user_defined_always() {
        // 0: control "<s>", 1: control "<s>x" (longer, wins), 2: user-defined "\n\n", 3: normal.
        let v = vocab(&["<s>", "<s>x", "\n\n", "a"], &[3, 3, 4, 1], "");
        let t = "a<s>x<s>\n\n\nb";
        assert_eq!(
            show(t, &partition(&v, t.as_bytes(), true)),
            ["a", "#1", "#0", "#2", "\nb"]
        );
        assert_eq!(
            show(t, &partition(&v, t.as_bytes(), false)),
            ["a<s>x<s>", "#2", "\nb"]
        );
        assert!(partition(&v, b"", true).is_empty());
    }

    #[test]
    fn rstrip_for_phi3_family() {
        let v = vocab(&["<|end|>", "a"], &[3, 1], "phi-3-mini");
        let t = "a<|end|>  \n b";
        assert_eq!(
            show(t, &partition(&v, t.as_bytes(), true)),
            ["a", "#0", "b"]
        );
    }
}
