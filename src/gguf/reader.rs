//! GGUF reading: a memory-mapped file and a bounded parser over its bytes.
//!
//! Layout (GGUF v2/v3, little-endian):
//! ```text
//! magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv × { key: string, type u32, value }
//! n_tensors × { name: string, n_dims u32, ne[n_dims] u64, type u32, offset u64 }
//! padding to `general.alignment` (default 32) | tensor data
//! string = len u64, bytes; array = elem type u32, count u64, items
//! ```
//! Every length and count is checked against the bytes that remain before anything is
//! allocated, so a hostile file costs at most memory proportional to its own size.
//! Tensor data is never copied: [`GgufFile::tensor_data`] is a slice of the map.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use super::metadata::{Metadata, PackedArray, Value, ValueType};
use crate::packed::PackedStr;
use crate::quant::GgmlType;
use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: u32 = 4;
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays inside arrays that the parser accepts.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Cap on up-front `Vec` capacity for arrays; longer arrays grow as items are parsed.
const MAX_PREALLOC: usize = 1 << 20;

/// One tensor's description. `offset` is absolute in the file; the data is
/// `bytes()[offset .. offset + n_bytes]`, checked to lie in the file when parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` (ne0) is the innermost, contiguous dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// `ne[i]`; 1 for dimensions past `n_dims`, as in ggml.
    pub fn ne(&self, i: usize) -> u64 {
        self.dims.get(i).copied().unwrap_or(1)
    }

    /// Bytes in one row of `ne0` elements (ne0 is a whole number of blocks; checked at parse).
    pub fn row_bytes(&self) -> u64 {
        let bs = self.ty.block_size() as u64;
        (self.ne(0) / bs).saturating_mul(self.ty.type_size() as u64)
    }

    /// Rows of `ne0` elements: the product of all dimensions but the first.
    pub fn n_rows(&self) -> u64 {
        self.n_elements().checked_div(self.ne(0)).unwrap_or(0)
    }
}

/// Where the bytes live: a read-only map of a file, or a buffer handed in.
enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file: metadata and tensor table, over the file's bytes.
pub struct GgufFile {
    storage: Storage,
    header: Header,
}

/// Everything parsed from the header; owns no file bytes.
struct Header {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    data_offset: u64,
    alignment: u64,
}

