//! The decoder-only transformer graph, written once over [`Ops`] so any backend that
//! implements the ops runs it. Llama and Gemma 3 share this graph: Gemma's differences
//! (scaled embeddings, per-head Q/K norms, post-attention/post-FFN norms, GeGLU, local
//! layers with their own RoPE base) are switches of [`Config`], not a second copy.

use super::config::Config;
use crate::ops::attention::Attention;
use crate::ops::glu::Activation;
use crate::ops::mul_mat::Columns;
use crate::ops::rope::Rope;
use crate::Result;

/// The operations the graph needs. `Act` is an activation buffer handle, `Weight` a
/// weight tensor handle. Step-dependent values (positions, batch size, token ids) are
/// the backend's, so a recorded graph can be replayed for every step.
pub trait Ops {
    type Act;
    type Weight;

    /// out[:, t] = embedding of token t of the step, times `scale`.
    fn embed(&mut self, w: &Self::Weight, out: &Self::Act, scale: f32) -> Result<()>;
    /// y = rms_norm(x) * w over rows of `n`, `rows_per_token` rows per token.
    fn rms_norm(
        &mut self,
        x: &Self::Act,
        w: &Self::Weight,
        y: &Self::Act,
        n: u32,
        rows_per_token: u32,
        eps: f32,
    ) -> Result<()>;
    /// y = W x.
    fn mul_mat(
        &mut self,
        w: &Self::Weight,
        x: &Self::Act,
        y: &Self::Act,
        cols: Columns,
    ) -> Result<()>;
    /// RoPE in place.
    fn rope(&mut self, x: &Self::Act, rope: &Rope) -> Result<()>;

    /// RoPE in place on a layer's Q (`rope`'s heads) and K (`k_heads` heads).
    fn rope_qk(&mut self, q: &Self::Act, k: &Self::Act, rope: &Rope, k_heads: u32) -> Result<()> {
        self.rope(q, rope)?;
        self.rope(
            k,
            &Rope {
                n_heads: k_heads,
                ..*rope
            },
        )
    }
    /// RoPE on Q and K (as [`Ops::rope_qk`]), then [`Ops::attention`]: one call, so a
    /// backend may rotate K on its way into the cache.
    #[allow(clippy::too_many_arguments)]
    fn rope_attention(
        &mut self,
        il: usize,
        [q, k, v]: [&Self::Act; 3],
        out: &Self::Act,
        rope: &Rope,
        k_heads: u32,
        attn: &Attention,
    ) -> Result<()> {
        self.rope_qk(q, k, rope, k_heads)?;
        self.attention(il, q, k, v, out, attn)
    }
    /// The per-head RMS norms of Q and K (`norms`), then [`Ops::rope_attention`] on the
    /// normalised heads, which go to `normed` ([Q, K]) where the backend has no fused
    /// form.
    #[allow(clippy::too_many_arguments)]
    fn norm_rope_attention(
        &mut self,
        il: usize,
        [q, k, v]: [&Self::Act; 3],
        [qn, kn]: [&Self::Act; 2],
        norms: &HeadNorms<'_, Self::Weight>,
        out: &Self::Act,
        rope: &Rope,
        k_heads: u32,
        attn: &Attention,
    ) -> Result<()> {
        let heads = HeadsAttention {
            il,
            out,
            rope,
            k_heads,
            attn,
        };
        norms_then_rope_attention(self, [q, k, v], [qn, kn], norms, &heads)
    }
    /// A layer's Q/K/V products of `x` (`w`) into `qkv`, then [`Ops::norm_rope_attention`]
    /// where the heads have `norms` (their outputs in `normed`), else
    /// [`Ops::rope_attention`]: one call, so that a backend may rotate a single token's
    /// heads and append them to the cache inside the product.
    fn qkv_attention(
        &mut self,
        w: &Proj<Self::Weight, 3>,
        x: &Self::Act,
        (qkv, normed): ([&Self::Act; 3], [&Self::Act; 2]),
        norms: Option<&HeadNorms<'_, Self::Weight>>,
        h: &HeadsAttention<'_, Self::Act>,
    ) -> Result<()> {
        qkv_then_attention(self, w, x, (qkv, normed), norms, h)
    }
    /// Append k, v to layer `il`'s cache and attend with q into `out`.
    fn attention(
        &mut self,
        il: usize,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        out: &Self::Act,
        attn: &Attention,
    ) -> Result<()>;
    /// out = act(gate) * up over `n` elements per token.
    fn glu(
        &mut self,
        gate: &Self::Act,
        up: &Self::Act,
        out: &Self::Act,
        n: u32,
        act: Activation,
    ) -> Result<()>;
    /// gate = W_gate x and up = W_up x (`w`), then `out` = act(gate) * up over `n`
    /// elements per token: one call, so a backend may apply the activation inside the
    /// product.
    fn mul_mat_glu(
        &mut self,
        w: &Proj<Self::Weight, 2>,
        x: &Self::Act,
        [gate, up]: [&Self::Act; 2],
        out: &Self::Act,
        (n, act): (u32, Activation),
    ) -> Result<()> {
        products_then_glu(self, w, x, [gate, up], out, (n, act))
    }
    /// x += y over `n` elements per token.
    fn add(&mut self, x: &Self::Act, y: &Self::Act, n: u32) -> Result<()>;

