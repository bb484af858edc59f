//! GGUF reader: one test per malformed case (error kind, field named in the message,
//! offset of the bad field), writer round trips, and the two real models.
//!
//! Offsets are computed by hand from the GGUF layout: magic 0..4, version 4..8,
//! n_tensors 8..16, n_kv 16..24, then key/value pairs, each `len u64 | key | type u32 | value`.

use std::path::PathBuf;

use wgllm::gguf::{GgufFile, GgufWriter, Value, ValueType};
use wgllm::quant::GgmlType;
use wgllm::Error;

// ---------------------------------------------------------------- helpers

/// F32 bytes 0.0, 1.0, 2.0, ...
fn f32_data(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect()
}

/// Bytes `seed, seed+1, ...` (wrapping) of length `n`; the reader never looks inside quant blocks.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add(i as u8)).collect()
}

/// A small model-shaped file: a few typed keys, a token array, three tensors.
fn synthetic_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()))
        .add("llama.block_count", Value::U32(2))
        .add("llama.rope.freq_base", Value::F32(10000.0))
        .add(
            "tokenizer.ggml.tokens",
            Value::Array(
                ValueType::String,
                ["<s>", "</s>", "a", "b"]
                    .iter()
                    .map(|s| Value::String(s.to_string()))
                    .collect(),
            ),
        );
    w.add_tensor("token_embd.weight", &[8, 4], GgmlType::F32, f32_data(32))
        .unwrap();
    w.add_tensor(
        "blk.0.attn_q.weight",
        &[64, 2],
        GgmlType::Q8_0,
        pattern(4 * 34, 7),
    )
    .unwrap();
    w.add_tensor("output_norm.weight", &[8], GgmlType::F32, f32_data(8))
        .unwrap();
    w
}

fn synthetic() -> Vec<u8> {
    synthetic_writer().to_bytes()
}

/// Expects a GGUF error; returns (offset, message).
fn gguf_err(bytes: Vec<u8>) -> (u64, String) {
    match GgufFile::from_bytes(bytes) {
        Err(Error::Gguf { offset, message }) => (offset, message),
        Err(other) => panic!("expected Error::Gguf, got {other:?}"),
        Ok(f) => panic!("expected an error, parsed {f:?}"),
    }
}

/// Asserts the error is at `offset` and its message contains every one of `parts`.
fn assert_err(bytes: Vec<u8>, offset: u64, parts: &[&str]) {
    let (at, msg) = gguf_err(bytes);
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
    assert_eq!(at, offset, "wrong offset for error {msg:?}");
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not in file", String::from_utf8_lossy(needle)))
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Offset of a key's value type field (the key string is found in the file).
fn key_type_at(b: &[u8], key: &str) -> usize {
    find(b, key.as_bytes()) + key.len()
}

/// Field offsets of a tensor description: (name length field, n_dims, ne[0], type, offset).
fn tensor_fields(b: &[u8], name: &str, n_dims: usize) -> (usize, usize, usize, usize, usize) {
    // Tensor names follow the metadata; search from the end so a key with the same text
    // cannot match first.
    let name_pos = b
        .windows(name.len())
        .rposition(|w| w == name.as_bytes())
        .unwrap();
    let len_at = name_pos - 8;
    let n_dims_at = name_pos + name.len();
    let ne0_at = n_dims_at + 4;
    let type_at = ne0_at + 8 * n_dims;
    (len_at, n_dims_at, ne0_at, type_at, type_at + 4)
}

// ---------------------------------------------------------------- header

#[test]
fn bad_magic() {
    let mut b = synthetic();
    b[3] = b'X';
    assert_err(b, 0, &["magic"]);
    assert_err(b"GG".to_vec(), 0, &["magic", "needs 4 bytes"]);
    assert_err(Vec::new(), 0, &["magic"]);
}

#[test]
fn unsupported_versions() {
    let mut b = synthetic();
    put_u32(&mut b, 4, 1);
    assert_err(b.clone(), 4, &["version 1", "not supported"]);
    put_u32(&mut b, 4, 4);
    assert_err(b.clone(), 4, &["unsupported version 4"]);
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert_err(b, 4, &["big-endian"]);
}

#[test]
fn version_2_is_accepted() {
    let mut b = synthetic();
    put_u32(&mut b, 4, 2);
    let f = GgufFile::from_bytes(b).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 3);
}

