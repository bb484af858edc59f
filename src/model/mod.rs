//! Models: hyper-parameters ([`config`]), the transformer graph written once over the
//! [`graph::Ops`] trait, its weights, and the GPU backend that records the graph.

pub mod config;
pub mod gpu_backend;
mod gpu_warm;
pub mod graph;
pub mod weights;

pub use config::{Arch, Config};
