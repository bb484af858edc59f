//! Tokenizer checks against llama.cpp (b11434) outputs for the two real models.
//!
//! Fixtures: `tests/fixtures/tokenizer/tokenize_*.json` (copied from shared/refs), each case
//! with ids for {default BOS, no BOS} x {parse special, no parse special} and the piece text
//! of every id. The models come from `tools/fetch-models`.

use std::path::PathBuf;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use wgllm::gguf::GgufFile;
use wgllm::tokenizer::{StreamDecoder, Tokenizer};

const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn load(model: &str) -> Tokenizer {
    let path = root().join("models").join(model);
    assert!(
        path.exists(),
        "model {} is missing: run tools/fetch-models first",
        path.display()
    );
    let f = GgufFile::open(&path).expect("open model");
    Tokenizer::from_gguf(f.metadata()).expect("tokenizer")
}

fn refs(name: &str) -> Value {
    let p = root().join("tests/fixtures/tokenizer").join(name);
    let s = std::fs::read_to_string(&p).expect("fixture");
    serde_json::from_str(&s).expect("json")
}

fn hex_bytes(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Python's `bytes.decode("utf-8", "backslashreplace")`.
fn backslash_replace(mut b: &[u8]) -> String {
    let mut out = String::new();
    loop {
        match std::str::from_utf8(b) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (good, rest) = b.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap());
                let bad = e.error_len().unwrap_or(rest.len());
                for x in &rest[..bad] {
                    out.push_str(&format!("\\x{x:02x}"));
                }
                b = &rest[bad..];
            }
        }
    }
}

/// Runs every case of one refs file; returns (passed, total) checks and panics listing
/// every mismatch.
fn check_refs(fixture: &str, model: &str) {
    let tok = load(model);
    let r = refs(fixture);
    assert_eq!(
        tok.add_bos(),
        r["model_add_bos_token"].as_bool().unwrap(),
        "add_bos"
    );
    let variants = [
        ("ids_default_bos_parse_special", true, true),
        ("ids_no_bos_parse_special", false, true),
        ("ids_default_bos_no_parse_special", true, false),
        ("ids_no_bos_no_parse_special", false, false),
    ];
    let mut failures = Vec::new();
    let (mut total, mut passed) = (0, 0);
    for case in r["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let text = hex_bytes(case["utf8_hex"].as_str().unwrap());
        assert_eq!(text, case["text"].as_str().unwrap().as_bytes());
        for (key, add_special, parse_special) in variants {
            total += 1;
            let want = ids(&case[key]);
            let got = tok.encode_bytes(&text, add_special, parse_special).unwrap();
            if got == want {
                passed += 1;
            } else {
                failures.push(format!("{name}/{key}:\n  want {want:?}\n  got  {got:?}"));
            }
        }
        total += 1;
        let want: Vec<String> = case["pieces_no_bos_parse_special"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect();
        let got: Vec<String> = ids(&case["ids_no_bos_parse_special"])
            .iter()
            .map(|&id| backslash_replace(tok.token_bytes(id)))
            .collect();
        if got == want {
            passed += 1;
        } else {
            failures.push(format!("{name}/pieces:\n  want {want:?}\n  got  {got:?}"));
        }
    }
    println!("{fixture}: {passed} of {total} checks match llama.cpp");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_refs("tokenize_smollm2-135m-instruct-q4_1.json", SMOLLM);
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_refs("tokenize_gemma-3-270m-q4_k_m.json", GEMMA);
}

#[test]
fn special_ids_and_end_of_generation() {
    let s = load(SMOLLM);
    assert_eq!(s.n_vocab(), 49152);
    assert_eq!((s.bos(), s.eos(), s.add_bos()), (Some(1), Some(2), false));
    assert_eq!(s.find_token("<|im_end|>"), Some(2));
    assert_eq!(s.token_text(1), "<|im_start|>");
    assert!(
        s.is_eog(0) && s.is_eog(2),
        "<|endoftext|> and <|im_end|> end generation"
    );
    assert!(!s.is_eog(1) && !s.is_eog(504));

    let g = load(GEMMA);
    assert_eq!(g.n_vocab(), 262144);
    assert_eq!((g.bos(), g.eos(), g.add_bos()), (Some(2), Some(1), true));
    assert_eq!(g.find_token("<end_of_turn>"), Some(106));
    assert!(g.is_eog(1) && g.is_eog(106));
    assert!(!g.is_eog(105) && !g.is_eog(2));
    assert_eq!(g.token_bytes(2), b"<bos>");
    assert_eq!(g.token_bytes(u32::MAX), b"");
}

/// decode(encode(x)) == x on every fixture text, both with and without special parsing.
#[test]
fn round_trip_fixture_texts() {
    for (model, fixture) in [
        (SMOLLM, "tokenize_smollm2-135m-instruct-q4_1.json"),
        (GEMMA, "tokenize_gemma-3-270m-q4_k_m.json"),
    ] {
        let tok = load(model);
        for case in refs(fixture)["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            for parse_special in [false, true] {
                let ids = tok.encode(text, false, parse_special).unwrap();
                assert_eq!(tok.decode(&ids), text.as_bytes(), "{model}: {text:?}");
            }
        }
    }
}