#[test]
fn absurd_counts() {
    let mut b = synthetic();
    put_u64(&mut b, 8, u64::MAX);
    assert_err(b, 8, &["tensor count 18446744073709551615", "exceeds"]);
    let mut b = synthetic();
    put_u64(&mut b, 16, u64::MAX - 1);
    assert_err(b, 16, &["metadata key count", "exceeds"]);
    // A count that fits the byte budget but not the contents: runs out of bytes.
    let mut b = synthetic();
    put_u64(&mut b, 16, 5);
    let (_, msg) = gguf_err(b);
    assert!(
        msg.contains("metadata key #") || msg.contains("tensor #"),
        "{msg}"
    );
}

// ---------------------------------------------------------------- metadata

#[test]
fn array_count_beyond_file() {
    let mut b = synthetic();
    let count_at = key_type_at(&b, "tokenizer.ggml.tokens") + 4 + 4;
    put_u64(&mut b, count_at, u64::MAX);
    let left = b.len() - count_at - 8;
    assert_err(
        b,
        count_at as u64,
        &[
            "metadata key #3 'tokenizer.ggml.tokens'",
            &format!("array count 18446744073709551615 exceeds the {left} bytes left"),
        ],
    );
}

#[test]
fn string_length_beyond_file() {
    let mut b = synthetic();
    let len_at = key_type_at(&b, "general.architecture") + 4;
    put_u64(&mut b, len_at, u64::MAX - 3);
    assert_err(
        b,
        len_at as u64,
        &["metadata key #0 'general.architecture'", "string length"],
    );
    // The key's own length: the first key starts at 24.
    let mut b = synthetic();
    put_u64(&mut b, 24, 1 << 40);
    assert_err(b, 24, &["metadata key #0", "key", "string length"]);
}

#[test]
fn string_item_length_inside_array() {
    let mut b = synthetic();
    // Second token "</s>": after elem type, count, and the first item (8 + 3 bytes).
    let item1_at = key_type_at(&b, "tokenizer.ggml.tokens") + 4 + 4 + 8 + 8 + 3;
    assert_eq!(get_u64(&b, item1_at), 4);
    put_u64(&mut b, item1_at, 1 << 62);
    assert_err(
        b,
        item1_at as u64,
        &["'tokenizer.ggml.tokens'", "array item #1", "string length"],
    );
}

#[test]
fn truncation_inside_metadata_and_tensor_infos() {
    let b = synthetic();
    let in_tokens = key_type_at(&b, "tokenizer.ggml.tokens") + 20;
    let (_, msg) = gguf_err(b[..in_tokens].to_vec());
    assert!(msg.contains("'tokenizer.ggml.tokens'"), "{msg}");
    let (_, _, ne0_at, _, _) = tensor_fields(&b, "output_norm.weight", 1);
    assert_err(
        b[..ne0_at + 3].to_vec(),
        ne0_at as u64,
        &[
            "tensor #2 'output_norm.weight'",
            "ne[0]",
            "needs 8 bytes but only 3",
        ],
    );
    // Too little left for the tensor table at all: the count is refused up front.
    let (_, n_dims_at, ..) = tensor_fields(&b, "blk.0.attn_q.weight", 2);
    assert_err(b[..n_dims_at].to_vec(), 8, &["tensor count 3 exceeds"]);
}

#[test]
fn unknown_value_type() {
    let mut b = synthetic();
    let type_at = key_type_at(&b, "llama.block_count");
    put_u32(&mut b, type_at, 13);
    assert_err(
        b,
        type_at as u64,
        &[
            "metadata key #1 'llama.block_count'",
            "unknown value type 13",
        ],
    );
}

#[test]
fn unknown_array_element_type() {
    let mut b = synthetic();
    let elem_at = key_type_at(&b, "tokenizer.ggml.tokens") + 4;
    put_u32(&mut b, elem_at, 99);
    assert_err(
        b,
        elem_at as u64,
        &["'tokenizer.ggml.tokens'", "unknown array element type 99"],
    );
}

