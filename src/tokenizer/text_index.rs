//! An index from token text to id that stores only ids, over the vocabulary's packed
//! texts ([`crate::packed`]). With it a 262k-token vocabulary (Gemma 3) takes a few MB,
//! where a heap allocation per token and per copy (text, lookup key, piece) took about
//! 45 MB and a tenth of a second to build.

use std::hash::BuildHasher;

use crate::packed::PackedStr;
use crate::{Error, Result};

/// Text -> id over a [`PackedStr`], holding only the ids (the texts stay in the table).
pub(crate) struct TextIndex {
    table: hashbrown::HashTable<u32>,
    state: std::hash::RandomState,
}

impl TextIndex {
    /// The index of `texts`; a text that occurs twice is an error naming both ids.
    pub fn build(texts: &PackedStr) -> Result<TextIndex> {
        let state = std::hash::RandomState::new();
        let hash = |s: &str| state.hash_one(s.as_bytes());
        let mut table = hashbrown::HashTable::with_capacity(texts.len());
        for (i, t) in texts.iter().enumerate() {
            let id = u32::try_from(i).map_err(|_| Error::Tokenizer("vocab too large".into()))?;
            let entry = table.entry(
                hash(t),
                |&other: &u32| texts.get(other as usize) == t,
                |&other: &u32| hash(texts.get(other as usize)),
            );
            match entry {
                hashbrown::hash_table::Entry::Occupied(prev) => {
                    return Err(Error::Tokenizer(format!(
                        "duplicate token {t:?} in vocabulary (ids {} and {id})",
                        prev.get()
                    )));
                }
                hashbrown::hash_table::Entry::Vacant(v) => {
                    v.insert(id);
                }
            }
        }
        Ok(TextIndex { table, state })
    }

    /// The id whose text is `text` in `texts` (the table the index was built from).
    pub fn get(&self, texts: &PackedStr, text: &[u8]) -> Option<u32> {
        let h = self.state.hash_one(text);
        self.table
            .find(h, |&id| texts.get(id as usize).as_bytes() == text)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        let mut t = PackedStr::default();
        for s in ["a", "", "héllo", "a b"] {
            t.push(s).unwrap();
        }
        let idx = TextIndex::build(&t).unwrap();
        assert_eq!(idx.get(&t, "héllo".as_bytes()), Some(2));
        assert_eq!(idx.get(&t, b""), Some(1));
        assert_eq!(idx.get(&t, b"h"), None);
    }

    #[test]
    fn duplicates_are_named() {
        let mut t = PackedStr::default();
        for s in ["x", "y", "x"] {
            t.push(s).unwrap();
        }
        let e = TextIndex::build(&t).err().unwrap().to_string();
        assert!(e.contains("ids 0 and 2"), "{e}");
    }
}
