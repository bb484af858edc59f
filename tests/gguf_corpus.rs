//! A hostile-file corpus for the GGUF reader.
//!
//! Starting from a synthetic model and from the real SmolLM2 header, every case truncates
//! the file or overwrites one field (lengths and counts near u64::MAX, bad type ids, bad
//! dims, moved or swapped tensor offsets). Each case must return `Err`: never panic and
//! never allocate beyond a fixed multiple of the input size. A counting allocator
//! measures the peak bytes live on the parsing thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use wgllm::gguf::{GgufFile, GgufWriter, Value, ValueType};
use wgllm::quant::GgmlType;

// ---------------------------------------------------------------- allocation meter

/// Counts bytes live per thread (tests run on several threads; each case runs on one).
struct Meter;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    // try_with: the thread-locals may already be gone while a thread shuts down.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as isize);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        track(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static METER: Meter = Meter;

// ---------------------------------------------------------------- running cases

#[derive(Default)]
struct Tally {
    cases: usize,
    panics: usize,
    accepted: usize,
    /// The first few accepted cases, for the failure message.
    accepted_names: Vec<String>,
    peak_ratio: f64,
}

impl Tally {
    /// Parses `bytes` and records the outcome; memory must stay bounded by the input size.
    fn must_fail(&mut self, what: &str, bytes: Vec<u8>) {
        let len = bytes.len();
        let base = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(base));
        let outcome = catch_unwind(AssertUnwindSafe(|| GgufFile::from_bytes(bytes).is_err()));
        let peak = (PEAK.with(Cell::get) - base).max(0) as usize;
        self.cases += 1;
        match outcome {
            Err(_) => self.panics += 1,
            Ok(false) => {
                self.accepted += 1;
                if self.accepted_names.len() < 20 {
                    self.accepted_names.push(what.to_string());
                }
            }
            Ok(true) => {}
        }
        // The input itself is live during the parse; the parse may add a bounded multiple
        // of it (a Value is 32 bytes for the fewest 1 on disk) plus a little fixed overhead.
        let limit = 40 * len + (1 << 20);
        assert!(
            peak <= limit,
            "{what}: peak {peak} bytes for a {len}-byte input"
        );
        if len >= 4096 {
            self.peak_ratio = self.peak_ratio.max(peak as f64 / len as f64);
        }
    }

    fn report(&self, name: &str) {
        println!(
            "{name}: {} hostile cases, {} panics, {} accepted, peak memory <= {:.1}x input (inputs >= 4 KiB)",
            self.cases, self.panics, self.accepted, self.peak_ratio
        );
        assert_eq!(self.panics, 0, "{name}: the parser panicked");
    }

    /// Every case must have been refused.
    fn finish(&self, name: &str) {
        self.report(name);
        assert_eq!(
            self.accepted, 0,
            "{name}: malformed files accepted: {:?}",
            self.accepted_names
        );
    }
}

// ---------------------------------------------------------------- field map

/// A header field whose corruption the reader must detect.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// u64 length of a key, string value, string array item or tensor name.
    StrLen,
    /// u64 n_tensors, n_kv or array count.
    Count,
    /// u32 value type of a key/value pair.
    ValueType,
    /// u32 element type of an array.
    ElemType,
    NDims,
    Dim,
    TensorType,
    /// u64 relative offset of a tensor's data.
    Offset,
}

#[derive(Clone, Copy, Debug)]
struct Field {
    at: usize,
    kind: Kind,
}

/// A tensor's data placement, from walking its description.
#[derive(Clone, Copy, Debug)]
struct Placed {
    offset_at: usize,
    rel: u64,
    n_bytes: u64,
}

/// Locates the header fields of a well-formed file. Long arrays are sampled (first, last
/// and every `stride`th item) so the real tokenizer arrays do not swamp the corpus.
struct Walker<'a> {
    b: &'a [u8],
    pos: usize,
    fields: Vec<Field>,
    stride: usize,
}

