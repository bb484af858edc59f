//! Builds GGUF v3 files: tiny synthetic models for tests and tools.
//!
//! The writer lays out what it is given and checks only that each tensor's data matches
//! its shape and type. It does not refuse duplicate keys or names, zero dimensions or more
//! than four of them: tests use it to build files that the reader must reject.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::metadata::Value;
use super::reader::DEFAULT_ALIGNMENT;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// The version written.
pub const WRITE_VERSION: u32 = 3;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
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
        let expected = expected_bytes(dims, ty).ok_or_else(|| {
            Error::invalid(format!(
                "tensor '{name}': dims {dims:?} are not whole {ty} blocks or overflow"
            ))
        })?;
        if data.len() as u64 != expected {
            return Err(Error::invalid(format!(
                "tensor '{name}': {ty} {dims:?} takes {expected} bytes, got {}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(self)
    }

    /// The whole file in memory.
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = self.header();
        let data_len: usize = self.tensors.iter().map(|t| t.data.len() + 64).sum();
        let mut out = Vec::with_capacity(header.len() + data_len);
        // Writing to a Vec cannot fail.
        let _ = self.write_parts(&header, &mut out);
        out
    }

    /// Streams the file to `w`: the header is built in memory, tensor data is written
    /// straight from the buffers it was added with.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        let header = self.header();
        self.write_parts(&header, w).map_err(|source| Error::Io {
            path: PathBuf::from("<GGUF output stream>"),
            source,
        })
    }

    pub fn write_file(&self, path: &Path) -> Result<()> {
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::create(path).map_err(io_err)?;
        let mut w = BufWriter::new(file);
        let header = self.header();
        self.write_parts(&header, &mut w).map_err(io_err)?;
        w.flush().map_err(io_err)
    }

    fn layout_alignment(&self) -> u64 {
        self.alignment.max(1)
    }

    /// Relative offset of each tensor's data: packed in order, each start aligned.
    fn tensor_offsets(&self) -> Vec<u64> {
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut end = 0u64;
        for t in &self.tensors {
            let start = round_up(end, self.layout_alignment());
            offsets.push(start);
            end = start + t.data.len() as u64;
        }
        offsets
    }

    /// Magic, counts, metadata and tensor descriptions (everything before the padding).
    fn header(&self) -> Vec<u8> {
        let auto_alignment = self.alignment != DEFAULT_ALIGNMENT
            && !self.entries.iter().any(|(k, _)| k == "general.alignment");
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&WRITE_VERSION.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        let n_kv = self.entries.len() + usize::from(auto_alignment);
        h.extend_from_slice(&(n_kv as u64).to_le_bytes());
        for (key, value) in &self.entries {
            put_kv(&mut h, key, value);
        }
        if auto_alignment {
            let v = match u32::try_from(self.alignment) {
                Ok(a) => Value::U32(a),
                Err(_) => Value::U64(self.alignment),
            };
            put_kv(&mut h, "general.alignment", &v);
        }
        for (t, offset) in self.tensors.iter().zip(self.tensor_offsets()) {
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

    /// Header, padding to the data section, then each tensor at its offset. No padding
    /// after the last tensor, so every truncation of the file cuts into some tensor.
    fn write_parts(&self, header: &[u8], w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(header)?;
        let data_offset = round_up(header.len() as u64, self.layout_alignment());
        write_zeros(w, data_offset - header.len() as u64)?;
        let mut pos = 0u64;
        for (t, offset) in self.tensors.iter().zip(self.tensor_offsets()) {
            write_zeros(w, offset - pos)?;
            w.write_all(&t.data)?;
            pos = offset + t.data.len() as u64;
        }
        Ok(())
    }
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
    }
}