impl GgufFile {
    /// Maps `path` read-only and parses it.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        // An empty file cannot be mapped on every platform; parse it as zero bytes so the
        // error is the GGUF one ("magic: needs 4 bytes").
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this process. Another process
            // truncating or rewriting the file while it is mapped would change the bytes
            // under us; like every mmap-based model loader we accept that.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
            // The CPU engine streams every weight from the map each token. Marked for
            // huge pages, a file read into the page cache from here on comes in 2 MiB
            // folios mapped whole, sparing the TLB and the prefetchers a page boundary
            // every 4 KiB: Gemma 3 decoded 6-10% faster from a cold cache
            // (docs/perf.md, "Huge pages for lavapipe's memory", *The GGUF map*). A
            // hint: refused, the map stays as it is.
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            Storage::Mapped(map)
        };
        Self::from_storage(storage)
    }

    /// Parses a file held in memory (tests, tools, files already read).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile> {
        let header = parse(storage.bytes())?;
        Ok(GgufFile { storage, header })
    }

    pub fn version(&self) -> u32 {
        self.header.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// Tensors in file order of their descriptions.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header
            .index
            .get(name)
            .and_then(|&i| self.header.tensors.get(i))
    }

    /// The tensor's bytes, borrowed from the map. Bounds were checked at parse; a
    /// `TensorInfo` from another file that does not fit this one gives an empty slice.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.n_bytes).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        range.and_then(|r| self.bytes().get(r)).unwrap_or(&[])
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Tell the kernel that the mapped pages wholly inside tensor `t`'s data will not be
    /// read soon (its bytes were copied to the GPU), so they stop counting as resident
    /// memory. The map is read-only and file-backed: a later read just faults the pages
    /// back in from the file. A no-op for owned bytes and where the hint is refused.
    pub fn release(&self, t: &TensorInfo) {
        self.release_bytes(self.tensor_data(t));
    }

    /// [`Self::release`] for part of the map: `bytes` must be a slice of it (others are
    /// ignored). Whole pages only, so data of neighbouring tensors stays resident.
    pub fn release_bytes(&self, bytes: &[u8]) {
        let Storage::Mapped(map) = &self.storage else {
            return;
        };
        let page = 4096usize;
        let base = map.as_ptr() as usize;
        let start = (bytes.as_ptr() as usize).wrapping_sub(base);
        if start > map.len() || bytes.len() > map.len() - start {
            return;
        }
        let first = (base + start).next_multiple_of(page) - base;
        let end = ((base + start + bytes.len()) / page) * page - base;
        if end > first {
            // SAFETY: DontNeed on a private read-only file mapping discards pages that
            // are re-read from the file on access; no reference observes a change.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
            };
        }
    }

    /// Absolute offset where tensor data starts (header end rounded up to the alignment).
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// True when the bytes are a file map rather than an owned buffer.
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped(_))
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("size", &self.bytes().len())
            .field("n_kv", &self.header.metadata.len())
            .field("n_tensors", &self.header.tensors.len())
            .field("data_offset", &self.header.data_offset)
            .finish()
    }
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes; `what` names the field for the error.
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let left = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let s = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
            }
            _ => Err(Error::gguf(
                self.offset(),
                format!("{what}: needs {n} bytes but only {left} are left"),
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed UTF-8 string.
    fn string(&mut self, what: &str) -> Result<String> {
        self.str_slice(what).map(str::to_owned)
    }

    /// A string, borrowed from the file's bytes.
    fn str_slice(&mut self, what: &str) -> Result<&'a str> {
        let start = self.offset();
        let len = self.u64(what)?;
        let left = self.remaining();
        if len > left as u64 {
            return Err(Error::gguf(
                start,
                format!("{what}: string length {len} exceeds the {left} bytes left"),
            ));
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s),
            Err(e) => Err(Error::gguf(
                start + 8 + e.valid_up_to() as u64,
                format!(
                    "{what}: string is not valid UTF-8 (bad byte at index {})",
                    e.valid_up_to()
                ),
            )),
        }
    }

    /// A value of type `ty`; `depth` counts enclosing arrays.
    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8("u8 value")?),
            ValueType::I8 => Value::I8(self.u8("i8 value")? as i8),
            ValueType::U16 => Value::U16(self.u16("u16 value")?),
            ValueType::I16 => Value::I16(self.u16("i16 value")? as i16),
            ValueType::U32 => Value::U32(self.u32("u32 value")?),
            ValueType::I32 => Value::I32(self.u32("i32 value")? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32("f32 value")?)),
            ValueType::U64 => Value::U64(self.u64("u64 value")?),
            ValueType::I64 => Value::I64(self.u64("i64 value")? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64("f64 value")?)),
            ValueType::Bool => {
                let at = self.offset();
                match self.u8("bool value")? {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => return Err(Error::gguf(at, format!("bool value is {b}, not 0 or 1"))),
                }
            }
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::Array => self.array_value(depth)?,
        })
    }

    fn array_value(&mut self, depth: usize) -> Result<Value> {
        let type_at = self.offset();
        if depth >= MAX_ARRAY_DEPTH {
            return Err(Error::gguf(
                type_at,
                format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels"),
            ));
        }
        let id = self.u32("array element type")?;
        let elem = ValueType::from_id(id)
            .ok_or_else(|| Error::gguf(type_at, format!("unknown array element type {id}")))?;
        let count_at = self.offset();
        let count = self.u64("array count")?;
        let left = self.remaining();
        // Every item takes at least `min_encoded_size` bytes, so a larger count cannot fit.
        let max = (left / elem.min_encoded_size()) as u64;
        if count > max {
            return Err(Error::gguf(
                count_at,
                format!("array count {count} exceeds the {left} bytes left"),
            ));
        }
        let count = count as usize; // <= left, so it fits
        if count >= PACK_MIN {
            if let Some(p) = self.packed(elem, count)? {
                return Ok(Value::Packed(p));
            }
        }
        let mut items = Vec::with_capacity(count.min(MAX_PREALLOC));
        for i in 0..count {
            let item = self
                .value(elem, depth + 1)
                .map_err(|e| prefix(e, &format!("array item #{i}")))?;
            items.push(item);
        }
        Ok(Value::Array(elem, items))
    }

    /// `count` items of `elem` (which fit the bytes left) as one packed buffer: strings,
    /// and numbers other than bools (whose bytes must be checked one by one).
    fn packed(&mut self, elem: ValueType, count: usize) -> Result<Option<PackedArray>> {
        if elem == ValueType::String {
            let at = self.offset();
            let mut strings = PackedStr::default();
            for i in 0..count {
                let s = self
                    .str_slice("string value")
                    .map_err(|e| prefix(e, &format!("array item #{i}")))?;
                strings
                    .push(s)
                    .map_err(|e| Error::gguf(at, e.to_string()))?;
            }
            return Ok(Some(PackedArray::Strings(strings)));
        }
        match elem.fixed_size() {
            Some(size) if elem != ValueType::Bool => {
                let bytes = self.take((count * size) as u64, "array items")?.to_vec();
                Ok(Some(PackedArray::Numbers { elem, bytes }))
            }
            _ => Ok(None),
        }
    }
}