#[test]
fn non_utf8_strings() {
    let mut b = synthetic();
    let s_at = key_type_at(&b, "general.architecture") + 4 + 8;
    b[s_at + 2] = 0xff; // "ll\xffma"
    assert_err(
        b,
        (s_at + 2) as u64,
        &["'general.architecture'", "not valid UTF-8"],
    );
    let mut b = synthetic();
    let name_at = find(&b, b"output_norm.weight");
    b[name_at] = 0xc3; // a lead byte followed by ASCII
    let (at, msg) = gguf_err(b);
    assert!(msg.contains("tensor #2") && msg.contains("UTF-8"), "{msg}");
    assert_eq!(at, name_at as u64);
}

#[test]
fn duplicate_metadata_key() {
    let mut w = synthetic_writer();
    w.add("llama.block_count", Value::U32(3));
    let b = w.to_bytes();
    let second = b
        .windows(17)
        .rposition(|x| x == b"llama.block_count")
        .unwrap()
        - 8;
    assert_err(
        b,
        second as u64,
        &["metadata key #4 'llama.block_count'", "duplicate"],
    );
}

#[test]
fn bad_bool() {
    let mut w = GgufWriter::new();
    w.add("x.flag", Value::Bool(true));
    let mut b = w.to_bytes();
    let at = key_type_at(&b, "x.flag") + 4;
    b[at] = 2;
    assert_err(b, at as u64, &["'x.flag'", "bool"]);
}

#[test]
fn nested_arrays_allowed_up_to_depth_limit() {
    fn nest(depth: usize) -> Value {
        let mut v = Value::Array(ValueType::U8, vec![Value::U8(1), Value::U8(2)]);
        for _ in 1..depth {
            v = Value::Array(ValueType::Array, vec![v]);
        }
        v
    }
    let mut w = GgufWriter::new();
    w.add("nested", nest(8));
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.metadata().get("nested"), Some(&nest(8)));

    let mut w = GgufWriter::new();
    w.add("nested", nest(9));
    let b = w.to_bytes();
    // The ninth array's element-type field: 24 + 8 + 6 (key) + 4 (type), then 8 × 12.
    let (at, msg) = gguf_err(b);
    assert!(
        msg.contains("'nested'") && msg.contains("nested deeper than 8"),
        "{msg}"
    );
    assert_eq!(at, (24 + 8 + 6 + 4 + 8 * 12) as u64);
}

#[test]
fn alignment_must_be_power_of_two() {
    for bad in [
        Value::U32(0),
        Value::U32(3),
        Value::U64(48),
        Value::String("32".into()),
    ] {
        let mut w = synthetic_writer();
        w.add("general.alignment", bad.clone());
        let b = w.to_bytes();
        let value_at = key_type_at(&b, "general.alignment") + 4;
        assert_err(b, value_at as u64, &["general.alignment", "power of two"]);
    }
    // with_alignment writes the key itself.
    let b = synthetic_writer().with_alignment(24).to_bytes();
    let (_, msg) = gguf_err(b);
    assert!(msg.contains("general.alignment"), "{msg}");
}

// ---------------------------------------------------------------- tensor infos

#[test]
fn duplicate_tensor_name() {
    let mut w = synthetic_writer();
    w.add_tensor("output_norm.weight", &[8], GgmlType::F32, f32_data(8))
        .unwrap();
    let b = w.to_bytes();
    let (len_at, ..) = tensor_fields(&b, "output_norm.weight", 1);
    assert_err(
        b,
        len_at as u64,
        &["tensor #3 'output_norm.weight'", "duplicate tensor name"],
    );
}

#[test]
fn n_dims_out_of_range() {
    let mut w = GgufWriter::new();
    w.add_tensor("scalar", &[], GgmlType::F32, f32_data(1))
        .unwrap();
    let b = w.to_bytes();
    let (_, n_dims_at, ..) = tensor_fields(&b, "scalar", 0);
    assert_err(b, n_dims_at as u64, &["tensor #0 'scalar'", "n_dims 0"]);

    let mut w = GgufWriter::new();
    w.add_tensor("five", &[1, 1, 1, 1, 1], GgmlType::F32, f32_data(1))
        .unwrap();
    let b = w.to_bytes();
    let (_, n_dims_at, ..) = tensor_fields(&b, "five", 5);
    assert_err(b, n_dims_at as u64, &["'five'", "n_dims 5"]);
}

