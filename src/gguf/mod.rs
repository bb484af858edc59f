//! GGUF reading (memory-mapped, bounded parsing), typed metadata, and a writer for
//! synthetic files.
//!
//! ```text
//! GgufFile::open(path) ─> metadata(): typed keys (general.architecture, llama.block_count…)
//!                      └> tensors(): name, dims (ne0 first), type, absolute offset, n_bytes
//!                         tensor_data(t): the tensor's bytes, borrowed from the map
//! ```

pub mod metadata;
pub mod reader;
pub mod synth;
pub mod writer;

pub use metadata::{Metadata, PackedArray, Value, ValueType};
pub use reader::{GgufFile, TensorInfo};
pub use writer::{GgufStream, GgufWriter, TensorDesc};