    /// y += W x, W having `n` rows; `tmp` ([n, n_tokens]) holds the product where the
    /// backend has no fused form.
    fn mul_mat_add(
        &mut self,
        w: &Self::Weight,
        x: &Self::Act,
        y: &Self::Act,
        tmp: &Self::Act,
        n: u32,
    ) -> Result<()> {
        self.mul_mat(w, x, tmp, Columns::All)?;
        self.add(y, tmp, n)
    }

    /// ys[i] = W_i x for several matrices of one input (a layer's Q, K and V; its gate
    /// and up): one call, so that a backend may run them as one op.
    fn mul_mat_each(
        &mut self,
        ws: &[&Self::Weight],
        x: &Self::Act,
        ys: &[&Self::Act],
    ) -> Result<()> {
        products_one_by_one(self, ws, x, ys)
    }

    /// ys[i] = rows `rows[i]` of W x, for a W whose rows are several products' rows
    /// one after another ([`Proj::Fused`]); each ys[i] is [rows[i], n_tokens]. Only
    /// backends that fuse projections at load implement it.
    fn mul_mat_rows(
        &mut self,
        w: &Self::Weight,
        x: &Self::Act,
        ys: &[&Self::Act],
        rows: &[u32],
    ) -> Result<()> {
        let _ = (w, x, ys, rows);
        Err(crate::Error::Unsupported(
            "fused projections on this backend".into(),
        ))
    }

    /// x += rms_norm(p) * w over rows of `n` (one per token); `tmp` holds the norm where
    /// the backend has no fused form.
    fn rms_norm_add(
        &mut self,
        x: &Self::Act,
        p: &Self::Act,
        w: &Self::Weight,
        tmp: &Self::Act,
        n: u32,
        eps: f32,
    ) -> Result<()> {
        self.rms_norm(p, w, tmp, n, 1, eps)?;
        self.add(x, tmp, n)
    }
}

/// The weights of a layer's per-head Q and K norms (Gemma 3), [head_dim] each.
pub struct HeadNorms<'a, W> {
    pub q: &'a W,
    pub k: &'a W,
    pub eps: f32,
}

/// What [`Ops::norm_rope_attention`] attends with, past its tensors.
pub struct HeadsAttention<'a, A> {
    pub il: usize,
    pub out: &'a A,
    pub rope: &'a Rope,
    pub k_heads: u32,
    pub attn: &'a Attention,
}

/// [`Ops::norm_rope_attention`] as separate ops: both heads' norms into `[qn, kn]`,
/// then [`Ops::rope_attention`] on them (backends without the fused form).
pub fn norms_then_rope_attention<O: Ops + ?Sized>(
    o: &mut O,
    [q, k, v]: [&O::Act; 3],
    [qn, kn]: [&O::Act; 2],
    norms: &HeadNorms<'_, O::Weight>,
    h: &HeadsAttention<'_, O::Act>,
) -> Result<()> {
    let (hd, eps) = (h.rope.head_dim, norms.eps);
    o.rms_norm(q, norms.q, qn, hd, h.rope.n_heads, eps)?;
    o.rms_norm(k, norms.k, kn, hd, h.k_heads, eps)?;
    o.rope_attention(h.il, [qn, kn, v], h.out, h.rope, h.k_heads, h.attn)
}

