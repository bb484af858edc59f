//! Loading a model onto the GPU: the weights uploaded straight from the file map while
//! the heavy pipelines compile beside them, the activations, caches and attention
//! scratch sized for the context, and the graph recorded.

use super::*;

/// The most bytes of attention probabilities a batch keeps at once (see [`Chunks`]).
const PROBS_BUDGET: u64 = 16 << 20;

impl GpuModel {
    /// Upload `file`'s weights and record the graph for contexts of `n_ctx` tokens and
    /// batches of up to `n_batch`. A lost device is an error saying so.
    pub fn load(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: Config,
        opts: &LoadOptions,
    ) -> Result<GpuModel> {
        ctx.check_lost()?;
        let r = Self::load_on(ctx.clone(), file, cfg, opts);
        ctx.explain_loss(r)
    }

    fn load_on(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: Config,
        opts: &LoadOptions,
    ) -> Result<GpuModel> {
        let (n_ctx, n_batch) = (opts.n_ctx, opts.n_batch);
        if n_ctx == 0 || n_batch == 0 {
            return Err(Error::invalid("context and batch sizes must be at least 1"));
        }
        let layers = opts.layers.clone().unwrap_or(0..cfg.n_layer);
        if layers.start > layers.end || layers.end > cfg.n_layer {
            return Err(Error::invalid(format!(
                "layers {layers:?} of a {}-layer model",
                cfg.n_layer
            )));
        }
        let embeds = layers.start == 0 && !opts.hidden_in;
        // The heavy pipelines compile on a second thread while the weights upload.
        let batch = opts.first_batch.unwrap_or(DEFAULT_FIRST_BATCH);
        let batch = batch.min(n_batch).min(n_ctx);
        let part = (&layers, embeds, opts.head);
        let weights = std::thread::scope(|s| {
            s.spawn(|| crate::model::gpu_warm::warm(&ctx, file, &cfg, part, batch));
            upload_weights(&ctx, file, &cfg, &layers, embeds, opts.head, opts.progress)
        })?;
        // Huge pages for the weights, read whole every step, but not for the caches
        // and activations, mostly untouched at short contexts.
        ctx.end_huge_pages();
        let (max_batch, chunks) = batch_limits(&ctx, &cfg, n_ctx, n_batch)?;
        let scratch = scratch(&ctx, &cfg, max_batch)?;
        let q_odd = match ctx.chains() {
            true => {
                let a = |name| activation(&ctx, name, cfg.q_dim(), max_batch);
                Some([a("q odd")?, a("qn odd")?])
            }
            false => None,
        };
        let kv = kv_caches(&ctx, &cfg, &layers, n_ctx)?;
        let c = &cfg;
        let probs = storage(&ctx, "attn_probs", chunks.probs_bytes(cfg.n_head, n_ctx))?;
        let attn0 = graph::attention_of(c, 0, n_ctx);
        let caches = CacheTextures::for_layers(&attn0, layers.clone());
        let attn_tex = AttnTextures::new(&ctx, &attn0, max_batch, chunks, caches)?;
        let step = ops::uniform(&ctx, "step", &StepInfo::default());
        let ids = storage(&ctx, "ids", max_batch as u64 * 4)?;
        // Whole quads: greedy sampling may copy them into a texture (`ops::argmax`).
        let logits_last = storage(&ctx, "logits", ops::argmax::quad_bytes(c.n_vocab))?;
        let capture = if opts.capture_attention {
            Some(storage(
                &ctx,
                "attention_capture",
                act_bytes(c.n_head * c.n_layer, n_ctx),
            )?)
        } else {
            None
        };
        let readback = Readback::new(&ctx, act_bytes(c.n_vocab.max(c.n_embd * max_batch), 1));
        let submit_every = submit_every(&ctx)?;
        let mut m = GpuModel {
            body: Vec::new(),
            outputs: OutputPlans {
                last: (Vec::new(), logits_last),
                all: None,
                argmax: None,
                top_k: None,
            },
            ctx,
            cfg,
            n_ctx,
            max_batch,
            weights,
            step,
            ids,
            scratch,
            q_odd,
            kv,
            probs,
            chunks,
            attn_tex,
            capture,
            readback,
            layers,
            embeds,
            head: opts.head,
            profiler: None,
            host_times: crate::gpu::profile::HostTimes::from_env(),
            submit_every,
            chains: None,
            pin: None,
            pinned: Vec::new(),
        };
        m.body = m.record(|r, m| {
            if m.embeds {
                graph::embed(r, &m.cfg, m.weights.embedding()?, &m.scratch)?;
            }
            for il in m.layers.clone() {
                let lw = m.weights.layers.get(il as usize).and_then(|l| l.as_ref());
                let lw = lw.ok_or_else(|| Error::model(format!("layer {il} missing")))?;
                graph::layer(r, &m.cfg, il, m.n_ctx, lw, &m.scratch)?;
            }
            Ok(())
        })?;
        m.chains = crate::ops::chain::Chains::link(&m.ctx, &m.body)?;
        if m.head {
            m.outputs.last.0 =
                m.record(|r, m| m.record_head(r, &m.outputs.last.1, Columns::Last))?;
        }
        let n_dispatch = m.body.len() + m.outputs.last.0.len();
        m.profiler = crate::gpu::profile::Profiler::from_env(&m.ctx, n_dispatch);
        m.pin = m.ctx.pins_threads().then(PinWatch::default);
        Ok(m)
    }
}

