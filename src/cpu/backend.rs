//! The CPU backend: the transformer graph of `model::graph` run op by op on the CPU,
//! with weights read in place from the GGUF file map.
//!
//! Layers are loaded for a range, so a split engine can run the first layers elsewhere
//! and hand the residual stream to [`CpuModel::step_hidden`] for the rest.

use std::cell::{Cell, Ref, RefCell, RefMut};
use std::ops::Range;
use std::sync::Arc;

use super::act::ActType;
use super::attention::{self, AttnScratch};
use super::dot::Isa;
use super::kv_cache::KvCache;
use super::matmul::{mul_mat_quantized, WeightView};
use super::ops;
use super::pool::Pool;
use crate::gguf::{GgufFile, TensorInfo};
use crate::model::gpu_backend::Logits;
use crate::model::graph::{self, Ops, Proj, Scratch};
use crate::model::weights::{self, ModelWeights};
use crate::model::Config;
use crate::ops::attention::Attention;
use crate::ops::glu::Activation;
use crate::ops::mul_mat::Columns;
use crate::ops::rope::Rope;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// A weight tensor on the CPU: its bytes stay in the file map, which the tensor keeps
/// alive. One-dimensional tensors (norm weights, a few hundred values) are also kept
/// decoded to f32, since every op reads them as floats.
pub struct CpuTensor {
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions in ggml order (ne[0] innermost).
    pub ne: Vec<u64>,
    file: Arc<GgufFile>,
    offset: usize,
    len: usize,
    values: Vec<f32>,
}

impl CpuTensor {
    /// The tensor `info` of `file`, borrowed in place.
    pub fn new(file: &Arc<GgufFile>, info: &TensorInfo) -> Result<CpuTensor> {
        let data = file.tensor_data(info);
        let offset = (data.as_ptr() as usize).wrapping_sub(file.bytes().as_ptr() as usize);
        if data.len() as u64 != info.n_bytes || info.dims.is_empty() {
            return Err(Error::model(format!(
                "tensor {} does not lie within the file",
                info.name
            )));
        }
        let mut t = CpuTensor {
            name: info.name.clone(),
            ty: info.ty,
            ne: info.dims.clone(),
            file: file.clone(),
            offset,
            len: data.len(),
            values: Vec::new(),
        };
        if t.ne.len() == 1 {
            let n = usize::try_from(t.ne[0]).map_err(|_| Error::model("tensor too large"))?;
            let mut v = vec![0f32; n];
            crate::quant::dequantize(t.ty, t.data(), &mut v)
                .map_err(|e| Error::model(format!("{}: {e}", t.name)))?;
            t.values = v;
        }
        Ok(t)
    }

    /// The tensor's bytes in the file map.
    pub fn data(&self) -> &[u8] {
        self.file
            .bytes()
            .get(self.offset..self.offset + self.len)
            .unwrap_or(&[])
    }

    pub fn n_cols(&self) -> usize {
        self.ne.first().copied().unwrap_or(0) as usize
    }

    /// Rows: the product of every dimension past the first.
    pub fn n_rows(&self) -> usize {
        self.ne.iter().skip(1).product::<u64>() as usize
    }

    pub fn view(&self) -> WeightView<'_> {
        WeightView {
            ty: self.ty,
            data: self.data(),
            n_cols: self.n_cols(),
            n_rows: self.n_rows(),
        }
    }

    /// A one-dimensional tensor's values.
    fn vector(&self, n: usize) -> Result<&[f32]> {
        self.values
            .get(..n)
            .ok_or_else(|| Error::model(format!("{}: expected a vector of {n} values", self.name)))
    }
}

/// An activation buffer. Ops take the graph's buffers by shared reference, so the data
/// sits in a `RefCell`; `version` changes on every write, which lets a matmul reuse
/// the quantized form of an input that has not changed (Q, K and V share one input).
pub struct CpuAct {
    data: RefCell<Vec<f32>>,
    version: Cell<u64>,
}

impl CpuAct {
    fn new(n: usize) -> CpuAct {
        CpuAct {
            data: RefCell::new(vec![0.0; n]),
            version: Cell::new(0),
        }
    }

    fn read(&self) -> Result<Ref<'_, Vec<f32>>> {
        self.data
            .try_borrow()
            .map_err(|_| Error::invalid("an activation is both read and written by one op"))
    }

    fn write(&self) -> Result<RefMut<'_, Vec<f32>>> {
        self.version.set(self.version.get().wrapping_add(1));
        self.data
            .try_borrow_mut()
            .map_err(|_| Error::invalid("an activation is both read and written by one op"))
    }

    fn id(&self) -> (usize, u64) {
        (self as *const CpuAct as usize, self.version.get())
    }
}