/// [`Ops::qkv_attention`] as separate ops: the products, then the attention with RoPE
/// (after the heads' norms where given).
pub fn qkv_then_attention<O: Ops + ?Sized>(
    o: &mut O,
    w: &Proj<O::Weight, 3>,
    x: &O::Act,
    (qkv, normed): ([&O::Act; 3], [&O::Act; 2]),
    norms: Option<&HeadNorms<'_, O::Weight>>,
    h: &HeadsAttention<'_, O::Act>,
) -> Result<()> {
    w.run(o, x, qkv)?;
    let (il, kh) = (h.il, h.k_heads);
    match norms {
        Some(n) => o.norm_rope_attention(il, qkv, normed, n, h.out, h.rope, kh, h.attn),
        None => o.rope_attention(il, qkv, h.out, h.rope, kh, h.attn),
    }
}

/// [`Ops::mul_mat_each`] as one product after another (backends with no joint form,
/// and products a backend cannot join).
pub fn products_one_by_one<O: Ops + ?Sized>(
    o: &mut O,
    ws: &[&O::Weight],
    x: &O::Act,
    ys: &[&O::Act],
) -> Result<()> {
    for (w, y) in ws.iter().zip(ys) {
        o.mul_mat(w, x, y, Columns::All)?;
    }
    Ok(())
}

/// [`Ops::mul_mat_glu`] as separate ops: the products, then [`Ops::glu`].
pub fn products_then_glu<O: Ops + ?Sized>(
    o: &mut O,
    w: &Proj<O::Weight, 2>,
    x: &O::Act,
    [gate, up]: [&O::Act; 2],
    out: &O::Act,
    (n, act): (u32, Activation),
) -> Result<()> {
    w.run(o, x, [gate, up])?;
    o.glu(gate, up, out, n, act)
}

/// Products of one input: N matrices, or one matrix holding their rows one after
/// another, which a backend may build at load to run them as one product.
pub enum Proj<W, const N: usize> {
    Split([W; N]),
    /// The matrix and each product's rows.
    Fused(W, [u32; N]),
    /// The first products in one matrix (`fused`, with each one's rows), the others
    /// one by one (`rest`): where the last ones cannot join it, as Q4_K_M models' V
    /// (Q6_K in some layers, beside Q4_K Q and K).
    Leading {
        fused: W,
        rows: Vec<u32>,
        rest: Vec<W>,
    },
}

impl<W, const N: usize> Proj<W, N> {
    /// ys[i] = W_i x.
    fn run<O: Ops<Weight = W> + ?Sized>(
        &self,
        o: &mut O,
        x: &O::Act,
        ys: [&O::Act; N],
    ) -> Result<()> {
        match self {
            Proj::Split(ws) => o.mul_mat_each(&ws.each_ref(), x, &ys),
            Proj::Fused(w, rows) => o.mul_mat_rows(w, x, &ys, rows),
            Proj::Leading { fused, rows, rest } => {
                let (first, others) = ys.split_at(rows.len().min(N));
                o.mul_mat_rows(fused, x, first, rows)?;
                for (w, y) in rest.iter().zip(others) {
                    o.mul_mat(w, x, y, Columns::All)?;
                }
                Ok(())
            }
        }
    }
}

/// One block's weights. Shapes in ggml order.
pub struct LayerWeights<W> {
    pub attn_norm: W, // [n_embd]
    /// Q [n_embd, n_head * head_dim], K and V [n_embd, n_head_kv * head_dim].
    pub qkv: Proj<W, 3>,
    pub wo: W,                     // [n_head * head_dim, n_embd]
    pub q_norm: Option<W>,         // [head_dim] (Gemma 3)
    pub k_norm: Option<W>,         // [head_dim] (Gemma 3)
    pub post_attn_norm: Option<W>, // [n_embd] (Gemma 3)
    pub ffn_norm: W,               // [n_embd]
    /// Gate and up, [n_embd, n_ff] each.
    pub gate_up: Proj<W, 2>,
    pub down: W,                  // [n_ff, n_embd]
    pub post_ffn_norm: Option<W>, // [n_embd] (Gemma 3)
}

/// Activation buffers of one backend, sized for its largest batch.
pub struct Scratch<A> {
    pub x: A,    // [n_embd, n_tokens] residual stream
    pub xn: A,   // [n_embd, n_tokens] normalised
    pub q: A,    // [head_dim, n_head, n_tokens]
    pub k: A,    // [head_dim, n_head_kv, n_tokens]
    pub v: A,    // [head_dim, n_head_kv, n_tokens]
    pub qn: A,   // [head_dim, n_head, n_tokens] Q after its norm
    pub kn: A,   // [head_dim, n_head_kv, n_tokens] K after its norm
    pub attn: A, // [head_dim, n_head, n_tokens]
    pub proj: A, // [n_embd, n_tokens]
    pub gate: A, // [n_ff, n_tokens]
    pub up: A,   // [n_ff, n_tokens]
    pub ffn: A,  // [n_ff, n_tokens]
}

