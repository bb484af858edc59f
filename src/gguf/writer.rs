//! Builds GGUF v3 files: tiny synthetic models for tests, and whole synthetic models
//! for benchmarks.
//!
//! Two APIs share one layout:
//! - [`GgufStream`] writes the header from tensor *descriptions* (name, shape, type),
//!   then takes each tensor's data in order, in chunks of any size. Nothing but the
//!   header is held in memory, so a multi-gigabyte model streams straight to disk.
//! - [`GgufWriter`] collects metadata and tensor data in memory and writes through
//!   [`GgufStream`]; tests use it to build small files, valid or not.
//!
//! Neither refuses duplicate keys or names, zero dimensions or more than four of them:
//! tests use them to build files that the reader must reject. Only each tensor's data
//! size is checked against its shape and type.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::metadata::{PackedArray, Value};
use super::reader::DEFAULT_ALIGNMENT;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// The version written.
pub const WRITE_VERSION: u32 = 3;

/// A tensor as the header describes it: name, dims in ggml order (ne0 first), type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorDesc {
    pub fn new(name: impl Into<String>, dims: &[u64], ty: GgmlType) -> TensorDesc {
        TensorDesc {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
        }
    }

    /// Bytes of data the shape takes in its type, or an error naming the tensor when the
    /// first dimension is not whole blocks or the size overflows.
    pub fn n_bytes(&self) -> Result<u64> {
        expected_bytes(&self.dims, self.ty).ok_or_else(|| {
            Error::invalid(format!(
                "tensor '{}': dims {:?} are not whole {} blocks or overflow",
                self.name, self.dims, self.ty
            ))
        })
    }
}

/// Writes a GGUF file in one pass: header first (every tensor's size is known from its
/// shape), then each tensor's data in header order, each padded to the alignment.
///
/// ```text
/// let mut s = GgufStream::create(path, &kv, &descs, DEFAULT_ALIGNMENT)?;
/// for d in &descs { while … { s.write_data(&chunk)?; } }
/// s.finish()?;
/// ```
pub struct GgufStream<W: Write> {
    w: W,
    /// Where errors say the output goes (a file path, or a placeholder for a stream).
    dest: PathBuf,
    alignment: u64,
    tensors: Vec<(String, u64)>,
    offsets: Vec<u64>,
    /// Index of the tensor being written, and how many of its bytes are written.
    current: usize,
    written: u64,
    /// Position relative to the data section start.
    pos: u64,
}

impl GgufStream<BufWriter<File>> {
    /// Creates `path` and writes the header. See [`GgufStream::new`].
    pub fn create(
        path: &Path,
        entries: &[(String, Value)],
        tensors: &[TensorDesc],
        alignment: u64,
    ) -> Result<Self> {
        let file = File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // A large buffer: tensors arrive in chunks and the file is written sequentially.
        let w = BufWriter::with_capacity(1 << 20, file);
        GgufStream::new(w, path, entries, tensors, alignment)
    }
}

impl<W: Write> GgufStream<W> {
    /// Writes the header to `w` and the padding up to the data section. `dest` names the
    /// output in error messages. `alignment` follows [`GgufWriter::with_alignment`]: a
    /// non-default value is recorded as `general.alignment` unless `entries` has that key.
    pub fn new(
        mut w: W,
        dest: impl Into<PathBuf>,
        entries: &[(String, Value)],
        tensors: &[TensorDesc],
        alignment: u64,
    ) -> Result<Self> {
        let dest = dest.into();
        let layout = alignment.max(1);
        let sizes = tensors
            .iter()
            .map(TensorDesc::n_bytes)
            .collect::<Result<Vec<u64>>>()?;
        let mut offsets = Vec::with_capacity(tensors.len());
        let mut end = 0u64;
        for (t, n) in tensors.iter().zip(&sizes) {
            let start = end.checked_next_multiple_of(layout);
            let Some((start, next)) = start.and_then(|s| Some((s, s.checked_add(*n)?))) else {
                return Err(Error::invalid(format!(
                    "tensor '{}': the data section would pass 2^64 bytes",
                    t.name
                )));
            };
            offsets.push(start);
            end = next;
        }
        let header = header(entries, tensors, &offsets, alignment);
        let pad = round_up(header.len() as u64, layout) - header.len() as u64;
        let io = |source| Error::Io {
            path: dest.clone(),
            source,
        };
        w.write_all(&header).map_err(io)?;
        write_zeros(&mut w, pad).map_err(io)?;
        Ok(GgufStream {
            w,
            dest,
            alignment: layout,
            tensors: tensors.iter().map(|t| t.name.clone()).zip(sizes).collect(),
            offsets,
            current: 0,
            written: 0,
            pos: 0,
        })
    }

