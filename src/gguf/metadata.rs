//! GGUF metadata: the typed key/value section of the header.
//!
//! [`Metadata`] keeps the entries in file order (so `wgllm info` prints them as stored) and
//! a hash index for O(1) lookup. The typed getters turn "wrong type" and "out of range"
//! into [`Error::Model`] naming the key, so model code can use `?` on them.

use std::collections::HashMap;
use std::fmt;

use crate::packed::PackedStr;

use crate::{Error, Result};

/// On-disk value type ids (gguf.h `enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub const ALL: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    /// The type for an on-disk id, or `None` for an unknown id.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Self::ALL.get(id as usize).copied()
    }

    /// Encoded size of a scalar of this type; `None` for the variable-size String and Array.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value of this type can take on disk: a string is at least its
    /// u64 length, an array at least its u32 element type and u64 count. Bounds array counts
    /// before anything is allocated.
    pub fn min_encoded_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value. Arrays carry their declared element type, which matters for empty
/// arrays and for writing the value back out. The reader keeps long arrays of strings or
/// numbers [`Value::Packed`]; they compare equal to the same items as a `Value::Array`.
#[derive(Clone, Debug)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
    Packed(PackedArray),
}

/// A long array of strings, or of one fixed-size number type, in one buffer instead of a
/// `Value` per item: Gemma 3's 262144 tokens, scores and token types took 34 MB as
/// `Value`s and take 6 MB packed.
#[derive(Clone, Debug)]
pub enum PackedArray {
    Strings(PackedStr),
    /// Little-endian items of `elem` (not Bool, String or Array), as in the file.
    Numbers {
        elem: ValueType,
        bytes: Vec<u8>,
    },
}

impl PackedArray {
    pub fn elem(&self) -> ValueType {
        match self {
            PackedArray::Strings(_) => ValueType::String,
            PackedArray::Numbers { elem, .. } => *elem,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            PackedArray::Strings(s) => s.len(),
            PackedArray::Numbers { elem, bytes } => bytes.len() / elem.fixed_size().unwrap_or(1),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// String item `i`, if this is an array of strings and has one.
    pub fn str_at(&self, i: usize) -> Option<&str> {
        match self {
            PackedArray::Strings(s) if i < s.len() => Some(s.get(i)),
            _ => None,
        }
    }

    /// Item `i` as a `Value`.
    pub fn item(&self, i: usize) -> Option<Value> {
        match self {
            PackedArray::Strings(_) => self.str_at(i).map(|s| Value::String(s.to_string())),
            PackedArray::Numbers { elem, bytes } => {
                let size = elem.fixed_size()?;
                number_from_le(*elem, bytes.get(i * size..(i + 1) * size)?)
            }
        }
    }
}

/// The number of type `ty` encoded little-endian in `b` (its exact size).
pub fn number_from_le(ty: ValueType, b: &[u8]) -> Option<Value> {
    use ValueType as T;
    Some(match ty {
        T::U8 => Value::U8(*b.first()?),
        T::I8 => Value::I8(*b.first()? as i8),
        T::U16 => Value::U16(u16::from_le_bytes(b.try_into().ok()?)),
        T::I16 => Value::I16(i16::from_le_bytes(b.try_into().ok()?)),
        T::U32 => Value::U32(u32::from_le_bytes(b.try_into().ok()?)),
        T::I32 => Value::I32(i32::from_le_bytes(b.try_into().ok()?)),
        T::F32 => Value::F32(f32::from_le_bytes(b.try_into().ok()?)),
        T::U64 => Value::U64(u64::from_le_bytes(b.try_into().ok()?)),
        T::I64 => Value::I64(i64::from_le_bytes(b.try_into().ok()?)),
        T::F64 => Value::F64(f64::from_le_bytes(b.try_into().ok()?)),
        T::Bool | T::String | T::Array => return None,
    })
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        use Value as V;
        match (self, other) {
            (V::U8(a), V::U8(b)) => a == b,
            (V::I8(a), V::I8(b)) => a == b,
            (V::U16(a), V::U16(b)) => a == b,
            (V::I16(a), V::I16(b)) => a == b,
            (V::U32(a), V::U32(b)) => a == b,
            (V::I32(a), V::I32(b)) => a == b,
            (V::F32(a), V::F32(b)) => a == b,
            (V::Bool(a), V::Bool(b)) => a == b,
            (V::String(a), V::String(b)) => a == b,
            (V::U64(a), V::U64(b)) => a == b,
            (V::I64(a), V::I64(b)) => a == b,
            (V::F64(a), V::F64(b)) => a == b,
            (V::Array(ta, a), V::Array(tb, b)) => ta == tb && a == b,
            // Packed or not, arrays are equal when their items are.
            (a, b) => match (a.array_len(), b.array_len()) {
                (Some(na), Some(nb)) => {
                    na == nb
                        && a.array_elem() == b.array_elem()
                        && (0..na).all(|i| a.array_item(i) == b.array_item(i))
                }
                _ => false,
            },
        }
    }
}

/// How many array items `Display` shows before eliding the rest.
const DISPLAY_ITEMS: usize = 8;

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) | Value::Packed(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value that is non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// F32, or F64 narrowed to f32 (some converters store hyper-parameters as f64).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The items and declared element type of an unpacked array value (see
    /// [`Value::array_len`] and [`Value::array_item`] for any array).
    pub fn as_array(&self) -> Option<(ValueType, &[Value])> {
        match self {
            Value::Array(t, items) => Some((*t, items)),
            _ => None,
        }
    }

    /// Items of an array value, packed or not.
    pub fn array_len(&self) -> Option<usize> {
        match self {
            Value::Array(_, items) => Some(items.len()),
            Value::Packed(p) => Some(p.len()),
            _ => None,
        }
    }

    /// The declared element type of an array value.
    pub fn array_elem(&self) -> Option<ValueType> {
        match self {
            Value::Array(t, _) => Some(*t),
            Value::Packed(p) => Some(p.elem()),
            _ => None,
        }
    }

    /// Item `i` of an array value (a copy).
    pub fn array_item(&self, i: usize) -> Option<Value> {
        match self {
            Value::Array(_, items) => items.get(i).cloned(),
            Value::Packed(p) => p.item(i),
            _ => None,
        }
    }

    /// A short description for error messages: the type, then the value (arrays elided).
    fn describe(&self) -> String {
        match (self.array_elem(), self.array_len()) {
            (Some(t), Some(n)) => format!("array of {n} {t}"),
            _ => format!("{} {self}", self.value_type()),
        }
    }
}