impl Walker<'_> {
    fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes(self.b[self.pos..self.pos + 4].try_into().unwrap());
        self.pos += 4;
        v
    }
    fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(self.b[self.pos..self.pos + 8].try_into().unwrap());
        self.pos += 8;
        v
    }
    fn mark(&mut self, kind: Kind, keep: bool) {
        if keep {
            self.fields.push(Field { at: self.pos, kind });
        }
    }
    fn string(&mut self, keep: bool) {
        self.mark(Kind::StrLen, keep);
        let n = self.u64() as usize;
        self.pos += n;
    }
    fn value(&mut self, ty: u32, keep: bool) {
        match ty {
            0 | 1 | 7 => self.pos += 1,
            2 | 3 => self.pos += 2,
            4..=6 => self.pos += 4,
            10..=12 => self.pos += 8,
            8 => self.string(keep),
            9 => {
                self.mark(Kind::ElemType, keep);
                let elem = self.u32();
                self.mark(Kind::Count, keep);
                let n = self.u64() as usize;
                for i in 0..n {
                    let sampled = i < 3 || i + 1 == n || i % self.stride == 0;
                    self.value(elem, keep && sampled);
                }
            }
            _ => panic!("walker: bad type {ty}"),
        }
    }

    /// Walks the whole header; returns the tensors' placements.
    fn walk(&mut self) -> Vec<Placed> {
        self.pos = 8;
        self.mark(Kind::Count, true);
        let n_tensors = self.u64();
        self.mark(Kind::Count, true);
        let n_kv = self.u64();
        for _ in 0..n_kv {
            self.string(true);
            self.mark(Kind::ValueType, true);
            let ty = self.u32();
            self.value(ty, true);
        }
        let mut placed = Vec::new();
        for _ in 0..n_tensors {
            self.string(true);
            self.mark(Kind::NDims, true);
            let n_dims = self.u32();
            let mut n_elements = 1;
            for _ in 0..n_dims {
                self.mark(Kind::Dim, true);
                n_elements *= self.u64();
            }
            self.mark(Kind::TensorType, true);
            let ty = GgmlType::from_id(self.u32()).unwrap();
            let offset_at = self.pos;
            self.mark(Kind::Offset, true);
            let rel = self.u64();
            let n_bytes = n_elements / ty.block_size() as u64 * ty.type_size() as u64;
            placed.push(Placed {
                offset_at,
                rel,
                n_bytes,
            });
        }
        placed
    }
}

/// Values to write into a field that no valid file can hold there.
fn hostile_values(kind: Kind) -> &'static [u64] {
    const BIG: &[u64] = &[u64::MAX, u64::MAX - 1, u64::MAX - 7, 1 << 63, 1 << 40];
    match kind {
        Kind::StrLen | Kind::Count => BIG,
        Kind::ValueType => &[13, 100, u32::MAX as u64],
        // Also an array element type of "array" with no nested data behind it.
        Kind::ElemType => &[13, u32::MAX as u64],
        Kind::NDims => &[0, 5, u32::MAX as u64],
        Kind::Dim => &[0, u64::MAX, 1 << 62],
        Kind::TensorType => &[4, 5, 16, 99, u32::MAX as u64],
        // u64::MAX - 31 is aligned, so it reaches the end-of-file check.
        Kind::Offset => &[u64::MAX, u64::MAX - 31, 1 << 62],
    }
}

fn width(kind: Kind) -> usize {
    match kind {
        Kind::StrLen | Kind::Count | Kind::Dim | Kind::Offset => 8,
        Kind::ValueType | Kind::ElemType | Kind::NDims | Kind::TensorType => 4,
    }
}

fn overwrite(b: &mut [u8], at: usize, w: usize, v: u64) {
    b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
}

/// Runs every field mutation of `fields` over `file` (a prefix `header_len` long is used).
fn mutate_fields(t: &mut Tally, file: &[u8], fields: &[Field]) {
    for f in fields {
        for &v in hostile_values(f.kind) {
            let mut b = file.to_vec();
            overwrite(&mut b, f.at, width(f.kind), v);
            t.must_fail(&format!("{:?} at {} := {v}", f.kind, f.at), b);
        }
    }
}