    /// Appends `chunk` to the data of the current tensor (the first one not yet
    /// complete, in header order). A chunk may not run past the end of its tensor.
    pub fn write_data(&mut self, chunk: &[u8]) -> Result<()> {
        self.advance()?;
        let Some((name, size)) = self.tensors.get(self.current) else {
            return Err(Error::invalid(format!(
                "{}: {} bytes of tensor data after the last tensor",
                self.dest.display(),
                chunk.len()
            )));
        };
        let left = size - self.written;
        if chunk.len() as u64 > left {
            return Err(Error::invalid(format!(
                "{}: tensor '{name}' has {left} of its {size} bytes left, got a chunk of {}",
                self.dest.display(),
                chunk.len()
            )));
        }
        if self.written == 0 {
            self.pad_to(self.offsets[self.current])?;
        }
        self.w.write_all(chunk).map_err(|e| self.io(e))?;
        self.written += chunk.len() as u64;
        self.pos += chunk.len() as u64;
        Ok(())
    }

    /// Padding goes in when the next tensor starts, so there is none after the last
    /// one's data: every truncation of the file cuts into some tensor.
    fn pad_to(&mut self, offset: u64) -> Result<()> {
        let pad = offset.saturating_sub(self.pos);
        write_zeros(&mut self.w, pad).map_err(|e| self.io(e))?;
        self.pos += pad;
        Ok(())
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.dest.clone(),
            source,
        }
    }

    /// Moves past complete tensors. An empty one takes no chunk; its padding is still
    /// written so its offset lies within the file.
    fn advance(&mut self) -> Result<()> {
        while let Some((_, size)) = self.tensors.get(self.current) {
            if self.written < *size {
                break;
            }
            if *size == 0 {
                self.pad_to(self.offsets[self.current])?;
            }
            self.current += 1;
            self.written = 0;
        }
        Ok(())
    }

    /// The tensor the next chunk goes to, and how many of its bytes are still missing.
    pub fn pending(&self) -> Option<(&str, u64)> {
        // Tensors after `current` may be complete only if empty; skip those too.
        self.tensors[self.current.min(self.tensors.len())..]
            .iter()
            .enumerate()
            .map(|(i, (n, s))| (n, if i == 0 { s - self.written } else { *s }))
            .find(|(_, left)| *left > 0)
            .map(|(n, left)| (n.as_str(), left))
    }

    /// Bytes of data-section padding: tensors start on multiples of this.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Checks every tensor got all its bytes, flushes, and returns the writer.
    pub fn finish(mut self) -> Result<W> {
        self.advance()?;
        if let Some((name, left)) = self.pending() {
            return Err(Error::invalid(format!(
                "{}: tensor '{name}' is missing {left} bytes of data",
                self.dest.display()
            )));
        }
        self.w.flush().map_err(|e| self.io(e))?;
        Ok(self.w)
    }
}

struct PendingTensor {
    desc: TensorDesc,
    data: Vec<u8>,
}

/// Collects metadata and tensors, then writes them as one GGUF file.
pub struct GgufWriter {
    alignment: u64,
    entries: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            entries: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Lays tensor data out on multiples of `a`. Unless the caller adds its own
    /// `general.alignment`, a non-default `a` is recorded under that key. Any value is
    /// accepted (0 lays out as 1) so tests can write files with a bad alignment.
    pub fn with_alignment(mut self, a: u64) -> Self {
        self.alignment = a;
        self
    }

    /// Appends a key/value; keys are written in the order added, duplicates included.
    pub fn add(&mut self, key: &str, value: Value) -> &mut Self {
        self.entries.push((key.to_string(), value));
        self
    }

