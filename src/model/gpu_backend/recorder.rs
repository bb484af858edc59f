//! Recording the graph's ops (`graph::Ops`) as bound kernels, once at load: each op
//! becomes the dispatches of its `ops` kernel, and a norm whose readers fold it into
//! their products is dropped from the plan.

use super::*;

/// Records the graph's ops as bound kernels.
pub(super) struct Recorder<'a> {
    ctx: &'a GpuContext,
    step: &'a wgpu::Buffer,
    ids: &'a wgpu::Buffer,
    kv: &'a [(wgpu::Buffer, wgpu::Buffer)],
    probs: &'a wgpu::Buffer,
    chunks: Chunks,
    attn_tex: Option<&'a AttnTextures>,
    /// When set, each layer's last-token attention is kept here ([n_ctx, n_head, n_layer]).
    capture: Option<&'a wgpu::Buffer>,
    /// Where chains run: the buffers odd layers take for Q and its head-normed copy
    /// ([`GpuModel::q_odd`]).
    q_odd: Option<&'a [wgpu::Buffer; 2]>,
    n_head: u32,
    kv_dim: u32,
    n_ctx: u32,
    plan: Vec<Dispatch>,
    /// The last norm of the residual stream, while products may still fold it in.
    pending: Option<PendingNorm>,
}

/// A norm of the residual stream (one row per token) whose readers are still being
/// recorded. Products that read its output may fold it into their kernels
/// (`ops::mul_mat::gpu_normed`); once the next other op is recorded, the norm is
/// settled: kept if a reader did not fold it, dropped otherwise.
struct PendingNorm {
    /// Its index in the plan.
    at: usize,
    x: wgpu::Buffer,
    w: wgpu::Buffer,
    y: wgpu::Buffer,
    n: u32,
    eps: f32,
    /// Whether a product folded it in. A norm settled with none stays as it is: its
    /// output is read by other ops (Gemma's one-head K norm, by RoPE).
    folded: bool,
    /// Whether a product read its output without folding it.
    unfolded: bool,
}

impl<'a> Recorder<'a> {
    /// Settle the pending norm (see [`PendingNorm`]).
    fn settle(&mut self) {
        let Some(p) = self.pending.take() else {
            return;
        };
        if p.unfolded || !p.folded {
            return;
        }
        self.plan.remove(p.at);
    }

    /// Whether a product of `w` reading `x` into `ys` folds the pending norm in. If it
    /// reads the norm's output without folding it, the norm is marked as needed in
    /// every step; if it writes the norm's input or output, the norm is settled first.
    fn folds(&mut self, w: &GpuTensor, x: &wgpu::Buffer, ys: &[&wgpu::Buffer]) -> bool {
        let Some(p) = self.pending.as_ref() else {
            return false;
        };
        if ys.iter().any(|y| **y == p.x || **y == p.y) {
            self.settle();
            return false;
        }
        if *x != p.y {
            return false;
        }
        let fits = p.n as u64 == w.n_cols()
            && ops::mul_mat::folds_norm(self.ctx, w.ty, (w.n_rows(), w.n_cols()), w.memory);
        if let Some(p) = self.pending.as_mut() {
            p.unfolded |= !fits;
        }
        fits
    }

    /// The pending norm's input, weight and epsilon, for a product that folds it in
    /// (which marks it folded).
    fn fold_pending(&mut self) -> Result<(wgpu::Buffer, wgpu::Buffer, f32)> {
        let p = self
            .pending
            .as_mut()
            .ok_or_else(|| Error::gpu("a folded norm with no norm recorded"))?;
        p.folded = true;
        Ok((p.x.clone(), p.w.clone(), p.eps))
    }

    /// A product reading the pending norm's output, with the norm folded in.
    fn mul_mat_normed(
        &mut self,
        w: &GpuTensor,
        ys: &[&wgpu::Buffer],
        rows: &[u32],
        cols: Columns,
    ) -> Result<()> {
        let (x, w_norm, eps) = self.fold_pending()?;
        let norm = ops::mul_mat::Norm {
            x: &x,
            w: &w_norm,
            eps,
        };
        let d = ops::mul_mat::gpu_normed(self.ctx, self.step, w, norm, ys, rows, cols)?;
        self.plan.extend(d);
        Ok(())
    }