/// The most tokens a step takes, and how a batch's attention is cut, for a context of
/// `n_ctx` and batches of at most `n_batch`: every activation of a batch must fit one
/// binding, and attention runs in chunks whose probabilities fit a modest scratch
/// ([`PROBS_BUDGET`], and one binding); one token's must fit.
fn batch_limits(ctx: &GpuContext, cfg: &Config, n_ctx: u32, n_batch: u32) -> Result<(u32, Chunks)> {
    let max_binding = ctx.max_binding();
    let probs_per_token = act_bytes(cfg.n_head, n_ctx);
    if probs_per_token > max_binding {
        return Err(Error::gpu(format!(
            "one token's attention over a context of {n_ctx} needs {probs_per_token} \
             bytes, over the device's {max_binding} byte binding limit; lower -c"
        )));
    }
    let widest = [cfg.n_embd, cfg.n_ff, cfg.q_dim(), cfg.kv_dim()]
        .into_iter()
        .max()
        .unwrap_or(1);
    // A batch never holds more positions than the context.
    let max_batch = (max_binding / act_bytes(widest, 1).max(1))
        .min(n_batch.min(n_ctx) as u64)
        .max(1) as u32;
    let chunks = Chunks::new(cfg.n_head, n_ctx, max_batch, PROBS_BUDGET.min(max_binding));
    Ok((max_batch, chunks))
}

/// An activation buffer of `per_token` floats for `max_batch` tokens.
fn activation(
    ctx: &GpuContext,
    name: &str,
    per_token: u32,
    max_batch: u32,
) -> Result<wgpu::Buffer> {
    crate::gpu::upload::activations(ctx, name, act_bytes(per_token, max_batch))
}

/// The activations a layer passes between its ops, for `max_batch` tokens.
fn scratch(ctx: &GpuContext, c: &Config, max_batch: u32) -> Result<Scratch<wgpu::Buffer>> {
    let a = |name: &str, per_token: u32| activation(ctx, name, per_token, max_batch);
    Ok(Scratch {
        x: a("x", c.n_embd)?,
        xn: a("xn", c.n_embd)?,
        q: a("q", c.q_dim())?,
        k: a("k", c.kv_dim())?,
        v: a("v", c.kv_dim())?,
        qn: a("qn", c.q_dim())?,
        kn: a("kn", c.kv_dim())?,
        attn: a("attn", c.q_dim())?,
        proj: a("proj", c.n_embd)?,
        gate: a("gate", c.n_ff)?,
        up: a("up", c.n_ff)?,
        ffn: a("ffn", c.n_ff)?,
    })
}

/// Every layer's K and V caches for `n_ctx` positions; layers that run elsewhere get
/// none (a placeholder of one word).
fn kv_caches(
    ctx: &GpuContext,
    c: &Config,
    layers: &std::ops::Range<u32>,
    n_ctx: u32,
) -> Result<Vec<(wgpu::Buffer, wgpu::Buffer)>> {
    (0..c.n_layer)
        .map(|il| {
            let bytes = if layers.contains(&il) {
                ops::kv_store::cache_bytes(c.kv_dim(), n_ctx)
            } else {
                4
            };
            Ok((
                storage(ctx, &format!("k_cache.{il}"), bytes)?,
                storage(ctx, &format!("v_cache.{il}"), bytes)?,
            ))
        })
        .collect()
}