    /// Appends a tensor (`dims` in ggml order, ne0 first). `data` must be exactly the
    /// bytes the shape takes in type `ty`.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let desc = TensorDesc::new(name, dims, ty);
        let expected = desc.n_bytes()?;
        if data.len() as u64 != expected {
            return Err(Error::invalid(format!(
                "tensor '{name}': {ty} {dims:?} takes {expected} bytes, got {}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor { desc, data });
        Ok(self)
    }

    /// The whole file in memory.
    pub fn to_bytes(&self) -> Vec<u8> {
        let data_len: usize = self.tensors.iter().map(|t| t.data.len() + 64).sum();
        let mut out = Vec::with_capacity(data_len + 4096);
        // Writing to a Vec cannot fail, and add_tensor checked every size.
        let _ = self.stream_into(&mut out, "<memory>");
        out
    }

    /// Streams the file to `w`; tensor data is written straight from the buffers it was
    /// added with.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        self.stream_into(w, "<GGUF output stream>").map(drop)
    }

    pub fn write_file(&self, path: &Path) -> Result<()> {
        let file = File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        self.stream_into(BufWriter::new(file), path).map(drop)
    }

    fn stream_into<W: Write>(&self, w: W, dest: impl Into<PathBuf>) -> Result<W> {
        let descs: Vec<TensorDesc> = self.tensors.iter().map(|t| t.desc.clone()).collect();
        let mut s = GgufStream::new(w, dest, &self.entries, &descs, self.alignment)?;
        for t in self.tensors.iter().filter(|t| !t.data.is_empty()) {
            s.write_data(&t.data)?;
        }
        s.finish()
    }
}

/// Magic, counts, metadata and tensor descriptions (everything before the padding).
fn header(
    entries: &[(String, Value)],
    tensors: &[TensorDesc],
    offsets: &[u64],
    alignment: u64,
) -> Vec<u8> {
    let auto_alignment =
        alignment != DEFAULT_ALIGNMENT && !entries.iter().any(|(k, _)| k == "general.alignment");
    let mut h = Vec::new();
    h.extend_from_slice(b"GGUF");
    h.extend_from_slice(&WRITE_VERSION.to_le_bytes());
    h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    let n_kv = entries.len() + usize::from(auto_alignment);
    h.extend_from_slice(&(n_kv as u64).to_le_bytes());
    for (key, value) in entries {
        put_kv(&mut h, key, value);
    }
    if auto_alignment {
        let v = match u32::try_from(alignment) {
            Ok(a) => Value::U32(a),
            Err(_) => Value::U64(alignment),
        };
        put_kv(&mut h, "general.alignment", &v);
    }
    for (t, offset) in tensors.iter().zip(offsets) {
        put_str(&mut h, &t.name);
        h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            h.extend_from_slice(&d.to_le_bytes());
        }
        h.extend_from_slice(&(t.ty as u32).to_le_bytes());
        h.extend_from_slice(&offset.to_le_bytes());
    }
    h
}

/// Bytes a tensor of this shape and type takes; dims beyond the first multiply rows.
/// No dims at all counts as one element.
fn expected_bytes(dims: &[u64], ty: GgmlType) -> Option<u64> {
    let (ne0, rest) = match dims.split_first() {
        Some((ne0, rest)) => (*ne0, rest),
        None => (1, &[][..]),
    };
    let rows = rest.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
    ty.row_bytes(ne0)?.checked_mul(rows)
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn write_zeros(w: &mut impl Write, n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 256] = [0; 256];
    let mut left = n;
    while left > 0 {
        let k = left.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..k])?;
        left -= k as u64;
    }
    Ok(())
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_kv(h: &mut Vec<u8>, key: &str, value: &Value) {
    put_str(h, key);
    h.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
    put_value(h, value);
}

/// The value's payload (without its type id; arrays carry their element type).
fn put_value(h: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => h.push(*v),
        Value::I8(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => h.push(u8::from(*v)),
        Value::String(s) => put_str(h, s),
        Value::U64(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::Array(elem, items) => {
            h.extend_from_slice(&(*elem as u32).to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(h, item);
            }
        }
        Value::Packed(p) => {
            h.extend_from_slice(&(p.elem() as u32).to_le_bytes());
            h.extend_from_slice(&(p.len() as u64).to_le_bytes());
            match p {
                // Numbers are kept as the file encodes them.
                PackedArray::Numbers { bytes, .. } => h.extend_from_slice(bytes),
                PackedArray::Strings(s) => {
                    for item in s.iter() {
                        put_str(h, item);
                    }
                }
            }
        }
    }
}