#[test]
fn zero_dim_and_overflowing_product() {
    let mut w = GgufWriter::new();
    w.add_tensor("empty", &[8, 0], GgmlType::F32, Vec::new())
        .unwrap();
    let b = w.to_bytes();
    let (_, _, ne0_at, ..) = tensor_fields(&b, "empty", 2);
    assert_err(b, (ne0_at + 8) as u64, &["'empty'", "ne[1] is 0"]);

    let mut b = synthetic();
    let (_, _, ne0_at, ..) = tensor_fields(&b, "token_embd.weight", 2);
    put_u64(&mut b, ne0_at, 1 << 40);
    put_u64(&mut b, ne0_at + 8, 1 << 40);
    assert_err(
        b,
        (ne0_at + 8) as u64,
        &["'token_embd.weight'", "ne[1]", "overflows"],
    );

    // Fits u64 but not ggml's int64 element count.
    let mut b = synthetic();
    let (_, n_dims_at, ne0_at, ..) = tensor_fields(&b, "token_embd.weight", 2);
    put_u64(&mut b, ne0_at, 1 << 32);
    put_u64(&mut b, ne0_at + 8, 1 << 31);
    assert_err(b, n_dims_at as u64, &["'token_embd.weight'", "i64::MAX"]);
}

#[test]
fn unknown_tensor_type() {
    let mut b = synthetic();
    let (_, _, _, type_at, _) = tensor_fields(&b, "blk.0.attn_q.weight", 2);
    put_u32(&mut b, type_at, 99);
    assert_err(
        b,
        type_at as u64,
        &["'blk.0.attn_q.weight'", "unknown tensor type id 99"],
    );
}

#[test]
fn ne0_not_whole_blocks() {
    let mut b = synthetic();
    let (_, n_dims_at, ne0_at, ..) = tensor_fields(&b, "blk.0.attn_q.weight", 2);
    put_u64(&mut b, ne0_at, 48);
    assert_err(
        b,
        n_dims_at as u64,
        &["'blk.0.attn_q.weight'", "ne[0] = 48", "block size 32"],
    );
}

#[test]
fn misaligned_tensor_offset() {
    let mut b = synthetic();
    let (.., off_at) = tensor_fields(&b, "blk.0.attn_q.weight", 2);
    let off = get_u64(&b, off_at);
    put_u64(&mut b, off_at, off + 4);
    assert_err(
        b,
        off_at as u64,
        &[
            "'blk.0.attn_q.weight'",
            &format!("offset {}", off + 4),
            "alignment 32",
        ],
    );
}

#[test]
fn overlapping_tensors() {
    let mut b = synthetic();
    let (.., off_at) = tensor_fields(&b, "output_norm.weight", 1);
    // token_embd.weight is at relative offset 0 and takes 128 bytes; put output_norm at 96.
    put_u64(&mut b, off_at, 96);
    let (at, msg) = gguf_err(b);
    assert!(msg.contains("overlaps"), "{msg}");
    assert!(msg.contains("'output_norm.weight'") && msg.contains("'token_embd.weight'"));
    assert_eq!(at, off_at as u64);
}

#[test]
fn tensor_data_past_eof() {
    let b = synthetic();
    let f = GgufFile::from_bytes(b.clone()).unwrap();
    let last = f.tensor("output_norm.weight").unwrap().clone();
    let end = last.offset + last.n_bytes;
    assert_eq!(
        end,
        b.len() as u64,
        "the writer pads nothing after the last tensor"
    );
    let cut = b[..b.len() - 1].to_vec();
    let (.., off_at) = tensor_fields(&cut, "output_norm.weight", 1);
    assert_err(
        cut,
        off_at as u64,
        &[
            "tensor 'output_norm.weight'",
            &format!(
                "data [{}..{end}) runs past end of file (size {})",
                last.offset,
                end - 1
            ),
        ],
    );
    // Relative offset near u64::MAX: checked add, not a wrap.
    let mut b = synthetic();
    let (.., off_at) = tensor_fields(&b, "output_norm.weight", 1);
    put_u64(&mut b, off_at, u64::MAX - 31);
    assert_err(
        b,
        off_at as u64,
        &["'output_norm.weight'", "past end of file"],
    );
}