/// Arrays of at least this many strings or numbers are kept packed ([`PackedArray`]).
const PACK_MIN: usize = 256;

/// Prepends `context` (the enclosing key, tensor or array item) to a GGUF error's
/// message. The offset stays that of the innermost field, the one that is bad.
fn prefix(e: Error, context: &str) -> Error {
    match e {
        Error::Gguf { offset, message } => Error::Gguf {
            offset,
            message: format!("{context}: {message}"),
        },
        other => other,
    }
}

/// Parses the header of `bytes` and checks every tensor's data against them.
fn parse(bytes: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf: bytes, pos: 0 };
    let magic = c.array::<4>("magic")?;
    if &magic != MAGIC {
        return Err(Error::gguf(
            0,
            format!("bad magic {magic:02x?}, expected \"GGUF\""),
        ));
    }
    let version = read_version(&mut c)?;
    let n_tensors_at = c.offset();
    let n_tensors = c.u64("tensor count")?;
    let n_kv_at = c.offset();
    let n_kv = c.u64("metadata key count")?;
    // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor
    // description at least 8 + 4 + 8 + 4 + 8. Refuse counts that cannot fit.
    check_count(&c, n_kv, 13, n_kv_at, "metadata key count")?;
    check_count(&c, n_tensors, 32, n_tensors_at, "tensor count")?;

    let (metadata, alignment_at) = parse_metadata(&mut c, n_kv)?;
    let alignment = read_alignment(&metadata, alignment_at)?;
    // Check again now that the metadata is consumed: this bounds the table's allocation.
    check_count(&c, n_tensors, 32, n_tensors_at, "tensor count")?;
    let mut raw = parse_tensor_infos(&mut c, n_tensors)?;

    let header_end = c.offset();
    let data_offset = align_up(header_end, alignment)
        .ok_or_else(|| Error::gguf(header_end, "data offset overflows when aligned".to_string()))?;
    let file_len = bytes.len() as u64;
    if !raw.is_empty() && data_offset > file_len {
        return Err(Error::gguf(
            header_end,
            format!(
                "tensor data section starts at {data_offset}, past end of file (size {file_len})"
            ),
        ));
    }
    place_tensors(&mut raw, data_offset, alignment, file_len)?;

    let mut index = HashMap::with_capacity(raw.len());
    let tensors: Vec<TensorInfo> = raw.into_iter().map(|r| r.info).collect();
    for (i, t) in tensors.iter().enumerate() {
        index.insert(t.name.clone(), i);
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        index,
        data_offset,
        alignment,
    })
}

