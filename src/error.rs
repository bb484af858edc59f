//! The library's error type. Every fallible public function returns [`Result`].
//!
//! Variants name what went wrong and where (a byte offset, a tensor or key name), so
//! the CLI can print one clear line.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The GGUF file is malformed; `offset` is where the bad field starts.
    #[error("invalid GGUF at byte {offset}: {message}")]
    Gguf { offset: u64, message: String },

    /// The file parsed but its contents do not describe a model we can run.
    #[error("model: {0}")]
    Model(String),

    #[error("unsupported: {0}")]
    Unsupported(String),

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// No usable GPU adapter, a missing feature, a limit too small, a device error.
    #[error("GPU: {0}")]
    Gpu(String),

    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl Error {
    pub fn gguf(offset: u64, message: impl Into<String>) -> Self {
        Error::Gguf {
            offset,
            message: message.into(),
        }
    }
    pub fn model(message: impl Into<String>) -> Self {
        Error::Model(message.into())
    }
    pub fn gpu(message: impl Into<String>) -> Self {
        Error::Gpu(message.into())
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid(message.into())
    }
}