/// Random text made of pieces that stress word and UTF-8 boundaries.
fn random_text(rng: &mut StdRng, valid_only: bool) -> (Vec<u8>, String) {
    const ATOMS: &[&str] = &[
        "a",
        "Z",
        "7",
        " ",
        "  ",
        "\n",
        "\t",
        "\r\n",
        "'s",
        "'LL",
        "é",
        "ß",
        "—",
        "“",
        "…",
        "日本",
        "🦀",
        "\u{0301}",
        "½",
        "<|im_start|>",
        "<start_of_turn>",
        "<end_of_turn>",
        "\n\n",
        "   ",
        ".",
        "!?",
        "$",
        "x9",
        "Ω",
        "\u{3000}",
        "\u{00A0}",
        "<",
        "|>",
    ];
    // Invalid atoms, each followed by ASCII so that no later byte completes them, with the
    // text llama.cpp's BPE reads them as (one U+FFFD per undecodable byte).
    const BAD: &[(&[u8], &str)] = &[
        (b"\x80a", "\u{FFFD}a"),
        (b"\xFFb", "\u{FFFD}b"),
        (b"\xC3c", "\u{FFFD}c"),
        (b"\xE2\x82d", "\u{FFFD}\u{FFFD}d"),
        (b"\xF0\x9F\xA6e", "\u{FFFD}\u{FFFD}\u{FFFD}e"),
    ];
    let mut bytes = Vec::new();
    let mut as_read = String::new();
    for _ in 0..rng.random_range(1..40) {
        if !valid_only && rng.random_bool(0.2) {
            let (b, s) = BAD[rng.random_range(0..BAD.len())];
            bytes.extend_from_slice(b);
            as_read.push_str(s);
        } else {
            let a = ATOMS[rng.random_range(0..ATOMS.len())];
            bytes.extend_from_slice(a.as_bytes());
            as_read.push_str(a);
        }
    }
    (bytes, as_read)
}

/// SentencePiece reads an invalid lead byte as the start of a 2-4 byte character (as
/// llama.cpp does); when that swallows an escaped space, the U+2581 bytes go out as byte
/// tokens and decode as U+2581 rather than a space. Undo that for comparison.
fn spaces_back(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with("\u{2581}".as_bytes()) {
            out.push(b' ');
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn round_trip_random_bytes() {
    let mut rng = StdRng::seed_from_u64(7);
    let smol = load(SMOLLM);
    let gemma = load(GEMMA);
    for _ in 0..300 {
        let (bytes, as_read) = random_text(&mut rng, false);
        for parse_special in [false, true] {
            // SentencePiece keeps every byte (byte-fallback tokens).
            let ids = gemma.encode_bytes(&bytes, false, parse_special).unwrap();
            assert_eq!(spaces_back(&gemma.decode(&ids)), bytes, "gemma {bytes:?}");
            // Byte-level BPE reads undecodable bytes as U+FFFD, as llama.cpp does.
            let ids = smol.encode_bytes(&bytes, false, parse_special).unwrap();
            assert_eq!(smol.decode(&ids), as_read.as_bytes(), "smollm {bytes:?}");
        }
        let (valid, _) = random_text(&mut rng, true);
        let ids = smol.encode_bytes(&valid, false, true).unwrap();
        assert_eq!(smol.decode(&ids), valid);
    }
    // Arbitrary bytes through SentencePiece, including cut multi-byte sequences.
    for _ in 0..300 {
        let n = rng.random_range(0..64);
        let bytes: Vec<u8> = (0..n).map(|_| rng.random::<u8>()).collect();
        if bytes.windows(3).any(|w| w == "\u{2581}".as_bytes()) {
            continue; // a literal U+2581 reads back as a space
        }
        let ids = gemma.encode_bytes(&bytes, false, false).unwrap();
        assert_eq!(spaces_back(&gemma.decode(&ids)), bytes);
    }
}

#[test]
fn code_points_past_unicode_are_an_error_for_bpe() {
    let smol = load(SMOLLM);
    assert!(smol
        .encode_bytes(b"ok \xF5\x80\x80\x80", false, false)
        .is_err());
}

#[test]
fn stream_decoder_releases_whole_characters() {
    let mut rng = StdRng::seed_from_u64(11);
    let gemma = load(GEMMA);
    for _ in 0..200 {
        let valid_only = rng.random_bool(0.5);
        let (bytes, _) = random_text(&mut rng, valid_only);
        let ids = gemma.encode_bytes(&bytes, false, true).unwrap();
        let mut dec = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&dec.push(&gemma, id));
        }
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, String::from_utf8_lossy(&gemma.decode(&ids)));
    }
    // A character split across byte tokens comes out once complete.
    let ids = gemma.encode("🦀", false, false).unwrap();
    let mut dec = StreamDecoder::new();
    let outs: Vec<String> = ids.iter().map(|&id| dec.push(&gemma, id)).collect();
    assert_eq!(outs.concat(), "🦀");
    assert_eq!(dec.finish(), "");
}

#[test]
fn encodes_100kb_quickly() {
    let base = "The quick brown fox — “jumps” over 1,234 lazy dogs! <|im_start|>user\n\
                Ça va? 日本語のテキスト. <start_of_turn>model\n   indented\tcode();\n";
    let text: String = base.repeat(100_000 / base.len() + 1);
    for model in [SMOLLM, GEMMA] {
        let tok = load(model);
        let t = Instant::now();
        let ids = tok.encode(&text, true, true).unwrap();
        let dt = t.elapsed();
        println!(
            "{model}: {} bytes -> {} tokens in {dt:?}",
            text.len(),
            ids.len()
        );
        assert_eq!(
            tok.decode(&ids[usize::from(tok.add_bos())..]),
            text.as_bytes()
        );
        // Generous for unoptimised test builds; release builds take a fraction of this.
        assert!(dt.as_secs_f64() < 10.0, "{model}: {dt:?}");
    }
}