/// `len` values of `v`, or an error naming the op.
fn part<'a>(v: &'a [f32], len: usize, op: &str) -> Result<&'a [f32]> {
    v.get(..len)
        .ok_or_else(|| Error::invalid(format!("{op}: buffer of {} < {len}", v.len())))
}

fn part_mut<'a>(v: &'a mut [f32], len: usize, op: &str) -> Result<&'a mut [f32]> {
    let n = v.len();
    v.get_mut(..len)
        .ok_or_else(|| Error::invalid(format!("{op}: buffer of {n} < {len}")))
}

/// What quantized activations were made from: (buffer, its version), format, first
/// column, columns.
type QKey = ((usize, u64), ActType, usize, usize);

/// Reusable working memory of the ops.
struct Work {
    /// Quantized activations of the last matmul input, and what they were made from:
    /// (buffer, its version, format, first column, columns).
    qbuf: Vec<u8>,
    qkey: Option<QKey>,
    /// `qbuf` rearranged for the tile kernels, and the input it was made from.
    #[cfg(target_arch = "x86_64")]
    plan: super::tile::Plan,
    plan_key: Option<QKey>,
    rope: ops::RopeTable,
    attn: AttnScratch,
}

/// The graph's ops, executed as they are called, for one step.
struct CpuOps<'a> {
    pool: &'a Pool,
    isa: Isa,
    kv: &'a mut [Option<KvCache>],
    work: &'a mut Work,
    tokens: &'a [u32],
    pos: u32,
    n_tokens: usize,
}

