//! wgllm: a GPU-first LLM inference engine on wgpu compute shaders, with a CPU fallback.
//!
//! The path of a token: a GGUF file is memory-mapped ([`gguf`]), its tensors uploaded
//! verbatim to GPU buffers ([`gpu`]); the prompt is tokenized ([`tokenizer`]), run through
//! the model graph ([`model`]) built from compute kernels ([`ops`]), and the logits are
//! sampled ([`sampling`]).

pub mod engine;
pub mod error;
pub mod gguf;
pub mod packed;
pub mod quant;
pub mod session;
pub mod tokenizer;

pub use error::{Error, Result};
pub mod chat;
pub mod cpu;
pub mod gpu;
pub mod model;
pub mod ops;
pub mod sampling;
