//! Compiling a model's heaviest GPU pipelines ahead of recording its graph.
//!
//! Recording binds uploaded buffers, so it waits for the upload; the pipelines it binds
//! need only the weights' types. [`warm`] walks the same graph over the file's tensor
//! table and compiles the matmul and attention kernels, on a thread of its own, while
//! the weights upload: on lavapipe those kernels take 0.15-0.3 s to build, longer than
//! the upload itself. Recording then finds them in the cache (or waits for the one in
//! progress). Warming is only ahead-of-time work: its errors are dropped, and recording
//! reports any that are real.

use std::ops::Range;

use super::config::Config;
use super::graph::{self, Ops};
use super::weights;
use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::ops::attention::Attention;
use crate::ops::glu::Activation;
use crate::ops::mul_mat::{self, Columns};
use crate::ops::rope::Rope;
use crate::ops::Store;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// What the pipelines of an op on a weight depend on.
#[derive(Clone, Copy)]
struct Shape {
    ty: GgmlType,
    n_cols: u64,
}

/// [`Ops`] that compile pipelines instead of recording dispatches.
struct Warm<'a> {
    ctx: &'a GpuContext,
    attention: bool,
}

impl Warm<'_> {
    fn mat(&self, w: &Shape, store: Store) -> Result<()> {
        mul_mat::warm(self.ctx, w.ty, w.n_cols, store)
    }
}

impl Ops for Warm<'_> {
    type Act = ();
    type Weight = Shape;

    fn embed(&mut self, _: &Shape, _: &(), _: f32) -> Result<()> {
        Ok(())
    }

    fn rms_norm(&mut self, _: &(), _: &Shape, _: &(), _: u32, _: u32, _: f32) -> Result<()> {
        Ok(())
    }

    fn mul_mat(&mut self, w: &Shape, _: &(), _: &(), _: Columns) -> Result<()> {
        self.mat(w, Store::Write)
    }

    fn rope(&mut self, _: &(), _: &Rope) -> Result<()> {
        Ok(())
    }

    fn attention(&mut self, _: usize, _: &(), _: &(), _: &(), _: &(), _: &Attention) -> Result<()> {
        // Once: every layer runs the same kernels.
        if !self.attention {
            self.attention = true;
            crate::ops::attention::warm(self.ctx)?;
        }
        Ok(())
    }

    fn glu(&mut self, _: &(), _: &(), _: &(), _: u32, _: Activation) -> Result<()> {
        Ok(())
    }

    fn add(&mut self, _: &(), _: &(), _: u32) -> Result<()> {
        Ok(())
    }

    fn mul_mat_add(&mut self, w: &Shape, _: &(), _: &(), _: &(), _: u32) -> Result<()> {
        self.mat(w, Store::Add)
    }

    fn mul_mat_rows(&mut self, w: &Shape, _: &(), _: &[&()], _: &[u32]) -> Result<()> {
        self.mat(w, Store::Write)
    }
}

/// Compile the pipelines a GPU model of `layers` (and the head, if `head`) will bind.
pub fn warm(
    ctx: &GpuContext,
    file: &GgufFile,
    cfg: &Config,
    layers: &Range<u32>,
    head: bool,
) -> Result<()> {
    let mut shape = |name: &str| -> Result<Shape> {
        let t = file
            .tensor(name)
            .ok_or_else(|| Error::model(format!("missing tensor {name}")))?;
        Ok(Shape {
            ty: t.ty,
            n_cols: t.dims.first().copied().unwrap_or(0),
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
        attention: false,
    };
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
    }
    Ok(())
}

/// The shape of the matrix `names` fuse into on the GPU, if they do.
fn fused_shape(ctx: &GpuContext, file: &GgufFile, names: &[&str]) -> Result<Option<Shape>> {
    Ok(
        super::gpu_backend::fusable(ctx, file, names).map(|infos| Shape {
            ty: infos[0].ty,
            n_cols: infos[0].dims[0],
        }),
    )
}
