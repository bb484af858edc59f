//! The vocabulary's strings packed one after another in one buffer (token texts, piece
//! bytes), and an index from text to id that stores only ids. A 262k-token vocabulary
//! (Gemma 3) then takes a few MB, where a heap allocation per token and per copy (text,
//! lookup key, piece) took about 45 MB and a tenth of a second to build.

use std::hash::BuildHasher;
use std::ops::Range;

use crate::{Error, Result};

/// Where item `i` lies in a buffer whose items end at `ends`.
fn item(ends: &[u32], i: usize) -> Option<Range<usize>> {
    let end = *ends.get(i)? as usize;
    let start = match i {
        0 => 0,
        _ => ends[i - 1] as usize,
    };
    Some(start..end)
}

/// The end offset of an item appended to `len` bytes, or an error past 4 GiB.
fn next_end(len: usize) -> Result<u32> {
    u32::try_from(len).map_err(|_| Error::Tokenizer("vocabulary text exceeds 4 GiB".into()))
}

/// Byte strings, indexed by position.
#[derive(Default)]
pub(crate) struct Packed {
    buf: Vec<u8>,
    ends: Vec<u32>,
}

impl Packed {
    pub fn push(&mut self, s: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(s);
        self.ends.push(next_end(self.buf.len())?);
        Ok(())
    }

    /// Item `i`; empty past the end.
    pub fn get(&self, i: usize) -> &[u8] {
        item(&self.ends, i)
            .and_then(|r| self.buf.get(r))
            .unwrap_or_default()
    }
}

/// UTF-8 strings, indexed by position.
#[derive(Default)]
pub(crate) struct PackedStr {
    buf: String,
    ends: Vec<u32>,
}

impl PackedStr {
    pub fn push(&mut self, s: &str) -> Result<()> {
        self.buf.push_str(s);
        self.ends.push(next_end(self.buf.len())?);
        Ok(())
    }

    /// Item `i`; empty past the end.
    pub fn get(&self, i: usize) -> &str {
        item(&self.ends, i)
            .and_then(|r| self.buf.get(r))
            .unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

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
    fn items_and_lookups() {
        let mut t = PackedStr::default();
        for s in ["a", "", "héllo", "a b"] {
            t.push(s).unwrap();
        }
        assert_eq!(t.len(), 4);
        assert_eq!(t.iter().collect::<Vec<_>>(), ["a", "", "héllo", "a b"]);
        assert_eq!(t.get(9), "");
        let idx = TextIndex::build(&t).unwrap();
        assert_eq!(idx.get(&t, "héllo".as_bytes()), Some(2));
        assert_eq!(idx.get(&t, b""), Some(1));
        assert_eq!(idx.get(&t, b"h"), None);
        let mut b = Packed::default();
        b.push(&[0xff, 0]).unwrap();
        b.push(b"").unwrap();
        assert_eq!(b.get(0), [0xff, 0]);
        assert_eq!(b.get(1), b"");
        assert_eq!(b.get(2), b"");
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