fn read_version(c: &mut Cursor) -> Result<u32> {
    let at = c.offset();
    let version = c.u32("version")?;
    match version {
        2 | 3 => Ok(version),
        1 => Err(Error::gguf(
            at,
            "version 1 is not supported (only GGUF v2 and v3)".to_string(),
        )),
        v if matches!(v.swap_bytes(), 1..=3) => Err(Error::gguf(
            at,
            format!(
                "big-endian GGUF (version {}) is not supported",
                v.swap_bytes()
            ),
        )),
        v => Err(Error::gguf(
            at,
            format!("unsupported version {v} (only GGUF v2 and v3)"),
        )),
    }
}

/// Rejects a count of items that, at `min_size` bytes each, cannot fit in what is left.
fn check_count(c: &Cursor, count: u64, min_size: u64, at: u64, what: &str) -> Result<()> {
    let left = c.remaining() as u64;
    if count > left / min_size {
        return Err(Error::gguf(
            at,
            format!("{what} {count} exceeds the {left} bytes left"),
        ));
    }
    Ok(())
}

/// Reads the key/value section; also returns where `general.alignment`'s value starts.
fn parse_metadata(c: &mut Cursor, n_kv: u64) -> Result<(Metadata, u64)> {
    let mut metadata = Metadata::new();
    let mut alignment_at = 0;
    for i in 0..n_kv {
        let key_at = c.offset();
        let key = c
            .string("key")
            .map_err(|e| prefix(e, &format!("metadata key #{i}")))?;
        let ctx = format!("metadata key #{i} '{key}'");
        let type_at = c.offset();
        let id = c.u32("value type").map_err(|e| prefix(e, &ctx))?;
        let ty = ValueType::from_id(id)
            .ok_or_else(|| Error::gguf(type_at, format!("{ctx}: unknown value type {id}")))?;
        let value_at = c.offset();
        let value = c.value(ty, 0).map_err(|e| prefix(e, &ctx))?;
        if key == "general.alignment" {
            alignment_at = value_at;
        }
        if !metadata.insert(key, value) {
            return Err(Error::gguf(
                key_at,
                format!("{ctx}: duplicate metadata key"),
            ));
        }
    }
    Ok((metadata, alignment_at))
}

/// `general.alignment`: an unsigned integer, a non-zero power of two (default 32).
fn read_alignment(metadata: &Metadata, at: u64) -> Result<u64> {
    let Some(v) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v.as_u64() {
        Some(a) if a.is_power_of_two() => Ok(a),
        _ => Err(Error::gguf(
            at,
            format!(
                "general.alignment must be a non-zero power of two, found {} {v}",
                v.value_type()
            ),
        )),
    }
}

/// A tensor description before its data is placed, with where its fields were read.
struct RawTensor {
    info: TensorInfo,
    /// Offset of the tensor's name field, for naming it in errors.
    name_at: u64,
    /// Offset of the tensor's data-offset field.
    offset_at: u64,
}

fn parse_tensor_infos(c: &mut Cursor, n_tensors: u64) -> Result<Vec<RawTensor>> {
    // n_tensors was checked against the bytes left, so this allocation is bounded.
    let mut out = Vec::with_capacity(n_tensors as usize);
    let mut seen: HashMap<String, ()> = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name_at = c.offset();
        let name = c
            .string("name")
            .map_err(|e| prefix(e, &format!("tensor #{i}")))?;
        let ctx = format!("tensor #{i} '{name}'");
        if seen.insert(name.clone(), ()).is_some() {
            return Err(Error::gguf(
                name_at,
                format!("{ctx}: duplicate tensor name"),
            ));
        }
        let raw = parse_tensor_info(c, name, name_at).map_err(|e| prefix(e, &ctx))?;
        out.push(raw);
    }
    Ok(out)
}