    /// Layer `il`'s K and V caches.
    fn cache(&self, il: usize) -> Result<[&'a wgpu::Buffer; 2]> {
        let (kc, vc) = self
            .kv
            .get(il)
            .ok_or_else(|| Error::model(format!("no KV cache for layer {il}")))?;
        Ok([kc, vc])
    }

    /// How layer `il`'s keys and values join its cache: RoPE (after the heads' norms,
    /// given `norms`) into its caches and, where the layer keeps its cache textures,
    /// a single token's into them too (the attention then records no copies).
    fn cache_append<'r>(
        &self,
        il: usize,
        rope: &'r Rope,
        norms: Option<ops::kv_store::QkNorms<'r>>,
        attn: &Attention,
    ) -> Result<ops::kv_store::CacheAppend<'r>>
    where
        'a: 'r,
    {
        Ok(ops::kv_store::CacheAppend {
            rope,
            caches: self.cache(il)?,
            dims: (self.kv_dim, self.n_ctx),
            norms,
            tex: self.layer_textures(il, attn).and_then(|t| t.cache_views()),
        })
    }

    /// `rope_store` (with the heads' norms first, given in `append`; only for batches
    /// with `batches_only`, whose single tokens the Q/K/V product appended), then the
    /// attention: Q is rotated in place, K on its way into layer `il`'s cache.
    fn rope_store_attend(
        &mut self,
        il: usize,
        [q, k, v]: [&wgpu::Buffer; 3],
        append: &ops::kv_store::CacheAppend<'_>,
        batches_only: bool,
        (out, attn): (&wgpu::Buffer, &Attention),
    ) -> Result<()> {
        let d = ops::kv_store::gpu_with_rope(self.ctx, self.step, q, [k, v], append, batches_only)?;
        self.plan.push(d);
        self.attend(il, q, out, attn, append.tex.is_some())
    }

    /// [`Ops::qkv_attention`] with a single token's RoPE and cache append inside the
    /// Q/K/V product (`ops::mul_mat::gpu_qkv_rope`), where the product folds the norm
    /// before it and the device runs it: Q and K in one matrix, V with them or a
    /// product of its own, recorded first. Returns false, having recorded nothing,
    /// where it does not apply.
    fn qkv_rope_attention(
        &mut self,
        w: &Proj<GpuTensor, 3>,
        x: &wgpu::Buffer,
        [q, k, v]: [&wgpu::Buffer; 3],
        norms: Option<&HeadNorms<'_, GpuTensor>>,
        h: &graph::HeadsAttention<'_, wgpu::Buffer>,
    ) -> Result<bool> {
        let (wt, rows, v_apart) = match w {
            Proj::Fused(wt, rows) => (wt, &rows[..], None),
            Proj::Leading { fused, rows, rest } if rows.len() == 2 && rest.len() == 1 => {
                (fused, &rows[..], rest.first())
            }
            _ => return Ok(false),
        };
        let norms = match norms {
            Some(n) => {
                let (wq, wk) = (single(n.q)?, single(n.k)?);
                let eps = n.eps;
                Some(ops::kv_store::QkNorms { q: wq, k: wk, eps })
            }
            None => None,
        };
        let append = self.cache_append(h.il, h.rope, norms, h.attn)?;
        let ys = [q, k, v];
        if !ops::kv_store::rope_store_available(self.ctx)
            || !ops::mul_mat::fuses_rope(self.ctx, wt, &append)
            || !self.folds(wt, x, &ys[..rows.len()])
        {
            return Ok(false);
        }
        if let Some(wv) = v_apart {
            self.mul_mat(wv, x, v, Columns::All)?;
        }
        let (nx, nw, eps) = self.fold_pending()?;
        let norm = ops::mul_mat::Norm {
            x: &nx,
            w: &nw,
            eps,
        };
        let io = (ys, rows);
        let (d, stored) = ops::mul_mat::gpu_qkv_rope(self.ctx, self.step, wt, norm, io, &append)?;
        self.plan.extend(d);
        self.settle();
        self.rope_store_attend(h.il, ys, &append, stored, (h.out, h.attn))?;
        Ok(true)
    }

    /// Layer `il`'s attention textures, where its attention reads them.
    fn layer_textures(&self, il: usize, attn: &Attention) -> Option<LayerTextures<'a>> {
        self.attn_tex
            .and_then(|t| t.layer(il))
            .filter(|_| attn.reads_textures(self.ctx))
    }

    /// Attention over layer `il`'s caches, which already hold this step's keys and
    /// values (and, with `stored`, its kept textures a single token's), and the capture
    /// of its probabilities where one is kept.
    fn attend(
        &mut self,
        il: usize,
        q: &wgpu::Buffer,
        out: &wgpu::Buffer,
        attn: &Attention,
        stored: bool,
    ) -> Result<()> {
        let [kc, vc] = self.cache(il)?;
        let tex = self.attn_tex.and_then(|t| t.layer(il));
        let tex = tex.map(|t| if stored { t.stored_by_store() } else { t });
        let probs = self.probs;
        let d = attn.gpu(self.ctx, self.step, q, kc, vc, probs, out, self.chunks, tex)?;
        self.plan.extend(d);
        if let Some(cap) = self.capture {
            let offset = il as u32 * self.n_head * self.n_ctx;
            let c = ops::attention::capture_gpu(
                self.ctx,
                self.step,
                self.probs,
                cap,
                self.n_head,
                self.n_ctx,
                offset,
                self.chunks,
            )?;
            self.plan.push(c);
        }
        Ok(())
    }
}