/// Moves tensor offsets: off by a sub-alignment amount, onto the previous tensor, and
/// swapped with the next tensor where their padded sizes differ.
fn mutate_offsets(t: &mut Tally, file: &[u8], placed: &[Placed], alignment: u64) {
    let pad = |n: u64| n.div_ceil(alignment) * alignment;
    let mut order: Vec<Placed> = placed.to_vec();
    order.sort_by_key(|p| p.rel);
    for (i, p) in order.iter().enumerate() {
        let mut b = file.to_vec();
        overwrite(&mut b, p.offset_at, 8, p.rel + alignment / 2);
        t.must_fail(&format!("offset at {} misaligned", p.offset_at), b);
        if i > 0 {
            let prev = order[i - 1];
            let mut b = file.to_vec();
            overwrite(&mut b, p.offset_at, 8, prev.rel);
            t.must_fail(&format!("offset at {} onto previous", p.offset_at), b);
        }
        if let Some(next) = order.get(i + 1) {
            if pad(p.n_bytes) != pad(next.n_bytes) {
                let mut b = file.to_vec();
                overwrite(&mut b, p.offset_at, 8, next.rel);
                overwrite(&mut b, next.offset_at, 8, p.rel);
                t.must_fail(
                    &format!("offsets at {} and {} swapped", p.offset_at, next.offset_at),
                    b,
                );
            }
        }
    }
}

// ---------------------------------------------------------------- synthetic model

fn synthetic() -> Vec<u8> {
    let mut w = GgufWriter::new();
    let tokens: Vec<Value> = (0..40).map(|i| Value::String(format!("tok{i}"))).collect();
    w.add("general.architecture", Value::String("llama".into()))
        .add("general.name", Value::String("tiny ▁model".into()))
        .add("llama.block_count", Value::U32(2))
        .add("llama.context_length", Value::U64(128))
        .add("llama.rope.freq_base", Value::F32(10000.0))
        .add("llama.attention.layer_norm_rms_epsilon", Value::F64(1e-5))
        .add("llama.flag", Value::Bool(true))
        .add("llama.small", Value::I8(-3))
        .add("llama.mid", Value::I16(-300))
        .add("llama.u16", Value::U16(300))
        .add("llama.neg", Value::I64(-5))
        .add(
            "llama.heads",
            Value::Array(ValueType::U32, vec![Value::U32(4), Value::U32(2)]),
        )
        .add(
            "tokenizer.ggml.tokens",
            Value::Array(ValueType::String, tokens),
        )
        .add(
            "tokenizer.ggml.scores",
            Value::Array(
                ValueType::F32,
                (0..40).map(|i| Value::F32(i as f32)).collect(),
            ),
        )
        .add(
            "x.nested",
            Value::Array(
                ValueType::Array,
                vec![
                    Value::Array(ValueType::U8, vec![Value::U8(1)]),
                    Value::Array(ValueType::String, vec![Value::String("s".into())]),
                ],
            ),
        );
    let tensors: [(&str, &[u64], GgmlType); 6] = [
        ("token_embd.weight", &[64, 40], GgmlType::Q8_0),
        ("blk.0.attn_norm.weight", &[64], GgmlType::F32),
        ("blk.0.attn_q.weight", &[256, 2, 1], GgmlType::Q4_K),
        ("blk.0.ffn_up.weight", &[32, 3, 2, 1], GgmlType::Q4_1),
        ("blk.1.attn_k.weight", &[256, 1], GgmlType::Q6_K),
        ("output_norm.weight", &[5], GgmlType::F16),
    ];
    for (i, (name, dims, ty)) in tensors.iter().enumerate() {
        let rows: u64 = dims[1..].iter().product();
        let n = (ty.row_bytes(dims[0]).unwrap() * rows) as usize;
        let data = (0..n).map(|j| (j * 7 + i) as u8).collect();
        w.add_tensor(name, dims, *ty, data).unwrap();
    }
    w.to_bytes()
}