/// Attention geometry of layer `il`.
pub fn attention_of(cfg: &Config, il: u32, n_ctx: u32) -> Attention {
    Attention {
        head_dim: cfg.head_dim,
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        n_ctx,
        window: if cfg.is_local(il) {
            cfg.sliding_window
        } else {
            0
        },
        scale: cfg.attn_scale,
    }
}

fn rope_of(cfg: &Config, il: u32, n_heads: u32) -> Rope {
    Rope {
        head_dim: cfg.head_dim,
        n_heads,
        n_rot: cfg.n_rot,
        mode: cfg.rope_mode,
        freq_base: if cfg.is_local(il) {
            cfg.rope_base_swa
        } else {
            cfg.rope_base
        },
        // Linear scaling applies to the global layers only (Gemma 3).
        freq_scale: if cfg.is_local(il) {
            1.0
        } else {
            cfg.rope_scale
        },
    }
}

/// Token embeddings into `s.x`.
pub fn embed<O: Ops>(
    o: &mut O,
    cfg: &Config,
    token_embd: &O::Weight,
    s: &Scratch<O::Act>,
) -> Result<()> {
    o.embed(token_embd, &s.x, cfg.embd_scale)
}

/// One transformer block on the residual stream `s.x`.
pub fn layer<O: Ops>(
    o: &mut O,
    cfg: &Config,
    il: u32,
    n_ctx: u32,
    w: &LayerWeights<O::Weight>,
    s: &Scratch<O::Act>,
) -> Result<()> {
    let (n_embd, eps) = (cfg.n_embd, cfg.eps);
    // Attention.
    o.rms_norm(&s.x, &w.attn_norm, &s.xn, n_embd, 1, eps)?;
    let rope = rope_of(cfg, il, cfg.n_head);
    let attn = attention_of(cfg, il, n_ctx);
    let norms = match (&w.q_norm, &w.k_norm) {
        (Some(q), Some(k)) => Some(HeadNorms { q, k, eps }),
        _ => None,
    };
    let heads = HeadsAttention {
        il: il as usize,
        out: &s.attn,
        rope: &rope,
        k_heads: cfg.n_head_kv,
        attn: &attn,
    };
    let io = ([&s.q, &s.k, &s.v], [&s.qn, &s.kn]);
    o.qkv_attention(&w.qkv, &s.xn, io, norms.as_ref(), &heads)?;
    residual(o, cfg, &w.wo, &s.attn, &w.post_attn_norm, s)?;
    // Feed-forward.
    o.rms_norm(&s.x, &w.ffn_norm, &s.xn, n_embd, 1, eps)?;
    let gate_up = [&s.gate, &s.up];
    o.mul_mat_glu(&w.gate_up, &s.xn, gate_up, &s.ffn, (cfg.n_ff, cfg.act))?;
    residual(o, cfg, &w.down, &s.ffn, &w.post_ffn_norm, s)
}

/// x += W input, through the post-norm when the architecture has one (the product goes
/// to `s.proj` first then).
fn residual<O: Ops>(
    o: &mut O,
    cfg: &Config,
    w: &O::Weight,
    input: &O::Act,
    post_norm: &Option<O::Weight>,
    s: &Scratch<O::Act>,
) -> Result<()> {
    match post_norm {
        Some(pn) => {
            o.mul_mat(w, input, &s.proj, Columns::All)?;
            o.rms_norm_add(&s.x, &s.proj, pn, &s.xn, cfg.n_embd, cfg.eps)
        }
        None => o.mul_mat_add(w, input, &s.x, &s.proj, cfg.n_embd),
    }
}

/// Final norm and the output projection into `logits` ([n_vocab, n_tokens or 1]).
pub fn head<O: Ops>(
    o: &mut O,
    cfg: &Config,
    output_norm: &O::Weight,
    output: &O::Weight,
    s: &Scratch<O::Act>,
    logits: &O::Act,
    cols: Columns,
) -> Result<()> {
    o.rms_norm(&s.x, output_norm, &s.xn, cfg.n_embd, 1, cfg.eps)?;
    o.mul_mat(output, &s.xn, logits, cols)
}
