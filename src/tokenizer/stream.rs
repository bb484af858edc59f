//! Incremental detokenization for streaming output: token pieces may end in the middle of a
//! UTF-8 sequence, so complete text is released only once its bytes are whole.

use super::Tokenizer;

/// Feeds token ids, returns the text that became complete. Bytes that can never form
/// valid UTF-8 are released as U+FFFD.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the piece of `id` and returns whatever complete text is now available.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tok.token_bytes(id));
        self.drain(false)
    }

    /// Releases everything still held (an unfinished sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    fn drain(&mut self, all: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, tail) = rest.split_at(e.valid_up_to());
                    // `good` was just validated.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            rest = &tail[bad..];
                        }
                        // An incomplete sequence at the end: wait for more bytes.
                        None if !all => {
                            rest = tail;
                            break;
                        }
                        None => {
                            out.push('\u{FFFD}');
                            rest = &[];
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}
