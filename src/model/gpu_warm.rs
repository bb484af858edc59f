//! Compiling a model's heaviest GPU pipelines ahead of recording its graph.
//!
//! Recording binds uploaded buffers, so it waits for the upload; the pipelines it binds
//! need only the weights' types. [`warm`] walks the same graph over the file's tensor
//! table for the embedding, matmul and attention kernels and compiles them on threads
//! of their own (one per core, each taking the next pipeline) while the weights upload:
//! on lavapipe those kernels take 0.17-0.3 s to build one after another, longer than
//! the upload itself. Recording then finds them in the cache (or waits for the one in
//! progress). Warming is only ahead-of-time work: its errors are dropped, and recording
//! reports any that are real.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Mutex;

use super::config::Config;
use super::graph::{self, HeadNorms, HeadsAttention, Ops, Proj};
use super::weights;
use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::ops::attention::Attention;
use crate::ops::glu::Activation;
use crate::ops::mul_mat::{self, Columns};
use crate::ops::rope::Rope;
use crate::ops::WarmJob;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// What the pipelines of an op on a weight depend on.
#[derive(Clone, Copy)]
struct Shape {
    ty: GgmlType,
    n_cols: u64,
    /// Rows (of every matrix fused into it): large products of the last token run
    /// another variant (`mul_mat::warm`).
    n_rows: u64,
}

/// Most threads that compile at once: each holds a compiler's working memory.
const MAX_THREADS: usize = 4;

/// [`Ops`] that list the pipelines to compile instead of recording dispatches.
struct Warm<'a> {
    ctx: &'a GpuContext,
    /// Tokens in the first step: the batch builds it runs are compiled too.
    batch: u32,
    jobs: Vec<WarmJob<'a>>,
    mats: HashSet<(GgmlType, u64, u64, Columns, bool, bool)>,
    attention: bool,
    /// The Q/K/V products' builds that end with RoPE: (type, row length, rows, heads'
    /// norms, kept textures).
    ropes: HashSet<(GgmlType, u64, u64, bool, bool)>,
    /// The row length of the last norm of the residual stream, while the products
    /// after it may fold it in (as `gpu_backend`'s recorder does).
    norm: Option<u32>,
}

impl Warm<'_> {
    /// The pipelines of a type, row length and columns, whether products replace their
    /// outputs or add to them; with the norm before them folded in where the recorder
    /// will fold it (`reads_norm`: the product reads the last norm's output). `plain`:
    /// one output and no GLU store (`mul_mat::warm`).
    fn mat(&mut self, w: &Shape, cols: Columns, (reads_norm, plain): (bool, bool)) -> Result<()> {
        let (ctx, ty, n_cols, n_rows, batch) = (self.ctx, w.ty, w.n_cols, w.n_rows, self.batch);
        let normed = reads_norm
            && self.norm.is_some_and(|n| n as u64 == n_cols)
            && mul_mat::folds_norm(ctx, ty, (n_rows, n_cols), ctx.matrix_memory(ty));
        if self.mats.insert((ty, n_cols, n_rows, cols, normed, plain)) {
            self.jobs.push(Box::new(move || {
                mul_mat::warm(ctx, (ty, n_rows, n_cols), (cols, normed, plain), batch)
            }));
        }
        Ok(())
    }
}

impl Ops for Warm<'_> {
    type Act = ();
    type Weight = Shape;

    fn embed(&mut self, w: &Shape, _: &(), _: f32) -> Result<()> {
        self.norm = None;
        let (ctx, ty) = (self.ctx, w.ty);
        self.jobs
            .push(Box::new(move || crate::ops::get_rows::warm(ctx, ty)));
        Ok(())
    }

    fn rms_norm(&mut self, _: &(), _: &Shape, _: &(), n: u32, rows: u32, _: f32) -> Result<()> {
        self.norm = (rows == 1).then_some(n);
        Ok(())
    }

    // The graph's products read the norm just before them, if any.
    fn mul_mat(&mut self, w: &Shape, _: &(), _: &(), cols: Columns) -> Result<()> {
        self.mat(w, cols, (true, true))
    }

    fn rope(&mut self, _: &(), _: &Rope) -> Result<()> {
        self.norm = None;
        Ok(())
    }

    // Single tokens run the Q/K/V product's build that ends with RoPE where the norm
    // before it folds in (as `gpu_backend`'s recorder does), writing the layer's kept
    // textures where the attention reads textures (kept within their budget).
    fn qkv_attention(
        &mut self,
        w: &Proj<Shape, 3>,
        x: &(),
        io: ([&(); 3], [&(); 2]),
        norms: Option<&HeadNorms<'_, Shape>>,
        h: &HeadsAttention<'_, ()>,
    ) -> Result<()> {
        let fused = match w {
            Proj::Fused(s, _) => Some(*s),
            Proj::Leading { fused, rows, rest } if rows.len() == 2 && rest.len() == 1 => {
                Some(*fused)
            }
            _ => None,
        };
        let ctx = self.ctx;
        let folds = |s: &Shape| {
            let memory = ctx.matrix_memory(s.ty);
            mul_mat::folds_norm(ctx, s.ty, (s.n_rows, s.n_cols), memory)
        };
        let fits = h.rope.head_dim % 8 == 0;
        if let Some(s) = fused.filter(|s| fits && self.norm == Some(s.n_cols as u32) && folds(s)) {
            let (ty, shape) = (s.ty, (s.ty, s.n_rows, s.n_cols));
            let build = (norms.is_some(), h.attn.reads_textures(ctx));
            if self
                .ropes
                .insert((ty, s.n_cols, s.n_rows, build.0, build.1))
            {
                self.jobs
                    .push(Box::new(move || mul_mat::warm_rope(ctx, shape, build)));
            }
        }
        graph::qkv_then_attention(self, w, x, io, norms, h)
    }

    fn attention(&mut self, _: usize, _: &(), _: &(), _: &(), _: &(), a: &Attention) -> Result<()> {
        self.norm = None;
        // Once: every layer runs the same kernels.
        if !self.attention {
            self.attention = true;
            self.jobs
                .extend(crate::ops::attention::warm_jobs(self.ctx, a, self.batch));
        }
        Ok(())
    }

    fn glu(&mut self, _: &(), _: &(), _: &(), _: u32, _: Activation) -> Result<()> {
        self.norm = None;
        Ok(())
    }

    fn add(&mut self, _: &(), _: &(), _: u32) -> Result<()> {
        self.norm = None;
        Ok(())
    }

    fn mul_mat_add(&mut self, w: &Shape, _: &(), _: &(), _: &(), _: u32) -> Result<()> {
        self.norm = None;
        self.mat(w, Columns::All, (false, true))
    }

    // A fused product stores into several outputs (one output is a plain product).
    fn mul_mat_rows(&mut self, w: &Shape, _: &(), _: &[&()], rows: &[u32]) -> Result<()> {
        self.mat(w, Columns::All, (true, rows.len() == 1))
    }

    fn rms_norm_add(&mut self, _: &(), _: &(), _: &Shape, _: &(), _: u32, _: f32) -> Result<()> {
        self.norm = None;
        Ok(())
    }
}