impl fmt::Display for Value {
    /// Scalars as themselves, strings quoted and escaped, arrays as their first
    /// [`DISPLAY_ITEMS`] items followed by the total count when longer.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Array(..) | Value::Packed(_) => {
                let n = self.array_len().unwrap_or(0);
                f.write_str("[")?;
                for i in 0..n.min(DISPLAY_ITEMS) {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    if let Some(item) = self.array_item(i) {
                        write!(f, "{item}")?;
                    }
                }
                if n > DISPLAY_ITEMS {
                    write!(f, ", ... ({n} items)")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// The metadata section: entries in file order plus a key index.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an entry; returns `false` (and leaves the metadata unchanged) if the key exists.
    pub fn insert(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Any integer value that fits a u32.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        self.typed(key, "u32", |v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok())
        })
    }

    /// Any non-negative integer value.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "u64", Value::as_u64)
    }

    /// F32 or F64.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "f32", Value::as_f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "bool", Value::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "string", Value::as_str)
    }

    /// An array whose items are all strings.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        if let Some(Value::Packed(p @ PackedArray::Strings(_))) = self.get(key) {
            return Ok(Some((0..p.len()).filter_map(|i| p.str_at(i)).collect()));
        }
        self.typed_array(key, "string", Value::as_str)
    }

    /// An array whose items are all F32 or F64.
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>> {
        self.number_array(key, "f32", Value::as_f32)
    }

    /// An array whose items are integers that fit an i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>> {
        self.number_array(key, "i32", |v| {
            v.as_i64().and_then(|x| i32::try_from(x).ok())
        })
    }

    /// An array whose items are integers that fit a u32. A scalar is not accepted: callers
    /// that allow "one value for all layers or one per layer" try [`Metadata::get_u32`] too.
    pub fn get_u32_array(&self, key: &str) -> Result<Option<Vec<u32>>> {
        self.number_array(key, "u32", |v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok())
        })
    }

    /// [`Metadata::typed_array`] for numbers, whose arrays may be packed.
    fn number_array<T>(
        &self,
        key: &str,
        expected: &str,
        conv: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>> {
        let Some(Value::Packed(p)) = self.get(key) else {
            return self.typed_array(key, expected, &conv);
        };
        let mut out = Vec::with_capacity(p.len());
        for i in 0..p.len() {
            match p.item(i).as_ref().and_then(&conv) {
                Some(x) => out.push(x),
                None => {
                    return Err(Error::model(format!(
                        "key {key}: expected array of {expected}, item #{i} is {}",
                        p.item(i).map_or("missing".into(), |v| v.describe())
                    )))
                }
            }
        }
        Ok(Some(out))
    }

    pub fn require_u32(&self, key: &str) -> Result<u32> {
        self.get_u32(key)?.ok_or_else(|| missing(key))
    }

    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?.ok_or_else(|| missing(key))
    }

    pub fn require_f32(&self, key: &str) -> Result<f32> {
        self.get_f32(key)?.ok_or_else(|| missing(key))
    }

    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?.ok_or_else(|| missing(key))
    }

    /// `general.architecture`, e.g. "llama" or "gemma3"; the prefix of the model's keys.
    pub fn architecture(&self) -> Result<&str> {
        self.require_str("general.architecture")
    }

    /// Looks `key` up and converts it with `conv`; a value `conv` rejects is an error.
    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        conv: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => conv(v)
                .map(Some)
                .ok_or_else(|| wrong_type(key, expected, v)),
        }
    }

    /// Like [`Metadata::typed`] for an array, converting each item.
    fn typed_array<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        conv: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let Some((_, items)) = v.as_array() else {
            return Err(wrong_type(key, &format!("array of {expected}"), v));
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match conv(item) {
                Some(x) => out.push(x),
                None => {
                    return Err(Error::model(format!(
                        "key {key}: expected array of {expected}, item #{i} is {}",
                        item.describe()
                    )))
                }
            }
        }
        Ok(Some(out))
    }
}

