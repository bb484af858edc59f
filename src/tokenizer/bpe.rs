//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): pre-tokenize into words, spell each
//! word's bytes with GPT-2's printable byte characters, then repeatedly merge the adjacent
//! pair with the lowest merge rank.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::pretokenize::{pre_settings, PreTokenizer};
use super::unicode::{byte_to_char_table, utf8_len};
use super::vocab::Vocab;
use crate::Result;

pub(crate) struct BpeModel {
    /// rank of the merge "left right", looked up as `ranks[left][right]`.
    ranks: HashMap<String, HashMap<String, u32>>,
    pre: PreTokenizer,
    /// Emit a word that is itself a vocab entry without merging (Llama 3 style vocabs).
    ignore_merges: bool,
    byte_chars: [char; 256],
}

/// A pending merge; compared so that the heap yields the lowest rank, then the leftmost.
struct Bigram {
    left: usize,
    right: usize,
    rank: u32,
    /// Symbol lengths when queued: a pair whose sides changed since is stale.
    left_n: usize,
    right_n: usize,
}

impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> Ordering {
        o.rank.cmp(&self.rank).then_with(|| o.left.cmp(&self.left))
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

struct Symbol {
    prev: Option<usize>,
    next: Option<usize>,
    start: usize,
    n: usize,
}

impl BpeModel {
    /// `merges` are "left right" strings in rank order; `pre` is `tokenizer.ggml.pre`.
    pub fn new(merges: &[&str], pre: Option<&str>) -> Result<BpeModel> {
        let settings = pre_settings(pre)?;
        let mut ranks: HashMap<String, HashMap<String, u32>> = HashMap::new();
        for (rank, m) in merges.iter().enumerate() {
            // Split at the first space after the first byte (a merge may start with one).
            let (l, r) = match m.as_bytes().iter().skip(1).position(|&b| b == b' ') {
                Some(p) => (&m[..p + 1], &m[p + 2..]),
                None => ("", ""),
            };
            // The first occurrence of a pair keeps its (lower) rank.
            ranks
                .entry(l.to_string())
                .or_default()
                .entry(r.to_string())
                .or_insert(rank as u32);
        }
        Ok(BpeModel {
            ranks,
            pre: PreTokenizer::new(&settings.regexes)?,
            ignore_merges: settings.ignore_merges,
            byte_chars: byte_to_char_table(),
        })
    }

    /// Whether this pre-tokenizer turns BOS on by default.
    pub fn default_add_bos(pre: Option<&str>) -> Result<bool> {
        Ok(pre_settings(pre)?.add_bos)
    }

    fn rank(&self, l: &str, r: &str) -> Option<u32> {
        self.ranks.get(l)?.get(r).copied()
    }

    /// Tokenizes raw text (UTF-8, invalid bytes tolerated) and appends the ids to `out`.
    pub fn tokenize(&self, v: &Vocab, text: &[u8], out: &mut Vec<u32>) -> Result<()> {
        for word in self.pre.split(text)? {
            let enc: String = word.iter().map(|&b| self.byte_chars[b as usize]).collect();
            self.tokenize_word(v, &enc, out);
        }
        Ok(())
    }

    fn tokenize_word(&self, v: &Vocab, enc: &str, out: &mut Vec<u32>) {
        if enc.is_empty() {
            return;
        }
        if self.ignore_merges {
            if let Some(id) = v.id(enc.as_bytes()) {
                out.push(id);
                return;
            }
        }
        let bytes = enc.as_bytes();
        let mut syms = Vec::with_capacity(enc.len());
        let mut offs = 0;
        while offs < bytes.len() {
            let n = utf8_len(bytes[offs]).min(bytes.len() - offs);
            let i = syms.len();
            syms.push(Symbol {
                prev: i.checked_sub(1),
                next: (offs + n < bytes.len()).then_some(i + 1),
                start: offs,
                n,
            });
            offs += n;
        }
        let text = |s: &Symbol| &enc[s.start..s.start + s.n];
        let mut queue = BinaryHeap::new();
        let add =
            |syms: &[Symbol], q: &mut BinaryHeap<Bigram>, l: Option<usize>, r: Option<usize>| {
                let (Some(l), Some(r)) = (l, r) else { return };
                if let Some(rank) = self.rank(text(&syms[l]), text(&syms[r])) {
                    q.push(Bigram {
                        left: l,
                        right: r,
                        rank,
                        left_n: syms[l].n,
                        right_n: syms[r].n,
                    });
                }
            };
        for i in 1..syms.len() {
            add(&syms, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(bg) = queue.pop() {
            let (ln, rn) = (syms[bg.left].n, syms[bg.right].n);
            if ln == 0 || rn == 0 || ln != bg.left_n || rn != bg.right_n {
                continue;
            }
            syms[bg.left].n += rn;
            syms[bg.right].n = 0;
            let after = syms[bg.right].next;
            syms[bg.left].next = after;
            if let Some(a) = after {
                syms[a].prev = Some(bg.left);
            }
            add(&syms, &mut queue, syms[bg.left].prev, Some(bg.left));
            add(&syms, &mut queue, Some(bg.left), after);
        }
        let mut i = Some(0);
        while let Some(k) = i {
            let s = &syms[k];
            let piece = text(s);
            match v.id(piece.as_bytes()) {
                Some(id) => out.push(id),
                // A merge result missing from the vocab: fall back to single-byte entries,
                // dropping bytes that have none (as llama.cpp does).
                None => out.extend(piece.as_bytes().iter().filter_map(|b| v.id(&[*b]))),
            }
            i = s.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::vocab::{SpecialIds, VocabInput, VocabKind};
    use super::*;

    fn vocab(tokens: &[&str]) -> Vocab {
        Vocab::build(VocabInput {
            kind: VocabKind::Bpe,
            tokens: tokens.to_vec(),
            token_types: None,
            scores: None,
            special: SpecialIds::default(),
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            default_add_bos: false,
            model_name: String::new(),
            pre: String::new(),
            arch: String::new(),
        })
        .unwrap()
    }

    fn run(v: &Vocab, merges: &[&str], text: &str) -> Vec<String> {
        let m = BpeModel::new(merges, Some("gpt-2")).unwrap();
        let mut out = Vec::new();
        m.tokenize(v, text.as_bytes(), &mut out).unwrap();
        out.iter()
            .map(|&id| v.texts.get(id as usize).to_string())
            .collect()
    }

    #[test]
    fn lowest_rank_merges_first() {
        let v = vocab(&["a", "b", "c", "ab", "bc", "abc", "Ġ", "Ġa"]);
        assert_eq!(run(&v, &["b c", "a b", "ab c"], "abc"), ["a", "bc"]);
        assert_eq!(run(&v, &["a b", "b c", "ab c"], "abc"), ["abc"]);
        // Spaces are spelled Ġ and lead the next word.
        assert_eq!(run(&v, &["Ġ a"], "a a"), ["a", "Ġa"]);
    }

    #[test]
    fn merge_strings_split_at_first_inner_space() {
        let m = BpeModel::new(&["Ġ t", "a b c"], None).unwrap();
        assert_eq!(m.rank("Ġ", "t"), Some(0));
        assert_eq!(m.rank("a", "b c"), Some(1));
        assert_eq!(m.rank("a b", "c"), None);
    }
}