/// The layer a tensor named `blk.N.*` belongs to.
fn layer_of(name: &str) -> Option<u32> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Upload the weights of this part of the model (the layers of `range`, the output layer
/// when `head`) straight from the file map, with a progress bar on stderr.
fn upload_weights(
    ctx: &GpuContext,
    file: &GgufFile,
    cfg: &Config,
    range: &std::ops::Range<u32>,
    embeds: bool,
    head: bool,
    progress: bool,
) -> Result<ModelWeights<GpuTensor>> {
    // The token embedding is needed to embed tokens or as a tied output layer; a part
    // with neither keeps no copy (Gemma 3's is 178 MB).
    let tied = file.tensor("output.weight").is_none();
    let holds_embd = embeds || (head && tied);
    let in_part = |name: &str| match layer_of(name) {
        Some(il) => range.contains(&il),
        None => match name {
            "token_embd.weight" => holds_embd,
            "output.weight" => head,
            _ => true,
        },
    };
    let total: u64 = file
        .tensors()
        .iter()
        .filter(|t| in_part(&t.name))
        .map(|t| t.n_bytes)
        .sum();
    let bar = if progress {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "uploading {bar:40} {bytes}/{total_bytes} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let uploaded = |info: &TensorInfo| -> Result<()> {
        file.release(info);
        bar.inc(info.n_bytes);
        Ok(())
    };
    // Copied bytes need not stay resident in the map: released run by run, a large
    // tensor (a 178 MB embedding) is not held twice while it uploads.
    let mut release = |run: &[u8]| file.release_bytes(run);
    let mut load = |name: &str| -> Result<GpuTensor> {
        let info = file
            .tensor(name)
            .ok_or_else(|| Error::model(format!("missing tensor {name}")))?;
        let t = GpuTensor::upload_with(ctx, info, file.tensor_data(info), &mut release)?;
        uploaded(info)?;
        Ok(t)
    };
    let mut fuse = |names: &[&str]| -> Result<Option<GpuTensor>> {
        let Some(infos) = fusable(ctx, file, names) else {
            return Ok(None);
        };
        let parts: Vec<_> = infos.iter().map(|i| (*i, file.tensor_data(i))).collect();
        let name = names.join("+");
        let t = GpuTensor::upload_fused(ctx, &name, &parts, &mut |run| file.release_bytes(run))?;
        for info in infos {
            uploaded(info)?;
        }
        Ok(Some(t))
    };
    let e = cfg.n_embd as u64;
    weights::expect_dims(file, "token_embd.weight", &[e, cfg.n_vocab as u64])?;
    let token_embd = holds_embd.then(|| load("token_embd.weight")).transpose()?;
    let mut layers = Vec::new();
    for il in 0..cfg.n_layer {
        layers.push(if range.contains(&il) {
            Some(weights::layer(file, cfg, il, &mut load, &mut fuse)?)
        } else {
            None
        });
    }
    weights::expect_dims(file, "output_norm.weight", &[e])?;
    let output_norm = load("output_norm.weight")?;
    let output = match file.tensor("output.weight") {
        Some(_) if head => {
            weights::expect_dims(file, "output.weight", &[e, cfg.n_vocab as u64])?;
            Some(load("output.weight")?)
        }
        _ => None,
    };
    bar.finish_and_clear();
    // wgpu keeps the ring's buffers until their last copies have run.
    ctx.release_staging();
    Ok(ModelWeights {
        token_embd,
        layers,
        output_norm,
        output,
    })
}

/// The tensors `names`, when the GPU runs them as one product ([`graph::Proj`]): two
/// or more matrices of one type and row length that fit one storage binding together,
/// on a device that binds the kernels' extra outputs.
/// One dispatch instead of several saves the per-dispatch cost (25-40 us on lavapipe)
/// and gives the small K and V products' rows to more workgroups at once.
pub(crate) fn fusable<'a>(
    ctx: &GpuContext,
    file: &'a GgufFile,
    names: &[&str],
) -> Option<Vec<&'a TensorInfo>> {
    if !ctx.fused_outputs() {
        return None;
    }
    let infos: Vec<&TensorInfo> = names
        .iter()
        .map(|n| file.tensor(n))
        .collect::<Option<_>>()?;
    let first = infos.first()?;
    let same = infos
        .iter()
        .all(|i| i.ty == first.ty && i.dims.len() == 2 && i.dims[0] == first.dims[0]);
    let gpu_row = crate::gpu::layout::row_bytes(first.ty, first.dims[0])
        .or_else(|| first.ty.row_bytes(first.dims[0]))?;
    let rows: u64 = infos.iter().map(|i| i.dims[1]).sum();
    (infos.len() > 1 && same && rows * gpu_row <= ctx.max_binding()).then_some(infos)
}