impl Ops for Recorder<'_> {
    type Act = wgpu::Buffer;
    type Weight = GpuTensor;

    fn embed(&mut self, w: &GpuTensor, out: &wgpu::Buffer, scale: f32) -> Result<()> {
        self.settle();
        let d = ops::get_rows::gpu(self.ctx, self.step, w, self.ids, out, scale)?;
        self.plan.extend(d);
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &wgpu::Buffer,
        w: &GpuTensor,
        y: &wgpu::Buffer,
        n: u32,
        rows: u32,
        eps: f32,
    ) -> Result<()> {
        self.settle();
        let wb = single(w)?;
        let d = ops::rms_norm::gpu(self.ctx, self.step, x, wb, y, n, rows, eps, Store::Write)?;
        if rows == 1 {
            self.pending = Some(PendingNorm {
                at: self.plan.len(),
                x: x.clone(),
                w: wb.clone(),
                y: y.clone(),
                n,
                eps,
                folded: false,
                unfolded: false,
            });
        }
        self.plan.push(d);
        Ok(())
    }

    fn mul_mat(
        &mut self,
        w: &GpuTensor,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        cols: Columns,
    ) -> Result<()> {
        if self.folds(w, x, &[y]) {
            return self.mul_mat_normed(w, &[y], &[w.n_rows() as u32], cols);
        }
        let d = ops::mul_mat::gpu(self.ctx, self.step, w, x, y, cols, Store::Write)?;
        self.plan.extend(d);
        Ok(())
    }

    fn mul_mat_rows(
        &mut self,
        w: &GpuTensor,
        x: &wgpu::Buffer,
        ys: &[&wgpu::Buffer],
        rows: &[u32],
    ) -> Result<()> {
        if self.folds(w, x, ys) {
            return self.mul_mat_normed(w, ys, rows, Columns::All);
        }
        let d = ops::mul_mat::gpu_rows(self.ctx, self.step, w, x, ys, rows)?;
        self.plan.extend(d);
        Ok(())
    }

    fn rope(&mut self, x: &wgpu::Buffer, rope: &Rope) -> Result<()> {
        self.settle();
        let d = rope.gpu(self.ctx, self.step, x)?;
        self.plan.push(d);
        Ok(())
    }

    fn rope_qk(
        &mut self,
        q: &wgpu::Buffer,
        k: &wgpu::Buffer,
        rope: &Rope,
        k_heads: u32,
    ) -> Result<()> {
        self.settle();
        let d = rope.gpu_pair(self.ctx, self.step, q, Some((k, k_heads)))?;
        self.plan.push(d);
        Ok(())
    }

    fn rope_attention(
        &mut self,
        il: usize,
        [q, k, v]: [&wgpu::Buffer; 3],
        out: &wgpu::Buffer,
        rope: &Rope,
        k_heads: u32,
        attn: &Attention,
    ) -> Result<()> {
        self.settle();
        if !ops::kv_store::rope_store_available(self.ctx) {
            self.rope_qk(q, k, rope, k_heads)?;
            return self.attention(il, q, k, v, out, attn);
        }
        let append = self.cache_append(il, rope, None, attn)?;
        self.rope_store_attend(il, [q, k, v], &append, false, (out, attn))
    }

    fn norm_rope_attention(
        &mut self,
        il: usize,
        qkv: [&wgpu::Buffer; 3],
        [qn, kn]: [&wgpu::Buffer; 2],
        norms: &HeadNorms<'_, GpuTensor>,
        out: &wgpu::Buffer,
        rope: &Rope,
        k_heads: u32,
        attn: &Attention,
    ) -> Result<()> {
        self.settle();
        let (wq, wk) = (single(norms.q)?, single(norms.k)?);
        let fused = ops::kv_store::qk_norms_available(self.ctx, rope.head_dim)
            && is_vector_uniform(wq)
            && is_vector_uniform(wk);
        if !fused {
            let heads = graph::HeadsAttention {
                il,
                out,
                rope,
                k_heads,
                attn,
            };
            return graph::norms_then_rope_attention(self, qkv, [qn, kn], norms, &heads);
        }
        let norms = ops::kv_store::QkNorms {
            q: wq,
            k: wk,
            eps: norms.eps,
        };
        let append = self.cache_append(il, rope, Some(norms), attn)?;
        self.rope_store_attend(il, qkv, &append, false, (out, attn))
    }

    fn qkv_attention(
        &mut self,
        w: &Proj<GpuTensor, 3>,
        x: &wgpu::Buffer,
        (qkv, normed): ([&wgpu::Buffer; 3], [&wgpu::Buffer; 2]),
        norms: Option<&HeadNorms<'_, GpuTensor>>,
        h: &graph::HeadsAttention<'_, wgpu::Buffer>,
    ) -> Result<()> {
        // Odd layers' Q in buffers of their own where chains run: a chain that starts
        // with a layer's attention, which reads Q as a uniform, ends with the next
        // layer's Q/K/V product, which writes Q (`ops::chain`), and wgpu allows a buffer
        // one kind of use per dispatch.
        let (qkv, normed) = match self.q_odd {
            Some([q, qn]) if h.il % 2 == 1 => ([q, qkv[1], qkv[2]], [qn, normed[1]]),
            _ => (qkv, normed),
        };
        if self.qkv_rope_attention(w, x, qkv, norms, h)? {
            return Ok(());
        }
        graph::qkv_then_attention(self, w, x, (qkv, normed), norms, h)
    }

    fn attention(
        &mut self,
        il: usize,
        q: &wgpu::Buffer,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        out: &wgpu::Buffer,
        attn: &Attention,
    ) -> Result<()> {
        self.settle();
        let [kc, vc] = self.cache(il)?;
        let store = ops::kv_store::gpu(self.ctx, self.step, k, v, kc, vc, self.kv_dim, self.n_ctx)?;
        self.plan.push(store);
        self.attend(il, q, out, attn, false)
    }

    fn glu(
        &mut self,
        gate: &wgpu::Buffer,
        up: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: u32,
        act: Activation,
    ) -> Result<()> {
        self.settle();
        let d = ops::glu::gpu(self.ctx, self.step, gate, up, out, n, act)?;
        self.plan.push(d);
        Ok(())
    }

    fn mul_mat_glu(
        &mut self,
        w: &Proj<GpuTensor, 2>,
        x: &wgpu::Buffer,
        [gate, up]: [&wgpu::Buffer; 2],
        out: &wgpu::Buffer,
        (n, act): (u32, Activation),
    ) -> Result<()> {
        let wt = match w {
            Proj::Fused(wt, rows) if *rows == [n, n] && self.ctx.fused_outputs() => wt,
            _ => return graph::products_then_glu(self, w, x, [gate, up], out, (n, act)),
        };
        let glu = ops::mul_mat::Glu { out, act };
        let norm = match self.folds(wt, x, &[gate, up]) {
            true => self.pending.as_mut(),
            false => None,
        };
        let norm = norm.map(|p| {
            p.folded = true;
            ops::mul_mat::Norm {
                x: &p.x,
                w: &p.w,
                eps: p.eps,
            }
        });
        let io = (x, norm);
        let (d, stored) = ops::mul_mat::gpu_gate_up(self.ctx, self.step, wt, io, [gate, up], glu)?;
        self.plan.extend(d);
        self.settle();
        // Batches, and single tokens where the product did not store the activation.
        let d = ops::glu::gpu_in(self.ctx, self.step, [gate, up, out], n, act, stored)?;
        self.plan.push(d);
        Ok(())
    }

    fn add(&mut self, x: &wgpu::Buffer, y: &wgpu::Buffer, n: u32) -> Result<()> {
        self.settle();
        let d = ops::add::gpu(self.ctx, self.step, x, y, n)?;
        self.plan.push(d);
        Ok(())
    }

    // The fused forms: each dispatch costs tens of microseconds on CPU-hosted drivers,
    // whatever its size.
    fn mul_mat_add(
        &mut self,
        w: &GpuTensor,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        _tmp: &wgpu::Buffer,
        _n: u32,
    ) -> Result<()> {
        self.settle();
        let d = ops::mul_mat::gpu(self.ctx, self.step, w, x, y, Columns::All, Store::Add)?;
        self.plan.extend(d);
        Ok(())
    }

    fn rms_norm_add(
        &mut self,
        x: &wgpu::Buffer,
        p: &wgpu::Buffer,
        w: &GpuTensor,
        _tmp: &wgpu::Buffer,
        n: u32,
        eps: f32,
    ) -> Result<()> {
        self.settle();
        let wb = single(w)?;
        let d = ops::rms_norm::gpu(self.ctx, self.step, p, wb, x, n, 1, eps, Store::Add)?;
        self.plan.push(d);
        Ok(())
    }
}

