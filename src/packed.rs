//! Many short strings packed one after another in one buffer, indexed by position: a
//! tokenizer's 262k token texts (and their pieces), or a GGUF array of them, take one
//! allocation instead of one per string.

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
    u32::try_from(len).map_err(|_| Error::invalid("packed strings exceed 4 GiB"))
}

/// Byte strings, indexed by position.
#[derive(Clone, Debug, Default)]
pub struct Packed {
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
#[derive(Clone, Debug, Default)]
pub struct PackedStr {
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

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items() {
        let mut t = PackedStr::default();
        for s in ["a", "", "héllo", "a b"] {
            t.push(s).unwrap();
        }
        assert_eq!(t.len(), 4);
        assert_eq!(t.iter().collect::<Vec<_>>(), ["a", "", "héllo", "a b"]);
        assert_eq!(t.get(9), "");
        let mut b = Packed::default();
        b.push(&[0xff, 0]).unwrap();
        b.push(b"").unwrap();
        assert_eq!(b.get(0), [0xff, 0]);
        assert_eq!(b.get(1), b"");
        assert_eq!(b.get(2), b"");
    }
}