#[test]
fn synthetic_corpus() {
    let file = synthetic();
    let parsed = GgufFile::from_bytes(file.clone()).expect("the base file is valid");
    let mut walker = Walker {
        b: &file,
        pos: 0,
        fields: Vec::new(),
        stride: 1,
    };
    let placed = walker.walk();
    assert_eq!(placed.len(), parsed.tensors().len());
    let mut t = Tally::default();

    // Every truncation: the last tensor ends exactly at the end of the file.
    for len in 0..file.len() {
        t.must_fail(&format!("truncated to {len}"), file[..len].to_vec());
    }
    mutate_fields(&mut t, &file, &walker.fields);
    mutate_offsets(&mut t, &file, &placed, parsed.alignment());
    // Bad magic and versions.
    for (at, v) in [
        (0usize, 0u32),
        (4, 0),
        (4, 1),
        (4, 4),
        (4, 3u32.swap_bytes()),
        (4, u32::MAX),
    ] {
        let mut b = file.clone();
        overwrite(&mut b, at, 4, v as u64);
        t.must_fail(&format!("u32 at {at} := {v}"), b);
    }
    t.finish("synthetic");

    // Brute force: every byte of the header set to 0xff, every 8-byte window to u64::MAX,
    // every 4-byte window to 0x8000_0000. Some of these still describe a valid file (a
    // changed f32 value), so this sweep asserts only: no panic, bounded memory.
    let header_end = walker.pos;
    let mut sweep = Tally::default();
    for at in 0..header_end {
        for (w, v) in [(1usize, 0xffu64), (8, u64::MAX), (4, 0x8000_0000)] {
            if at + w <= file.len() {
                let mut b = file.clone();
                overwrite(&mut b, at, w, v);
                sweep.must_fail("sweep", b);
            }
        }
    }
    sweep.report("synthetic byte sweep");
}

// ---------------------------------------------------------------- real model header

fn smollm2_header() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run tools/fetch-models to download the test models",
        path.display()
    );
    let f = GgufFile::open(&path).unwrap();
    f.bytes()[..f.data_offset() as usize].to_vec()
}

/// The real header alone (no tensor data) always fails the end-of-file check, so each
/// case must fail; corrupting it exercises every parse path before that check.
#[test]
fn smollm2_header_corpus() {
    let start = std::time::Instant::now();
    let header = smollm2_header();
    let mut t = Tally::default();

    // Truncations: every offset in the first 32 KiB (the counts, the general.* keys and
    // the start of the token array), then a stride up to the data section. Each case
    // parses everything before its cut, so the stride keeps the debug-build runtime low.
    let dense = 32 << 10;
    let mut cuts: Vec<usize> = (0..dense.min(header.len())).collect();
    cuts.extend((dense..header.len()).step_by(16381));
    for len in cuts {
        t.must_fail(&format!("truncated to {len}"), header[..len].to_vec());
    }

    // Metadata fields, with long arrays sampled every 4999th item.
    let mut walker = Walker {
        b: &header,
        pos: 0,
        fields: Vec::new(),
        stride: 4999,
    };
    let placed = walker.walk();
    assert_eq!(placed.len(), 272);
    assert_eq!(
        walker.pos.div_ceil(32) * 32,
        header.len(),
        "header end, aligned"
    );
    let first_tensor = placed[0].offset_at;
    let (meta, tensor): (Vec<Field>, Vec<Field>) =
        walker.fields.iter().partition(|f| f.at < first_tensor - 64);
    mutate_fields(&mut t, &header, &meta);
    // Tensor descriptions: each case parses the whole metadata first, so only the first
    // two and last two tensors' fields are corrupted.
    let last_two = placed[placed.len() - 3].offset_at;
    let sample: Vec<Field> = tensor
        .into_iter()
        .filter(|f| f.at <= placed[1].offset_at || f.at > last_two)
        .collect();
    mutate_fields(&mut t, &header, &sample);
    mutate_offsets(&mut t, &header, &placed[..4], 32);
    t.finish("smollm2 header");
    println!("smollm2 header corpus took {:?}", start.elapsed());
}