/// The buffer of a tensor that must fit one binding (norm weights).
fn single(w: &GpuTensor) -> Result<&wgpu::Buffer> {
    if w.ty != crate::quant::GgmlType::F32 {
        return Err(Error::Unsupported(format!(
            "tensor {}: {} norm weights (the GPU norm kernels read F32)",
            w.name, w.ty
        )));
    }
    match w.parts.as_slice() {
        [p] => p
            .buffer()
            .ok_or_else(|| Error::gpu(format!("{}: norm weights held in a texture", w.name))),
        _ => Err(Error::gpu(format!(
            "{}: expected a single buffer, found {} parts",
            w.name,
            w.parts.len()
        ))),
    }
}

impl GpuModel {
    fn recorder(&self) -> Recorder<'_> {
        Recorder {
            ctx: &self.ctx,
            step: &self.step,
            ids: &self.ids,
            kv: &self.kv,
            probs: &self.probs,
            chunks: self.chunks,
            attn_tex: self.attn_tex.as_ref(),
            capture: self.capture.as_ref(),
            q_odd: self.q_odd.as_ref(),
            n_head: self.cfg.n_head,
            kv_dim: self.cfg.kv_dim(),
            n_ctx: self.n_ctx,
            plan: Vec::new(),
            pending: None,
        }
    }

    pub(super) fn record(
        &self,
        f: impl FnOnce(&mut Recorder<'_>, &GpuModel) -> Result<()>,
    ) -> Result<Vec<Dispatch>> {
        let mut r = self.recorder();
        f(&mut r, self)?;
        r.settle();
        Ok(r.plan)
    }

    pub(super) fn record_head(
        &self,
        r: &mut Recorder<'_>,
        logits: &wgpu::Buffer,
        cols: Columns,
    ) -> Result<()> {
        let output = self.weights.output_projection()?;
        graph::head(
            r,
            &self.cfg,
            &self.weights.output_norm,
            output,
            &self.scratch,
            logits,
            cols,
        )
    }
}
