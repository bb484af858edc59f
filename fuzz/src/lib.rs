//! Shared pieces of the fuzz targets: the real models' tokenizers (loaded once) and the
//! checks every tokenizer input goes through.

use std::path::{Path, PathBuf};

use wgllm::gguf::GgufFile;
use wgllm::tokenizer::{StreamDecoder, Tokenizer};

/// The folder with the real models: `WGLLM_MODELS` or the engine's `models/`.
fn models_dir() -> PathBuf {
    std::env::var_os("WGLLM_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../models"))
}

/// The tokenizer of the first model in `models/` whose `tokenizer.ggml.model` is `kind`
/// ("gpt2" for byte-level BPE, "llama" for SentencePiece). Panics when there is none:
/// a fuzz run without its vocabulary would test nothing.
pub fn load_tokenizer(kind: &str) -> Tokenizer {
    let dir = models_dir();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    paths.sort();
    for p in paths {
        let Ok(f) = GgufFile::open(&p) else { continue };
        if f.metadata().get_str("tokenizer.ggml.model").ok().flatten() == Some(kind) {
            return Tokenizer::from_gguf(f.metadata())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
    }
    panic!("no model with a {kind:?} tokenizer in {}", dir.display())
}

/// What decoding the encoding of valid UTF-8 text gives back.
pub enum RoundTrip {
    /// Byte-level BPE: the text, less the bytes the vocabulary has no token for (they are
    /// dropped, as llama.cpp does; SmolLM2 lacks a few control bytes). `missing[b]`.
    ByteLevel([bool; 256]),
    /// SentencePiece: the text, with U+2581 (its escaped space) read back as a space.
    SentencePiece,
}

impl RoundTrip {
    /// The bytes of a byte-level BPE vocabulary that have no single-byte token, found
    /// through GPT-2's byte-to-character table.
    pub fn byte_level(tok: &Tokenizer) -> RoundTrip {
        let mut missing = [false; 256];
        let mut shifted = 0u32;
        for b in 0u32..256 {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            let c = if printable {
                b
            } else {
                shifted += 1;
                255 + shifted
            };
            let text = char::from_u32(c).map(String::from).unwrap_or_default();
            missing[b as usize] = tok.find_token(&text).is_none();
        }
        RoundTrip::ByteLevel(missing)
    }

    fn expected(&self, text: &str) -> Vec<u8> {
        match self {
            RoundTrip::ByteLevel(missing) => {
                text.bytes().filter(|&b| !missing[b as usize]).collect()
            }
            RoundTrip::SentencePiece => text.replace('\u{2581}', " ").into_bytes(),
        }
    }
}

/// Encodes `data` with several combinations of flags and checks what holds for any
/// input: ids inside the vocabulary, streaming detokenization equal to decoding at once,
/// and for valid UTF-8 text without special parsing or added tokens, the round trip.
pub fn exercise_tokenizer(tok: &Tokenizer, data: &[u8], round_trip: &RoundTrip) {
    for (add_special, parse_special) in [(false, false), (true, true), (false, true)] {
        let ids = match tok.encode_bytes(data, add_special, parse_special) {
            Ok(ids) => ids,
            Err(_) => continue,
        };
        for &id in &ids {
            assert!(
                (id as usize) < tok.n_vocab(),
                "id {id} outside the vocabulary"
            );
            let _ = tok.token_text(id);
            let _ = tok.is_control(id);
            let _ = tok.is_eog(id);
        }
        let bytes = tok.decode(&ids);
        let mut stream = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&stream.push(tok, id));
        }
        streamed.push_str(&stream.finish());
        assert_eq!(
            streamed,
            String::from_utf8_lossy(&bytes),
            "streamed text differs from decoding at once"
        );
        if !add_special && !parse_special {
            if let Ok(text) = std::str::from_utf8(data) {
                assert!(
                    bytes == round_trip.expected(text),
                    "decode(encode(text)) is not the text: {:?}",
                    String::from_utf8_lossy(&bytes)
                );
            }
        }
    }
    // Ids from the input itself, in and out of the vocabulary.
    let ids: Vec<u32> = data
        .chunks(4)
        .map(|c| c.iter().fold(0u32, |acc, &b| (acc << 8) | b as u32))
        .collect();
    let bytes = tok.decode(&ids);
    let mut stream = StreamDecoder::new();
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&stream.push(tok, id));
    }
    streamed.push_str(&stream.finish());
    assert_eq!(streamed, String::from_utf8_lossy(&bytes));
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = tok.find_token(s);
    }
}