#[test]
fn data_section_past_eof() {
    let b = synthetic();
    let f = GgufFile::from_bytes(b.clone()).unwrap();
    // Cut right after the tensor descriptions, before the padding.
    let header_end = {
        let (.., off_at) = tensor_fields(&b, "output_norm.weight", 1);
        off_at + 8
    };
    assert!(header_end < f.data_offset() as usize);
    assert_err(
        b[..header_end].to_vec(),
        header_end as u64,
        &["tensor data section starts at", "past end of file"],
    );
}

// ---------------------------------------------------------------- round trips

fn every_value_type() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(-1.5e-5)),
        ("t.bool", Value::Bool(true)),
        ("t.str", Value::String("héllo ▁wörld \u{1F600}".into())),
        ("t.empty_str", Value::String(String::new())),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.empty_arr", Value::Array(ValueType::F32, vec![])),
        (
            "t.f32_arr",
            Value::Array(ValueType::F32, vec![Value::F32(0.25), Value::F32(-2.0)]),
        ),
        (
            "t.nested",
            Value::Array(
                ValueType::Array,
                vec![
                    Value::Array(ValueType::I16, vec![Value::I16(-1)]),
                    Value::Array(ValueType::String, vec![Value::String("x".into())]),
                ],
            ),
        ),
    ]
}

#[test]
fn round_trip_metadata_and_tensors() {
    for alignment in [32u64, 1, 64, 4096] {
        let mut w = GgufWriter::new().with_alignment(alignment);
        for (k, v) in every_value_type() {
            w.add(k, v);
        }
        let types = [
            (GgmlType::F32, 3u64),
            (GgmlType::F16, 5),
            (GgmlType::Q4_0, 64),
            (GgmlType::Q4_K, 256),
            (GgmlType::Q6_K, 512),
            (GgmlType::BF16, 7),
        ];
        let mut expected = Vec::new();
        for (i, (ty, ne0)) in types.iter().enumerate() {
            let dims = [*ne0, 3, 2];
            let n = ty.row_bytes(*ne0).unwrap() as usize * 6;
            let data = pattern(n, i as u8 * 31);
            let name = format!("t{i}.weight");
            w.add_tensor(&name, &dims, *ty, data.clone()).unwrap();
            expected.push((name, dims, *ty, data));
        }
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), alignment);
        assert_eq!(f.data_offset() % alignment, 0);
        let extra = usize::from(alignment != 32); // the general.alignment key
        assert_eq!(f.metadata().len(), every_value_type().len() + extra);
        for ((k, v), (fk, fv)) in every_value_type().iter().zip(f.metadata().iter()) {
            assert_eq!((*k, v), (fk, fv));
        }
        assert_eq!(f.tensors().len(), expected.len());
        for (info, (name, dims, ty, data)) in f.tensors().iter().zip(&expected) {
            assert_eq!(&info.name, name);
            assert_eq!(info.dims, dims);
            assert_eq!(info.ty, *ty);
            assert_eq!(info.n_bytes as usize, data.len());
            assert_eq!((info.offset - f.data_offset()) % alignment, 0);
            assert_eq!(f.tensor_data(info), &data[..]);
            assert_eq!(f.tensor(name), Some(info));
            assert_eq!(info.n_rows(), 6);
            assert_eq!(info.n_elements(), dims[0] * 6);
            assert_eq!(info.ne(2), 2);
            assert_eq!(info.ne(3), 1);
            assert_eq!(info.row_bytes(), ty.row_bytes(dims[0]).unwrap());
        }
        assert!(f.tensor("missing").is_none());
    }
}