impl CpuOps<'_> {
    /// Quantizes the input of `w`'s product (its columns `cols`) for `w`'s type, unless
    /// the last product's input was the same; the key of what `work.qbuf` now holds.
    fn quantize(&mut self, w: &CpuTensor, x: &CpuAct, cols: Columns) -> Result<QKey> {
        let n_cols = w.n_cols();
        let (first, n) = match cols {
            Columns::All => (0, self.n_tokens),
            Columns::Last => (self.n_tokens - 1, 1),
        };
        let at = ActType::for_weight(w.ty)?;
        let key = (x.id(), at, first, n);
        if self.work.qkey != Some(key) {
            let xv = x.read()?;
            let xs = xv
                .get(first * n_cols..(first + n) * n_cols)
                .ok_or_else(|| Error::invalid(format!("{}: input too short", w.name)))?;
            self.work.qkey = None;
            super::act::quantize_rows_on(self.pool, at, xs, n_cols, &mut self.work.qbuf)?;
            self.work.qkey = Some(key);
        }
        Ok(key)
    }

    /// Rearranges `work.qbuf` (made under `key`) for the tile kernels, unless the plan
    /// already holds it.
    #[cfg(target_arch = "x86_64")]
    fn plan(&mut self, key: QKey, n_cols: usize) -> Result<()> {
        if self.work.plan_key != Some(key) {
            self.work.plan_key = None;
            let (at, n) = (key.1, key.3);
            self.work
                .plan
                .build_on(self.pool, at, &self.work.qbuf, n_cols, n)?;
            self.work.plan_key = Some(key);
        }
        Ok(())
    }

    /// out = act(gate x) * (up x) over this step's batch in one op
    /// ([`super::matmul::mul_mat_tiled_glu`]), where the batch is blocked and both
    /// matrices (`n` rows each) have a tile kernel for it; false (nothing done)
    /// otherwise.
    #[cfg(target_arch = "x86_64")]
    fn batch_glu(
        &mut self,
        ws: [&CpuTensor; 2],
        x: &CpuAct,
        out: &CpuAct,
        n: usize,
        act: Activation,
    ) -> Result<bool> {
        if !super::tile::blocked_for(self.n_tokens)
            || ws.iter().any(|w| w.n_rows() != n)
            || !self.shared_plan(&ws, self.n_tokens)?
        {
            return Ok(false);
        }
        let key = self.quantize(ws[0], x, Columns::All)?;
        self.plan(key, ws[0].n_cols())?;
        let mut o = out.write()?;
        let os = part_mut(&mut o, n * self.n_tokens, &ws[0].name)?;
        let (g, u) = (ws[0].view(), ws[1].view());
        let plan = &self.work.plan;
        super::matmul::mul_mat_tiled_glu(self.pool, self.isa, [&g, &u], plan, os, act)?;
        Ok(true)
    }

    /// Whether `ws` can share one plan of a single token ([`CpuOps::shared_plan`]).
    #[cfg(target_arch = "x86_64")]
    fn one_plan(&self, ws: &[&CpuTensor]) -> Result<bool> {
        self.shared_plan(ws, 1)
    }

    /// Whether `ws` can share one plan of `n_tokens` tokens: the same activation
    /// format and width, and a tile kernel each.
    #[cfg(target_arch = "x86_64")]
    fn shared_plan(&self, ws: &[&CpuTensor], n_tokens: usize) -> Result<bool> {
        let Some(first) = ws.first() else {
            return Ok(false);
        };
        let at = ActType::for_weight(first.ty)?;
        for w in ws {
            if ActType::for_weight(w.ty)? != at
                || w.n_cols() != first.n_cols()
                || super::matmul::tile_kernel(w.ty, self.isa, n_tokens).is_none()
            {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Ops for CpuOps<'_> {
    type Act = CpuAct;
    type Weight = CpuTensor;

    fn embed(&mut self, w: &CpuTensor, out: &CpuAct, scale: f32) -> Result<()> {
        let n = w.n_cols();
        let rb = w.view().row_bytes()?;
        let mut o = out.write()?;
        let o = part_mut(&mut o, n * self.tokens.len(), "embed")?;
        for (&t, orow) in self.tokens.iter().zip(o.chunks_exact_mut(n)) {
            let row = w
                .data()
                .get(t as usize * rb..(t as usize + 1) * rb)
                .ok_or_else(|| Error::invalid(format!("token {t} outside {}", w.name)))?;
            crate::quant::dequantize(w.ty, row, orow)?;
            if scale != 1.0 {
                orow.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &CpuAct,
        w: &CpuTensor,
        y: &CpuAct,
        n: u32,
        rows_per_token: u32,
        eps: f32,
    ) -> Result<()> {
        let len = n as usize * rows_per_token as usize * self.n_tokens;
        let xv = x.read()?;
        let mut yv = y.write()?;
        ops::rms_norm(
            self.pool,
            part(&xv, len, "rms_norm")?,
            w.vector(n as usize)?,
            part_mut(&mut yv, len, "rms_norm")?,
            n as usize,
            eps,
        )
    }

    fn mul_mat(&mut self, w: &CpuTensor, x: &CpuAct, y: &CpuAct, cols: Columns) -> Result<()> {
        let view = w.view();
        let n = match cols {
            Columns::All => self.n_tokens,
            Columns::Last => 1,
        };
        let key = self.quantize(w, x, cols)?;
        let mut yv = y.write()?;
        let ys = part_mut(&mut yv, view.n_rows * n, &w.name)?;
        #[cfg(target_arch = "x86_64")]
        if super::matmul::tile_kernel(w.ty, self.isa, n).is_some() {
            self.plan(key, view.n_cols)?;
            return super::matmul::mul_mat_tiled(self.pool, self.isa, &view, &self.work.plan, ys);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = key;
        mul_mat_quantized(self.pool, self.isa, &view, &self.work.qbuf, n, ys)
    }

    fn mul_mat_each(&mut self, ws: &[&CpuTensor], x: &CpuAct, ys: &[&CpuAct]) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if self.n_tokens == 1 && ws.len() == ys.len() && self.one_plan(ws)? {
            let key = self.quantize(ws[0], x, Columns::All)?;
            self.plan(key, ws[0].n_cols())?;
            let views: Vec<_> = ws.iter().map(|w| w.view()).collect();
            let mut outs = ys.iter().map(|y| y.write()).collect::<Result<Vec<_>>>()?;
            let mut parts = outs
                .iter_mut()
                .zip(ws)
                .map(|(o, w)| part_mut(o, w.n_rows(), &w.name))
                .collect::<Result<Vec<_>>>()?;
            let plan = &self.work.plan;
            return super::matmul::mul_mat_tiled_each(
                self.pool, self.isa, &views, plan, &mut parts,
            );
        }
        graph::products_one_by_one(self, ws, x, ys)
    }

    fn mul_mat_glu(
        &mut self,
        w: &Proj<CpuTensor, 2>,
        x: &CpuAct,
        [gate, up]: [&CpuAct; 2],
        out: &CpuAct,
        (n, act): (u32, Activation),
    ) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if let Proj::Split([g, u]) = w {
            if self.batch_glu([g, u], x, out, n as usize, act)? {
                return Ok(());
            }
        }
        graph::products_then_glu(self, w, x, [gate, up], out, (n, act))
    }

    fn rope(&mut self, x: &CpuAct, rope: &Rope) -> Result<()> {
        let len = (rope.head_dim * rope.n_heads) as usize * self.n_tokens;
        let mut xv = x.write()?;
        ops::rope(
            self.pool,
            rope,
            part_mut(&mut xv, len, "rope")?,
            self.pos,
            &mut self.work.rope,
        )
    }

    fn attention(
        &mut self,
        il: usize,
        q: &CpuAct,
        k: &CpuAct,
        v: &CpuAct,
        out: &CpuAct,
        attn: &Attention,
    ) -> Result<()> {
        let cache = self
            .kv
            .get_mut(il)
            .and_then(|c| c.as_mut())
            .ok_or_else(|| Error::model(format!("no KV cache for layer {il}")))?;
        let pos = self.pos as usize;
        cache.store(&k.read()?, &v.read()?, pos, self.n_tokens)?;
        let qv = q.read()?;
        let mut ov = out.write()?;
        attention::attention(
            self.pool,
            attn,
            &qv,
            cache,
            &mut ov,
            pos,
            self.n_tokens,
            &self.work.attn,
        )
    }

    fn glu(
        &mut self,
        gate: &CpuAct,
        up: &CpuAct,
        out: &CpuAct,
        n: u32,
        act: Activation,
    ) -> Result<()> {
        let len = n as usize * self.n_tokens;
        let (g, u) = (gate.read()?, up.read()?);
        let mut o = out.write()?;
        ops::glu(
            self.pool,
            part(&g, len, "glu")?,
            part(&u, len, "glu")?,
            part_mut(&mut o, len, "glu")?,
            act,
        );
        Ok(())
    }

    fn add(&mut self, x: &CpuAct, y: &CpuAct, n: u32) -> Result<()> {
        let len = n as usize * self.n_tokens;
        let yv = y.read()?;
        let mut xv = x.write()?;
        ops::add(part_mut(&mut xv, len, "add")?, part(&yv, len, "add")?);
        Ok(())
    }
}

/// A model (or a range of its layers) run on the CPU.
pub struct CpuModel {
    pub cfg: Config,
    pub n_ctx: u32,
    /// Largest batch one step takes.
    pub max_batch: u32,
    layers: Range<u32>,
    weights: ModelWeights<CpuTensor>,
    scratch: Scratch<CpuAct>,
    /// [n_vocab] for `Logits::Last`; grown to [n_vocab, max_batch] on the first `All`.
    logits: CpuAct,
    kv: Vec<Option<KvCache>>,
    pool: Pool,
    isa: Isa,
    work: Work,
    /// Keeps the map the weights point into alive.
    _file: Arc<GgufFile>,
}

impl CpuModel {
    /// Every layer of `file` on the CPU, for contexts of `n_ctx` tokens and batches of up
    /// to `n_batch`, on `threads` threads (0: one per core).
    pub fn load(
        file: Arc<GgufFile>,
        cfg: Config,
        n_ctx: u32,
        n_batch: u32,
        threads: usize,
    ) -> Result<CpuModel> {
        let n = cfg.n_layer;
        Self::load_layers(file, cfg, 0..n, n_ctx, n_batch, threads)
    }

    /// Layers `layers` of `file` on the CPU (plus the embedding and the head, which are
    /// only borrowed from the map). KV caches are made for those layers only.
    pub fn load_layers(
        file: Arc<GgufFile>,
        cfg: Config,
        layers: Range<u32>,
        n_ctx: u32,
        n_batch: u32,
        threads: usize,
    ) -> Result<CpuModel> {
        if layers.start > layers.end || layers.end > cfg.n_layer || n_ctx == 0 {
            return Err(Error::invalid(format!(
                "layers {layers:?} of {} with a context of {n_ctx}",
                cfg.n_layer
            )));
        }
        let weights = load_weights(&file, &cfg, &layers)?;
        let max_batch = n_batch.clamp(1, n_ctx);
        let c = &cfg;
        let mb = max_batch as usize;
        let a = |per_token: u32| CpuAct::new(per_token as usize * mb);
        let scratch = Scratch {
            x: a(c.n_embd),
            xn: a(c.n_embd),
            q: a(c.q_dim()),
            k: a(c.kv_dim()),
            v: a(c.kv_dim()),
            qn: a(c.q_dim()),
            kn: a(c.kv_dim()),
            attn: a(c.q_dim()),
            proj: a(c.n_embd),
            gate: a(c.n_ff),
            up: a(c.n_ff),
            ffn: a(c.n_ff),
        };
        let mut kv = Vec::new();
        for il in 0..c.n_layer {
            kv.push(if layers.contains(&il) {
                Some(KvCache::new(c.kv_dim() as usize, n_ctx as usize)?)
            } else {
                None
            });
        }
        let pool = Pool::new(threads);
        let work = Work {
            qbuf: Vec::new(),
            qkey: None,
            #[cfg(target_arch = "x86_64")]
            plan: Default::default(),
            plan_key: None,
            rope: Default::default(),
            attn: AttnScratch::new(pool.n_threads()),
        };
        Ok(CpuModel {
            logits: CpuAct::new(c.n_vocab as usize),
            cfg,
            n_ctx,
            max_batch,
            layers,
            weights,
            scratch,
            kv,
            pool,
            isa: Isa::detect(),
            work,
            _file: file,
        })
    }

    /// Layers this model runs.
    pub fn layers(&self) -> Range<u32> {
        self.layers.clone()
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Chooses the kernels' instruction set (tests compare them); errors if the CPU
    /// lacks it.
    pub fn set_isa(&mut self, isa: Isa) -> Result<()> {
        if !isa.available() {
            return Err(Error::Unsupported(format!("{isa:?} on this CPU")));
        }
        self.isa = isa;
        Ok(())
    }

    fn check_step(&self, n: usize, pos: u32) -> Result<()> {
        if n == 0 || n > self.max_batch as usize {
            return Err(Error::invalid(format!(
                "a step takes 1..={} tokens, got {n}",
                self.max_batch
            )));
        }
        if pos as u64 + n as u64 > self.n_ctx as u64 {
            return Err(Error::invalid(format!(
                "positions {pos}..{} exceed the context of {} tokens",
                pos as u64 + n as u64,
                self.n_ctx
            )));
        }
        Ok(())
    }

    /// Run `tokens` at positions `pos..` through the whole model and return the logits.
    pub fn step(&mut self, tokens: &[u32], pos: u32, mode: Logits) -> Result<Vec<f32>> {
        if self.layers != (0..self.cfg.n_layer) {
            return Err(Error::invalid(format!(
                "this CPU model holds layers {:?} only; use step_hidden",
                self.layers
            )));
        }
        self.check_step(tokens.len(), pos)?;
        if let Some(bad) = tokens.iter().find(|&&t| t >= self.cfg.n_vocab) {
            return Err(Error::invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.n_vocab
            )));
        }
        self.run(tokens, pos, tokens.len(), mode)
    }

    /// Continue from the residual stream `hidden` ([n_embd, n_tokens], the input of layer
    /// `self.layers().start` for tokens at `pos..`) through this model's layers and the
    /// head; returns the logits.
    pub fn step_hidden(
        &mut self,
        hidden: &[f32],
        pos: u32,
        n_tokens: usize,
        mode: Logits,
    ) -> Result<Vec<f32>> {
        self.check_step(n_tokens, pos)?;
        let len = self.cfg.n_embd as usize * n_tokens;
        if hidden.len() != len {
            return Err(Error::invalid(format!(
                "hidden state of {} values, expected {len}",
                hidden.len()
            )));
        }
        self.scratch.x.write()?[..len].copy_from_slice(hidden);
        self.run(&[], pos, n_tokens, mode)
    }

    /// The embedding of `tokens` (when there are any; otherwise the residual stream is
    /// already in `scratch.x`), the layers and the head.
    /// Embed `tokens` and run this model's layers, returning the residual stream
    /// [n_embd, n_tokens] without the head (the first part of a CPU/GPU split).
    pub fn step_to_hidden(&mut self, tokens: &[u32], pos: u32) -> Result<Vec<f32>> {
        self.check_step(tokens.len(), pos)?;
        if let Some(bad) = tokens.iter().find(|&&t| t >= self.cfg.n_vocab) {
            return Err(Error::invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.n_vocab
            )));
        }
        self.run_layers(tokens, pos, tokens.len())?;
        let len = self.cfg.n_embd as usize * tokens.len();
        Ok(self.scratch.x.read()?[..len].to_vec())
    }

    fn run(&mut self, tokens: &[u32], pos: u32, n: usize, mode: Logits) -> Result<Vec<f32>> {
        self.run_layers(tokens, pos, n)?;
        self.run_head(pos, n, mode)
    }

    /// The final norm and output projection over the residual stream `hidden`
    /// ([n_embd, n_tokens]) computed elsewhere.
    pub fn head_from_hidden(&mut self, hidden: &[f32], pos: u32, mode: Logits) -> Result<Vec<f32>> {
        let n = hidden.len() / self.cfg.n_embd.max(1) as usize;
        self.check_step(n, pos)?;
        self.scratch.x.write()?[..hidden.len()].copy_from_slice(hidden);
        self.run_head(pos, n, mode)
    }

    fn run_layers(&mut self, tokens: &[u32], pos: u32, n: usize) -> Result<()> {
        let mut o = CpuOps {
            pool: &self.pool,
            isa: self.isa,
            kv: &mut self.kv,
            work: &mut self.work,
            tokens,
            pos,
            n_tokens: n,
        };
        // Nothing quantized from a previous step may be reused.
        o.work.qkey = None;
        o.work.plan_key = None;
        if !tokens.is_empty() {
            graph::embed(&mut o, &self.cfg, self.weights.embedding()?, &self.scratch)?;
        }
        for il in self.layers.clone() {
            let lw = self
                .weights
                .layers
                .get(il as usize)
                .and_then(|l| l.as_ref())
                .ok_or_else(|| Error::model(format!("layer {il} missing")))?;
            graph::layer(&mut o, &self.cfg, il, self.n_ctx, lw, &self.scratch)?;
        }
        Ok(())
    }

    fn run_head(&mut self, pos: u32, n: usize, mode: Logits) -> Result<Vec<f32>> {
        let n_vocab = self.cfg.n_vocab as usize;
        let (cols, count) = match mode {
            Logits::Last => (Columns::Last, n_vocab),
            Logits::All => (Columns::All, n_vocab * n),
        };
        if self.logits.read()?.len() < count {
            self.logits = CpuAct::new(n_vocab * self.max_batch as usize);
        }
        let mut o = CpuOps {
            pool: &self.pool,
            isa: self.isa,
            kv: &mut self.kv,
            work: &mut self.work,
            tokens: &[],
            pos,
            n_tokens: n,
        };
        o.work.qkey = None;
        o.work.plan_key = None;
        let output = self.weights.output_projection()?;
        graph::head(
            &mut o,
            &self.cfg,
            &self.weights.output_norm,
            output,
            &self.scratch,
            &self.logits,
            cols,
        )?;
        let l = self.logits.read()?;
        Ok(l[..count].to_vec())
    }
}