/// Compile the pipelines a GPU model of `layers` (with the embedding if `embeds`, and
/// the head if `head`) will bind for single tokens and for a first step of `batch`
/// tokens.
pub fn warm(
    ctx: &GpuContext,
    file: &GgufFile,
    cfg: &Config,
    (layers, embeds, head): (&Range<u32>, bool, bool),
    batch: u32,
) -> Result<()> {
    let mut shape = |name: &str| -> Result<Shape> {
        let t = file
            .tensor(name)
            .ok_or_else(|| Error::model(format!("missing tensor {name}")))?;
        Ok(Shape {
            ty: t.ty,
            n_cols: t.dims.first().copied().unwrap_or(0),
            n_rows: t.dims.get(1).copied().unwrap_or(1),
        })
    };
    let scratch = graph::Scratch {
        x: (),
        xn: (),
        q: (),
        k: (),
        v: (),
        qn: (),
        kn: (),
        attn: (),
        proj: (),
        gate: (),
        up: (),
        ffn: (),
    };
    let mut o = Warm {
        ctx,
        batch,
        jobs: Vec::new(),
        mats: HashSet::new(),
        attention: false,
        ropes: HashSet::new(),
        norm: None,
    };
    if embeds {
        graph::embed(&mut o, cfg, &shape("token_embd.weight")?, &scratch)?;
    }
    for il in layers.clone() {
        let w = weights::layer(file, cfg, il, &mut shape, &mut |names| {
            fused_shape(ctx, file, names)
        })?;
        graph::layer(&mut o, cfg, il, 0, &w, &scratch)?;
    }
    if head {
        let output = match file.tensor("output.weight") {
            Some(_) => shape("output.weight")?,
            None => shape("token_embd.weight")?,
        };
        let norm = shape("output_norm.weight")?;
        graph::head(&mut o, cfg, &norm, &output, &scratch, &(), Columns::Last)?;
        // Greedy decoding's last kernel and top-k sampling's: small, but built on first
        // use they would delay the first token.
        let n_vocab = cfg.n_vocab;
        o.jobs
            .push(Box::new(move || crate::ops::argmax::warm(ctx, n_vocab)));
        if ctx.top_k_on_device() {
            o.jobs.push(Box::new(move || crate::ops::top_k::warm(ctx)));
        }
    }
    run(o.jobs);
    Ok(())
}

/// Run `jobs` on up to one thread per core, this one included, each taking the next
/// job in graph order (the order recording will want them in).
fn run(jobs: Vec<WarmJob<'_>>) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.clamp(1, MAX_THREADS).min(jobs.len());
    let queue = Mutex::new(jobs.into_iter());
    let work = || loop {
        let job = match queue.lock() {
            Ok(mut q) => q.next(),
            Err(_) => None,
        };
        match job {
            // Errors are recording's to report.
            Some(job) => drop(job()),
            None => break,
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
}

/// The shape of the matrix `names` fuse into on the GPU, if they do.
fn fused_shape(ctx: &GpuContext, file: &GgufFile, names: &[&str]) -> Result<Option<Shape>> {
    Ok(
        super::gpu_backend::fusable(ctx, file, names).map(|infos| Shape {
            ty: infos[0].ty,
            n_cols: infos[0].dims[0],
            n_rows: infos
                .iter()
                .map(|i| i.dims.get(1).copied().unwrap_or(1))
                .sum(),
        }),
    )
}