fn missing(key: &str) -> Error {
    Error::model(format!("missing required key {key}"))
}

fn wrong_type(key: &str, expected: &str, found: &Value) -> Error {
    Error::model(format!(
        "key {key}: expected {expected}, found {}",
        found.describe()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metadata {
        let mut m = Metadata::new();
        m.insert("a.u8".into(), Value::U8(7));
        m.insert("a.neg".into(), Value::I32(-1));
        m.insert("a.big".into(), Value::U64(1 << 40));
        m.insert("a.f64".into(), Value::F64(0.5));
        m.insert("a.s".into(), Value::String("hi".into()));
        m.insert(
            "a.arr".into(),
            Value::Array(ValueType::I32, (0..20).map(Value::I32).collect()),
        );
        m
    }

    #[test]
    fn integer_getters_accept_any_fitting_type() {
        let m = sample();
        assert_eq!(m.get_u32("a.u8").unwrap(), Some(7));
        assert_eq!(m.get_u64("a.big").unwrap(), Some(1 << 40));
        assert_eq!(m.get_u32("absent").unwrap(), None);
        let e = m.get_u32("a.big").unwrap_err().to_string();
        assert!(e.contains("a.big") && e.contains("expected u32"), "{e}");
        let e = m.get_u32("a.neg").unwrap_err().to_string();
        assert!(e.contains("i32 -1"), "{e}");
        assert!(m.get_u32("a.s").is_err());
    }

    #[test]
    fn float_string_and_array_getters() {
        let m = sample();
        assert_eq!(m.get_f32("a.f64").unwrap(), Some(0.5));
        assert!(m.get_f32("a.u8").is_err());
        assert_eq!(m.require_str("a.s").unwrap(), "hi");
        let e = m.require_str("nope").unwrap_err().to_string();
        assert!(e.contains("missing required key nope"), "{e}");
        assert_eq!(m.get_i32_array("a.arr").unwrap().unwrap().len(), 20);
        assert_eq!(m.get_u32_array("a.arr").unwrap().unwrap()[19], 19);
        assert!(m.get_str_array("a.arr").is_err());
        assert!(m.get_f32_array("a.s").is_err());
    }

    #[test]
    fn duplicate_insert_is_refused_and_order_kept() {
        let mut m = sample();
        assert!(!m.insert("a.s".into(), Value::Bool(true)));
        let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys[0], "a.u8");
        assert_eq!(keys.len(), m.len());
    }

    #[test]
    fn display_shortens_arrays() {
        let m = sample();
        let s = m.get("a.arr").unwrap().to_string();
        assert_eq!(s, "[0, 1, 2, 3, 4, 5, 6, 7, ... (20 items)]");
        assert_eq!(Value::String("a\"b".into()).to_string(), "\"a\\\"b\"");
    }
}