#[test]
fn typed_getters_on_parsed_file() {
    let f = GgufFile::from_bytes(synthetic()).unwrap();
    let m = f.metadata();
    assert_eq!(m.architecture().unwrap(), "llama");
    assert_eq!(m.require_u32("llama.block_count").unwrap(), 2);
    assert_eq!(m.get_u64("llama.block_count").unwrap(), Some(2));
    assert_eq!(m.require_f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(
        m.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap(),
        vec!["<s>", "</s>", "a", "b"]
    );
    let e = m.require_u32("general.architecture").unwrap_err();
    assert!(
        matches!(&e, Error::Model(s) if s.contains("general.architecture") && s.contains("expected u32")),
        "{e}"
    );
    let e = m.require_f32("llama.missing").unwrap_err();
    assert!(matches!(&e, Error::Model(s) if s.contains("missing required key llama.missing")));
    assert_eq!(m.get_bool("llama.missing").unwrap(), None);
    let shown = m.get("tokenizer.ggml.tokens").unwrap().to_string();
    assert_eq!(shown, "[\"<s>\", \"</s>\", \"a\", \"b\"]");
}

#[test]
fn file_round_trip_through_mmap() {
    let dir = std::env::temp_dir().join(format!("wgllm-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    let w = synthetic_writer();
    w.write_file(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert!(f.is_mapped());
    assert_eq!(f.bytes(), &w.to_bytes()[..]);
    let mut streamed = Vec::new();
    w.write_to(&mut streamed).unwrap();
    assert_eq!(streamed, w.to_bytes());
    let t = f.tensor("token_embd.weight").unwrap();
    assert_eq!(f.tensor_data(t), &f32_data(32)[..]);

    std::fs::write(dir.join("empty.gguf"), b"").unwrap();
    assert!(matches!(
        GgufFile::open(dir.join("empty.gguf")),
        Err(Error::Gguf { offset: 0, .. })
    ));
    let e = GgufFile::open(dir.join("absent.gguf")).unwrap_err();
    assert!(matches!(&e, Error::Io { path, .. } if path.ends_with("absent.gguf")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writer_checks_data_length() {
    let mut w = GgufWriter::new();
    assert!(w
        .add_tensor("x", &[4, 2], GgmlType::F32, vec![0; 31])
        .is_err());
    assert!(w
        .add_tensor("x", &[33], GgmlType::Q8_0, vec![0; 34])
        .is_err());
    assert!(w
        .add_tensor("x", &[32], GgmlType::Q8_0, vec![0; 34])
        .is_ok());
}

#[test]
fn file_without_tensors() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("none".into()));
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert!(f.tensors().is_empty());
    assert_eq!(f.metadata().len(), 1);
}

// ---------------------------------------------------------------- real models

fn model_path(file: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(file);
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-models to download the test models",
        p.display()
    );
    p
}

/// Structural checks every real file must pass.
fn check_real(f: &GgufFile) {
    let size = f.bytes().len() as u64;
    let mut end_max = 0;
    for t in f.tensors() {
        assert!(
            t.offset >= f.data_offset() && t.offset + t.n_bytes <= size,
            "{}",
            t.name
        );
        assert_eq!(t.offset % f.alignment(), 0);
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(t.n_bytes, t.row_bytes() * t.n_rows());
        end_max = end_max.max(t.offset + t.n_bytes);
    }
    // The data section ends exactly at the end of the file in both models.
    assert_eq!(end_max, size);
}

fn f32s(bytes: &[u8], n: usize) -> Vec<f32> {
    bytes[..4 * n]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

// Expected values below were read from the files with the `gguf` Python package.

#[test]
fn real_smollm2() {
    let f = GgufFile::open(model_path("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let m = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(m.len(), 33);
    assert_eq!(m.architecture().unwrap(), "llama");
    assert_eq!(m.require_u32("llama.block_count").unwrap(), 30);
    assert_eq!(m.require_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(m.require_u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
    let eps = m
        .require_f32("llama.attention.layer_norm_rms_epsilon")
        .unwrap();
    assert!((eps - 1e-5).abs() < 1e-9);
    let tokens = m.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        &tokens[..3],
        &["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    );
    assert_eq!(tokens[49151], "ectable");
    assert_eq!(f.data_offset(), 1785664);
    assert_eq!(f.alignment(), 32);

    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, [576, 49152]);
    assert_eq!(emb.ty, GgmlType::Q8_0);
    assert_eq!((emb.offset, emb.n_bytes), (1785664, 30081024));
    let norm = f.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.offset, 98360128);
    assert_eq!(
        f32s(f.tensor_data(norm), 4),
        [1.7578125, 1.8203125, 1.78125, 1.6015625]
    );
    let counts = |ty| f.tensors().iter().filter(|t| t.ty == ty).count();
    assert_eq!((counts(GgmlType::Q4_1), counts(GgmlType::F32)), (210, 61));
    check_real(&f);
}

#[test]
fn real_gemma3() {
    let start = std::time::Instant::now();
    let f = GgufFile::open(model_path("gemma-3-270m-q4_k_m.gguf")).unwrap();
    println!("gemma-3-270m header parsed in {:?}", start.elapsed());
    let m = f.metadata();
    assert_eq!(f.tensors().len(), 236);
    assert_eq!(m.len(), 33);
    assert_eq!(m.architecture().unwrap(), "gemma3");
    assert_eq!(m.require_u32("gemma3.block_count").unwrap(), 18);
    assert_eq!(m.require_u32("tokenizer.ggml.bos_token_id").unwrap(), 2);
    let tokens = m.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 262144);
    assert_eq!(&tokens[..3], &["<pad>", "<eos>", "<bos>"]);
    assert_eq!(tokens[262143], "<unused6241>");
    assert_eq!(
        m.get_f32_array("tokenizer.ggml.scores")
            .unwrap()
            .unwrap()
            .len(),
        262144
    );
    assert_eq!(
        m.get_i32_array("tokenizer.ggml.token_type")
            .unwrap()
            .unwrap()
            .len(),
        262144
    );
    assert_eq!(f.data_offset(), 6525120);

    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, [640, 262144]);
    assert_eq!(emb.ty, GgmlType::Q8_0);
    assert_eq!((emb.offset, emb.n_bytes), (6527680, 178257920));
    let norm = f.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.offset, 6525120);
    assert_eq!(f32s(f.tensor_data(norm), 4), [7.125, 9.5625, 47.0, 145.0]);
    assert_eq!(
        f.tensors()
            .iter()
            .filter(|t| t.ty == GgmlType::Q4_K)
            .count(),
        27
    );
    check_real(&f);
}

/// Long arrays are kept packed by the reader: they read back equal to what was written,
/// through every getter, and write back out byte for byte.
#[test]
fn long_arrays_round_trip_packed() {
    let n = 300;
    let strings = Value::Array(
        ValueType::String,
        (0..n).map(|i| Value::String(format!("tök{i}"))).collect(),
    );
    let floats = Value::Array(
        ValueType::F32,
        (0..n).map(|i| Value::F32(i as f32 * 0.5)).collect(),
    );
    let ints = Value::Array(ValueType::I32, (0..n).map(|i| Value::I32(-i)).collect());
    let bools = Value::Array(
        ValueType::Bool,
        (0..n).map(|i| Value::Bool(i % 3 == 0)).collect(),
    );
    let mut w = GgufWriter::new();
    w.add("a.str", strings.clone())
        .add("a.f32", floats.clone())
        .add("a.i32", ints.clone())
        .add("a.bool", bools.clone());
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).expect("parse");
    let md = f.metadata();
    assert!(matches!(md.get("a.str"), Some(Value::Packed(_))));
    assert_eq!(md.get("a.str"), Some(&strings));
    assert_eq!(md.get("a.f32"), Some(&floats));
    assert_eq!(md.get("a.i32"), Some(&ints));
    assert_eq!(md.get("a.bool"), Some(&bools));
    let s = md.get_str_array("a.str").unwrap().unwrap();
    assert_eq!((s.len(), s[0], s[299]), (300, "tök0", "tök299"));
    assert_eq!(md.get_f32_array("a.f32").unwrap().unwrap()[3], 1.5);
    assert_eq!(md.get_i32_array("a.i32").unwrap().unwrap()[7], -7);
    assert!(
        md.get_u32_array("a.i32").is_err(),
        "negative items are not u32"
    );
    assert!(md.get_str_array("a.f32").is_err());
    let shown = md.get("a.str").unwrap().to_string();
    assert!(
        shown.starts_with("[\"tök0\", \"tök1\"") && shown.ends_with("(300 items)]"),
        "{shown}"
    );
    // Written back from the packed form, the file is the same.
    let mut w2 = GgufWriter::new();
    for (k, v) in md.iter() {
        w2.add(k, v.clone());
    }
    assert_eq!(w2.to_bytes(), bytes);
}

#[test]
fn bad_string_in_a_long_array_is_located() {
    let items = (0..300)
        .map(|i| Value::String(format!("s{i:03}")))
        .collect();
    let mut bytes = GgufWriter::new()
        .add("a.str", Value::Array(ValueType::String, items))
        .to_bytes();
    let at = find(&bytes, b"s007");
    bytes[at + 1] = 0xff;
    let (offset, msg) = gguf_err(bytes);
    assert_eq!(offset, at as u64 + 1);
    assert!(
        msg.contains("array item #7") && msg.contains("UTF-8"),
        "{msg}"
    );
}