/// Borrow the weights from the map, checking every shape (as the GPU upload does).
fn load_weights(
    file: &Arc<GgufFile>,
    cfg: &Config,
    layers: &Range<u32>,
) -> Result<ModelWeights<CpuTensor>> {
    let mut load = |name: &str| -> Result<CpuTensor> {
        let info = file
            .tensor(name)
            .ok_or_else(|| Error::model(format!("missing tensor {name}")))?;
        CpuTensor::new(file, info)
    };
    let e = cfg.n_embd as u64;
    weights::expect_dims(file, "token_embd.weight", &[e, cfg.n_vocab as u64])?;
    let token_embd = load("token_embd.weight")?;
    let mut ls = Vec::new();
    for il in 0..cfg.n_layer {
        ls.push(if layers.contains(&il) {
            // The CPU reads every tensor in place from the file map: nothing to fuse.
            Some(weights::layer(file, cfg, il, &mut load, &mut |_| Ok(None))?)
        } else {
            None
        });
    }
    weights::expect_dims(file, "output_norm.weight", &[e])?;
    let output_norm = load("output_norm.weight")?;
    let output = match file.tensor("output.weight") {
        Some(_) => {
            weights::expect_dims(file, "output.weight", &[e, cfg.n_vocab as u64])?;
            Some(load("output.weight")?)
        }
        None => None,
    };
    Ok(ModelWeights {
        token_embd: Some(token_embd),
        layers: ls,
        output_norm,
        output,
    })
}

impl crate::session::Engine for CpuModel {
    fn config(&self) -> &Config {
        &self.cfg
    }
    fn n_ctx(&self) -> u32 {
        self.n_ctx
    }
    fn max_batch(&self, _mode: Logits) -> u32 {
        self.max_batch
    }
    fn step(&mut self, tokens: &[u32], pos: u32, mode: Logits) -> Result<Vec<f32>> {
        CpuModel::step(self, tokens, pos, mode)
    }
    fn device(&self) -> String {
        crate::session::CPU_DEVICE.to_string()
    }
}
