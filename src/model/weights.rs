//! Collecting a model's weight tensors by their GGUF names, for any backend.

use super::config::Config;
use super::graph::LayerWeights;
use crate::gguf::GgufFile;
use crate::{Error, Result};

/// All weights of a model on one backend. `output` is `None` when the model ties its
/// output projection to the token embedding.
pub struct ModelWeights<W> {
    pub token_embd: W,
    pub layers: Vec<Option<LayerWeights<W>>>,
    pub output_norm: W,
    pub output: Option<W>,
}

/// Check that tensor `name` exists with `dims` (ggml order).
pub fn expect_dims(file: &GgufFile, name: &str, dims: &[u64]) -> Result<()> {
    let t = file
        .tensor(name)
        .ok_or_else(|| Error::model(format!("missing tensor {name}")))?;
    if t.dims != dims {
        return Err(Error::model(format!(
            "tensor {name} has shape {:?}, expected {:?} from the model's metadata",
            t.dims, dims
        )));
    }
    Ok(())
}

/// Load one layer's weights through `load`, checking every shape against `cfg`.
pub fn layer<W>(
    file: &GgufFile,
    cfg: &Config,
    il: u32,
    load: &mut impl FnMut(&str) -> Result<W>,
) -> Result<LayerWeights<W>> {
    let (e, q, kv, ff, hd) = (
        cfg.n_embd as u64,
        cfg.q_dim() as u64,
        cfg.kv_dim() as u64,
        cfg.n_ff as u64,
        cfg.head_dim as u64,
    );
    let mut get = |suffix: &str, dims: &[u64]| -> Result<W> {
        let name = format!("blk.{il}.{suffix}.weight");
        expect_dims(file, &name, dims)?;
        load(&name)
    };
    let gemma = cfg.qk_norm;
    Ok(LayerWeights {
        attn_norm: get("attn_norm", &[e])?,
        wq: get("attn_q", &[e, q])?,
        wk: get("attn_k", &[e, kv])?,
        wv: get("attn_v", &[e, kv])?,
        wo: get("attn_output", &[q, e])?,
        q_norm: if gemma {
            Some(get("attn_q_norm", &[hd])?)
        } else {
            None
        },
        k_norm: if gemma {
            Some(get("attn_k_norm", &[hd])?)
        } else {
            None
        },
        post_attn_norm: if cfg.post_norms {
            Some(get("post_attention_norm", &[e])?)
        } else {
            None
        },
        ffn_norm: get("ffn_norm", &[e])?,
        gate: get("ffn_gate", &[e, ff])?,
        up: get("ffn_up", &[e, ff])?,
        down: get("ffn_down", &[ff, e])?,
        post_ffn_norm: if cfg.post_norms {
            Some(get("post_ffw_norm", &[e])?)
        } else {
            None
        },
    })
}
