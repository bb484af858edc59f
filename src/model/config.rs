//! Model hyper-parameters read from GGUF metadata, per architecture.

use crate::gguf::Metadata;
use crate::ops::glu::Activation;
use crate::ops::rope::RopeMode;
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// llama and its relatives (SmolLM2, Mistral-style models without extras).
    Llama,
    /// Gemma 3: scaled embeddings, Q/K norms, post-norms, GeGLU, local/global layers.
    Gemma3,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub arch_name: String,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    /// Size of one key / query head.
    pub head_dim: u32,
    pub n_vocab: u32,
    /// Context the model was trained with.
    pub n_ctx_train: u32,
    pub eps: f32,
    pub n_rot: u32,
    pub rope_mode: RopeMode,
    pub rope_base: f32,
    /// RoPE base of sliding-window layers (Gemma 3's local layers).
    pub rope_base_swa: f32,
    pub rope_scale: f32,
    pub act: Activation,
    /// Multiplies the token embeddings (sqrt(n_embd) for Gemma).
    pub embd_scale: f32,
    pub attn_scale: f32,
    /// Sliding window of local layers; 0 when every layer attends to everything.
    pub sliding_window: u32,
    /// Every `swa_pattern`-th layer is global, the rest local (0: none local).
    pub swa_pattern: u32,
    pub qk_norm: bool,
    pub post_norms: bool,
}

impl Config {
    pub fn from_metadata(md: &Metadata) -> Result<Config> {
        let arch_name = md.architecture()?.to_string();
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama,
            "gemma3" => Arch::Gemma3,
            other => {
                return Err(Error::Unsupported(format!(
                    "model architecture {other:?} (supported: llama, gemma3)"
                )))
            }
        };
        let k = |s: &str| format!("{arch_name}.{s}");
        let n_embd = md.require_u32(&k("embedding_length"))?;
        let n_head = md.require_u32(&k("attention.head_count"))?;
        let n_head_kv = md.get_u32(&k("attention.head_count_kv"))?.unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(Error::model(format!(
                "{}: {n_head} heads cannot be grouped over {n_head_kv} KV heads",
                k("attention.head_count_kv")
            )));
        }
        let head_dim = match md.get_u32(&k("attention.key_length"))? {
            Some(0) => {
                return Err(Error::model(format!(
                    "{} is 0: heads need at least one dimension",
                    k("attention.key_length")
                )))
            }
            Some(v) => v,
            None => {
                if n_embd % n_head != 0 {
                    return Err(Error::model(format!(
                        "embedding length {n_embd} is not divisible by {n_head} heads"
                    )));
                }
                n_embd / n_head
            }
        };
        if let Some(vl) = md.get_u32(&k("attention.value_length"))? {
            if vl != head_dim {
                return Err(Error::Unsupported(format!(
                    "value heads of {vl} with key heads of {head_dim}"
                )));
            }
        }
        let n_vocab = match md.get_u32(&k("vocab_size"))? {
            Some(v) => v,
            None => md
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.array_len())
                .map(|n| n as u32)
                .ok_or_else(|| Error::model("no vocab_size and no tokenizer.ggml.tokens"))?,
        };
        // q_dim, kv_dim and the per-layer attention tables are products of these; a file
        // whose products overflow 32 bits cannot describe tensors that exist.
        let heads_fit = [n_head, n_head_kv]
            .iter()
            .all(|&h| head_dim.checked_mul(h).is_some());
        if !heads_fit {
            return Err(Error::model(format!(
                "{n_head} heads of {head_dim} dimensions overflow 32 bits"
            )));
        }
        let gemma = arch == Arch::Gemma3;
        let cfg = Config {
            n_layer: md.require_u32(&k("block_count"))?,
            n_ff: md.require_u32(&k("feed_forward_length"))?,
            n_ctx_train: match md.get_u32(&k("context_length"))? {
                Some(0) => {
                    return Err(Error::model(format!(
                        "{} is 0: the model has no context",
                        k("context_length")
                    )))
                }
                Some(n) => n,
                None => 2048,
            },
            eps: md.require_f32(&k("attention.layer_norm_rms_epsilon"))?,
            n_rot: md.get_u32(&k("rope.dimension_count"))?.unwrap_or(head_dim),
            rope_mode: if gemma {
                RopeMode::Neox
            } else {
                RopeMode::Normal
            },
            rope_base: md.get_f32(&k("rope.freq_base"))?.unwrap_or(10000.0),
            rope_base_swa: md.get_f32(&k("rope.freq_base_swa"))?.unwrap_or(10000.0),
            rope_scale: match md.get_f32(&k("rope.scaling.factor"))? {
                Some(f) if f > 0.0 => 1.0 / f,
                _ => 1.0,
            },
            act: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            embd_scale: if gemma { (n_embd as f32).sqrt() } else { 1.0 },
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: if gemma {
                md.get_u32(&k("attention.sliding_window"))?.unwrap_or(0)
            } else {
                0
            },
            swa_pattern: if gemma { 6 } else { 0 },
            qk_norm: gemma,
            post_norms: gemma,
            arch,
            arch_name,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        if self.n_layer == 0 || self.n_embd == 0 || self.n_ff == 0 || self.n_vocab == 0 {
            return Err(Error::model(format!(
                "empty model: {} layers, embedding {}, feed-forward {}, vocab {}",
                self.n_layer, self.n_embd, self.n_ff, self.n_vocab
            )));
        }
        if self.n_rot > self.head_dim || self.n_rot % 2 != 0 {
            return Err(Error::model(format!(
                "rope dimension {} must be even and at most the head size {}",
                self.n_rot, self.head_dim
            )));
        }
        if !(self.eps > 0.0 && self.eps < 1.0) {
            return Err(Error::model(format!(
                "norm epsilon {} out of range",
                self.eps
            )));
        }
        Ok(())
    }

    pub fn q_dim(&self) -> u32 {
        self.head_dim * self.n_head
    }

    pub fn kv_dim(&self) -> u32 {
        self.head_dim * self.n_head_kv
    }

    /// Whether layer `il` attends only within the sliding window.
    pub fn is_local(&self, il: u32) -> bool {
        self.sliding_window > 0 && self.swa_pattern > 0 && (il + 1) % self.swa_pattern != 0
    }
}
