//! Fast CPU kernels and the CPU backend: a persistent thread pool ([`pool`]), activation
//! quantization ([`act`]), per-type SIMD dot products ([`dot`]), quantized matrix
//! multiplication on the mapped weight blocks ([`matmul`]), the elementwise kernels
//! ([`ops`]), attention ([`attention`]) and its f16 KV cache ([`kv_cache`]), buffers
//! aligned to cache lines ([`lines`]), and
//! [`backend::CpuModel`], the graph run on the CPU.

pub mod act;
pub mod attention;
pub mod backend;
pub mod dot;
pub mod kv_cache;
pub mod lines;
pub mod matmul;
pub mod ops;
pub mod pool;
#[cfg(target_arch = "x86_64")]
pub mod tile;
