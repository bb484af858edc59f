//! Collecting a model's weight tensors by their GGUF names, for any backend.

use super::config::Config;
use super::graph::{LayerWeights, Proj};
use crate::gguf::GgufFile;
use crate::{Error, Result};

/// All weights of a model on one backend. `output` is `None` when the model ties its
/// output projection to the token embedding, or on a backend whose part of the model
/// does not run the output layer. `token_embd` is `None` on a backend that neither
/// embeds tokens nor runs a tied output layer (a GPU part after the first layer, or
/// with the output layer on the CPU), which then keeps no copy of it.
pub struct ModelWeights<W> {
    pub token_embd: Option<W>,
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
/// Products of one input are offered to `fuse` first (tensor names, in order), which
/// returns their fused matrix where the backend builds one ([`Proj::Fused`]).
pub fn layer<W>(
    file: &GgufFile,
    cfg: &Config,
    il: u32,
    load: &mut impl FnMut(&str) -> Result<W>,
    fuse: &mut impl FnMut(&[&str]) -> Result<Option<W>>,
) -> Result<LayerWeights<W>> {
    let (e, q, kv, ff, hd) = (
        cfg.n_embd as u64,
        cfg.q_dim() as u64,
        cfg.kv_dim() as u64,
        cfg.n_ff as u64,
        cfg.head_dim as u64,
    );
    let name = |suffix: &str| format!("blk.{il}.{suffix}.weight");
    let mut get = |suffix: &str, dims: &[u64]| -> Result<W> {
        let name = name(suffix);
        expect_dims(file, &name, dims)?;
        load(&name)
    };
    // Fused when `fuse` builds the matrix; else, of three or more, all but the last
    // when it builds theirs (the last's type may differ); else one by one.
    macro_rules! proj {
        ($($suffix:literal: $dims:expr),+) => {{
            $(expect_dims(file, &name($suffix), &$dims)?;)+
            let names = [$(name($suffix)),+];
            let refs: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
            let rows = [$($dims[1] as u32),+];
            let (suffixes, dims) = ([$($suffix),+], [$($dims),+]);
            let n = refs.len();
            match fuse(&refs)? {
                Some(w) => Proj::Fused(w, rows),
                None => match if n > 2 { fuse(&refs[..n - 1])? } else { None } {
                    Some(fused) => Proj::Leading {
                        fused,
                        rows: rows[..n - 1].to_vec(),
                        rest: vec![get(suffixes[n - 1], &dims[n - 1])?],
                    },
                    None => Proj::Split([$(get($suffix, &$dims)?),+]),
                },
            }
        }};
    }
    let gemma = cfg.qk_norm;
    Ok(LayerWeights {
        attn_norm: get("attn_norm", &[e])?,
        qkv: proj!("attn_q": [e, q], "attn_k": [e, kv], "attn_v": [e, kv]),
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
        gate_up: proj!("ffn_gate": [e, ff], "ffn_up": [e, ff]),
        down: get("ffn_down", &[ff, e])?,
        post_ffn_norm: if cfg.post_norms {
            Some(get("post_ffw_norm", &[e])?)
        } else {
            None
        },
    })
}

impl<W> ModelWeights<W> {
    /// The token embedding, for a backend that embeds tokens.
    pub fn embedding(&self) -> Result<&W> {
        self.token_embd
            .as_ref()
            .ok_or_else(|| Error::model("this part of the model holds no token embedding"))
    }

    /// The output projection: `output`, or the token embedding it is tied to.
    pub fn output_projection(&self) -> Result<&W> {
        self.output
            .as_ref()
            .or(self.token_embd.as_ref())
            .ok_or_else(|| Error::model("this part of the model holds no output layer"))
    }
}