/// The fields after the name: n_dims, ne[], type, offset (relative to the data section).
fn parse_tensor_info(c: &mut Cursor, name: String, name_at: u64) -> Result<RawTensor> {
    let n_dims_at = c.offset();
    let n_dims = c.u32("n_dims")?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(Error::gguf(
            n_dims_at,
            format!("n_dims {n_dims} is not in 1..={MAX_DIMS}"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    let mut n_elements: u64 = 1;
    for d in 0..n_dims {
        let at = c.offset();
        let ne = c.u64(&format!("ne[{d}]"))?;
        if ne == 0 {
            return Err(Error::gguf(at, format!("ne[{d}] is 0")));
        }
        n_elements = n_elements
            .checked_mul(ne)
            .ok_or_else(|| Error::gguf(at, format!("ne[{d}] = {ne}: element count overflows")))?;
        dims.push(ne);
    }
    // ggml keeps element and byte counts in int64_t; stay within that.
    if n_elements > i64::MAX as u64 {
        return Err(Error::gguf(
            n_dims_at,
            format!("element count {n_elements} exceeds i64::MAX"),
        ));
    }
    let type_at = c.offset();
    let type_id = c.u32("type")?;
    let ty = GgmlType::from_id(type_id)
        .ok_or_else(|| Error::gguf(type_at, format!("unknown tensor type id {type_id}")))?;
    let ne0 = dims[0];
    let block = ty.block_size() as u64;
    if ne0 % block != 0 {
        return Err(Error::gguf(
            n_dims_at,
            format!("ne[0] = {ne0} is not a multiple of {ty}'s block size {block}"),
        ));
    }
    let n_bytes = ty
        .row_bytes(ne0)
        .and_then(|row| row.checked_mul(n_elements / ne0))
        .ok_or_else(|| Error::gguf(n_dims_at, format!("{ty} data size overflows")))?;
    let offset_at = c.offset();
    let offset = c.u64("offset")?;
    Ok(RawTensor {
        info: TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_bytes,
        },
        name_at,
        offset_at,
    })
}

/// Turns relative offsets into absolute ones and checks alignment, bounds and overlap.
fn place_tensors(
    raw: &mut [RawTensor],
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<()> {
    for r in raw.iter_mut() {
        let t = &mut r.info;
        let rel = t.offset;
        if rel % alignment != 0 {
            return Err(Error::gguf(
                r.offset_at,
                format!(
                    "tensor '{}': offset {rel} is not a multiple of the alignment {alignment}",
                    t.name
                ),
            ));
        }
        let end = data_offset
            .checked_add(rel)
            .and_then(|start| start.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => t.offset = data_offset + rel,
            _ => {
                return Err(Error::gguf(
                    r.offset_at,
                    format!(
                        "tensor '{}': data [{}..{}) runs past end of file (size {file_len})",
                        t.name,
                        data_offset as u128 + rel as u128,
                        data_offset as u128 + rel as u128 + t.n_bytes as u128
                    ),
                ))
            }
        }
    }
    check_overlap(raw)
}

/// Sorted by start, each tensor must end at or before the next one starts.
fn check_overlap(raw: &[RawTensor]) -> Result<()> {
    let mut order: Vec<&RawTensor> = raw.iter().collect();
    order.sort_by_key(|r| (r.info.offset, r.name_at));
    for pair in order.windows(2) {
        let (a, b) = (&pair[0].info, &pair[1].info);
        let a_end = a.offset + a.n_bytes; // checked against the file size above
        if a_end > b.offset {
            return Err(Error::gguf(
                pair[1].offset_at,
                format!(
                    "tensor '{}': data [{}..{}) overlaps tensor '{}' data [{}..{})",
                    b.name,
                    b.offset,
                    b.offset + b.n_bytes,
                    a.name,
                    a.offset,
                    a_end
                ),
            ));
        }
    }
    Ok(())
}

/// `x` rounded up to a multiple of `a` (a power of two), or `None` on overflow.
fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? & !(a - 1))
}
