//! A layer's Q/K/V product whose single tokens rotate their heads and append their keys
//! and values to the cache at the product's end (`mul_mat::gpu_qkv_rope`,
//! `mul_mat_ks1nr`), against the same product followed by `rope_store`, over steps of
//! batches and single tokens: Q, both caches and the attention read from the kept
//! textures agree after every step.

mod common;

use common::*;
use wgllm::gpu::upload::{self, vector_init};
use wgllm::gpu::GpuContext;
use wgllm::ops::attention::{self, Attention, AttnTextures, CacheTextures, Chunks};
use wgllm::ops::kv_store::{self, CacheAppend, QkNorms};
use wgllm::ops::mul_mat::{self, Columns, Norm};
use wgllm::ops::rope::{Rope, RopeMode};
use wgllm::ops::{Dispatch, StepInfo};
use wgllm::quant::GgmlType;

/// One layer's attention geometry and weights.
#[derive(Clone, Copy, Debug)]
struct Layer {
    ty: GgmlType,
    n_embd: usize,
    hd: u32,
    n_head: u32,
    n_kv: u32,
    n_rot: u32,
    mode: RopeMode,
    /// Per-head norms before the rotation (Gemma 3's q_norm and k_norm).
    normed: bool,
    /// V a product of its own, run first (Q4_K_M layers whose V differs in type).
    v_apart: bool,
}

const LAYERS: [Layer; 3] = [
    // SmolLM2's: neighbours rotated, Q, K and V in one matrix.
    Layer {
        ty: GgmlType::Q4_1,
        n_embd: 576,
        hd: 64,
        n_head: 9,
        n_kv: 3,
        n_rot: 64,
        mode: RopeMode::Normal,
        normed: false,
        v_apart: false,
    },
    // Gemma 3's: halves rotated after the heads' norms.
    Layer {
        ty: GgmlType::Q5_0,
        n_embd: 640,
        hd: 256,
        n_head: 4,
        n_kv: 1,
        n_rot: 256,
        mode: RopeMode::Neox,
        normed: true,
        v_apart: false,
    },
    // V apart, and half of each head left unrotated.
    Layer {
        ty: GgmlType::Q8_0,
        n_embd: 256,
        hd: 32,
        n_head: 4,
        n_kv: 2,
        n_rot: 16,
        mode: RopeMode::Neox,
        normed: true,
        v_apart: true,
    },
];

/// Batches and single tokens, from an empty cache.
const STEPS: [u32; 7] = [5, 1, 1, 3, 1, 2, 1];

const N_CTX: u32 = 24;

/// One path's buffers: Q, K and V of a step, the caches, the kept textures.
struct Path {
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    kc: wgpu::Buffer,
    vc: wgpu::Buffer,
    out: wgpu::Buffer,
    tex: Option<AttnTextures>,
}

impl Path {
    fn new(ctx: &GpuContext, l: &Layer, attn: &Attention, kept: bool) -> Path {
        let max = *STEPS.iter().max().unwrap_or(&1) as usize;
        let act = |n: usize| upload::activations(ctx, "act", 4 * n as u64).expect("activations");
        let kv_dim = l.hd * l.n_kv;
        let empty = kv_store::pack_caches(&[], &[], kv_dim as usize, N_CTX).0;
        let q_len = (l.hd * l.n_head) as usize * max;
        let tex = match kept {
            true => {
                let chunks = chunks();
                let caches = CacheTextures::Kept { first: 0, n: 1 };
                AttnTextures::new(ctx, attn, max as u32, chunks, caches).expect("textures")
            }
            false => None,
        };
        Path {
            q: act(q_len),
            k: act(kv_dim as usize * max),
            v: act(kv_dim as usize * max),
            kc: buffer_with_guard(ctx, &words(&empty), 0),
            vc: buffer_with_guard(ctx, &words(&empty), 0),
            out: buffer_with_guard(ctx, &vec![0.0; q_len], 0),
            tex,
        }
    }
}

fn chunks() -> Chunks {
    Chunks {
        tokens: 8,
        count: 1,
    }
}

/// How a layer's steps run: with its cache textures kept (written by the append) or
/// none, and its residual stream in a buffer that single tokens' products read as a
/// uniform (`mul_mat_ks1unr`, as the models' activations) or in plain storage
/// (`mul_mat_ks1nr`).
#[derive(Clone, Copy, Debug)]
struct Run {
    kept: bool,
    x_uniform: bool,
}

/// After each step: Q, the caches' halves and the attention's output.
type Seen = Vec<(Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>)>;

#[test]
fn qkv_product_rotates_and_appends_single_tokens() {
    let mut fused_runs = 0;
    for ctx in contexts().iter().chain(buffer_contexts()) {
        for l in LAYERS {
            for (kept, x_uniform) in [(true, true), (false, true), (true, false)] {
                let how = Run { kept, x_uniform };
                if let Some(seen) = steps(ctx, &l, how, true) {
                    fused_runs += 1;
                    let plain = steps(ctx, &l, how, false).expect("plain path");
                    compare(ctx, &l, how, &seen, &plain);
                }
            }
        }
    }
    // lavapipe's Vulkan adapter runs the fused build; GL has no subgroups.
    assert!(
        fused_runs > 0 || !lavapipe_here("qkv_product_rotates_and_appends_single_tokens"),
        "no adapter ran the product with RoPE at its end"
    );
}

fn compare(ctx: &GpuContext, l: &Layer, how: Run, fused: &Seen, plain: &Seen) {
    for (i, (a, b)) in fused.iter().zip(plain).enumerate() {
        let what = format!("{l:?} {how:?} step {i} on {}", label(ctx));
        assert!(nmse(&a.0, &b.0) < 1e-12, "Q {what}: {:e}", nmse(&a.0, &b.0));
        assert!(
            nmse(&a.1, &b.1) < 1e-12,
            "K cache {what}: {:e}",
            nmse(&a.1, &b.1)
        );
        assert!(
            nmse(&a.2, &b.2) < 1e-12,
            "V cache {what}: {:e}",
            nmse(&a.2, &b.2)
        );
        assert!(
            nmse(&a.3, &b.3) < 1e-10,
            "attention {what}: {:e}",
            nmse(&a.3, &b.3)
        );
    }
}

/// Runs [`STEPS`] through layer `l`, fused (`fused`) or as the product then
/// `rope_store`; `None` where the fused path is asked for and the device does not run
/// it (checked to be refused, not built).
fn steps(ctx: &GpuContext, l: &Layer, how: Run, fused: bool) -> Option<Seen> {
    let kept = how.kept;
    let attn = Attention {
        head_dim: l.hd,
        n_head: l.n_head,
        n_head_kv: l.n_kv,
        n_ctx: N_CTX,
        window: 0,
        scale: 1.0 / (l.hd as f32).sqrt(),
    };
    let kv_dim = l.hd * l.n_kv;
    let q_rows = l.hd * l.n_head;
    let rows: Vec<u32> = match l.v_apart {
        true => vec![q_rows, kv_dim],
        false => vec![q_rows, kv_dim, kv_dim],
    };
    let ws: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            weight(
                l.ty,
                [q_rows, kv_dim, kv_dim][i] as usize,
                l.n_embd,
                40 + i as u64,
            )
        })
        .collect();
    let sizes: Vec<usize> = rows.iter().map(|&r| r as usize).collect();
    let w = upload_fused(ctx, l.ty, &sizes, l.n_embd, &ws[..rows.len()]);
    let wv = upload_fused(ctx, l.ty, &[kv_dim as usize], l.n_embd, &ws[2..]);
    let mut rng = Rng::new(9);
    let nwb = vector_init(ctx, "norm", &rng.vec(l.n_embd, 1.0)).expect("norm");
    let (qwb, kwb) = (
        vector_init(ctx, "q_norm", &rng.vec(l.hd as usize, 2.0)).expect("q_norm"),
        vector_init(ctx, "k_norm", &rng.vec(l.hd as usize, 2.0)).expect("k_norm"),
    );
    let rope = Rope {
        head_dim: l.hd,
        n_heads: l.n_head,
        n_rot: l.n_rot,
        mode: l.mode,
        freq_base: 10000.0,
        freq_scale: 1.0,
    };
    let p = Path::new(ctx, l, &attn, kept);
    if kept && p.tex.is_none() {
        return None;
    }
    let layer_tex = p.tex.as_ref().and_then(|t| t.layer(0));
    let append = CacheAppend {
        rope: &rope,
        caches: [&p.kc, &p.vc],
        dims: (kv_dim, N_CTX),
        norms: l.normed.then_some(QkNorms {
            q: &qwb,
            k: &kwb,
            eps: 1e-6,
        }),
        tex: layer_tex.and_then(|t| t.cache_views()),
    };
    let max = *STEPS.iter().max().unwrap_or(&1);
    let x_len = l.n_embd * max as usize;
    let x = match how.x_uniform {
        true => upload::activations(ctx, "x", 4 * x_len as u64).expect("x"),
        false => buffer_with_guard(ctx, &vec![0.0; x_len], 0),
    };
    let probs_len = (attn.n_head * chunks().tokens) as usize * attention::probs_row(N_CTX) as usize;
    let probs = buffer_with_guard(ctx, &vec![0.0; probs_len], 0);
    let sb = step_buffer(ctx, &StepInfo::new(0, 1));
    let norm = Norm {
        x: &x,
        w: &nwb,
        eps: 1e-5,
    };
    let ys = [&p.q, &p.k, &p.v];
    if fused && !mul_mat::fuses_rope(ctx, &w, &append) {
        let made = mul_mat::gpu_qkv_rope(ctx, &sb, &w, norm, (ys, &rows), &append);
        assert!(
            made.is_err(),
            "{l:?} on {}: built where it does not fit",
            label(ctx)
        );
        return None;
    }
    let mut plan: Vec<Dispatch> = Vec::new();
    if l.v_apart {
        let d = mul_mat::gpu_normed(ctx, &sb, &wv, norm, &[&p.v], &[kv_dim], Columns::All);
        plan.extend(d.expect("V"));
    }
    let stored = match fused {
        true => {
            let made = mul_mat::gpu_qkv_rope(ctx, &sb, &w, norm, (ys, &rows), &append);
            let (d, stored) = made.expect("fused product");
            assert!(
                stored,
                "{l:?} on {}: single tokens not appended",
                label(ctx)
            );
            plan.extend(d);
            true
        }
        false => {
            let d = mul_mat::gpu_normed(ctx, &sb, &w, norm, &ys[..rows.len()], &rows, Columns::All);
            plan.extend(d.expect("product"));
            false
        }
    };
    let store = kv_store::gpu_with_rope(ctx, &sb, &p.q, [&p.k, &p.v], &append, stored);
    plan.push(store.expect("rope_store"));
    let seen_tex = layer_tex.map(|t| t.stored_by_store());
    let attend = attn.gpu(
        ctx,
        &sb,
        &p.q,
        &p.kc,
        &p.vc,
        &probs,
        &p.out,
        chunks(),
        seen_tex,
    );
    plan.extend(attend.expect("attention"));

    let mut xs = Rng::new(77);
    let mut pos = 0;
    let mut seen = Vec::new();
    for toks in STEPS {
        let step = StepInfo::new(pos, toks);
        ctx.queue.write_buffer(&sb, 0, bytemuck::bytes_of(&step));
        let xv = xs.vec(l.n_embd * toks as usize, 3.0);
        ctx.queue.write_buffer(&x, 0, bytemuck::cast_slice(&xv));
        run(ctx, &plan, &step);
        let halves = |b: &wgpu::Buffer| -> Vec<f32> {
            let n = kv_store::cache_bytes(kv_dim, N_CTX) as usize / 4;
            read_checked(ctx, b, n, 0)
                .iter()
                .flat_map(|w| {
                    let b = w.to_bits();
                    [b as u16, (b >> 16) as u16].map(|h| half::f16::from_bits(h).to_f32())
                })
                .collect()
        };
        let q_len = (q_rows * toks) as usize;
        seen.push((
            read_checked(ctx, &p.q, q_len, 0),
            halves(&p.kc),
            halves(&p.vc),
            read_checked(ctx, &p.out, q_len, 0),
        ));
        pos += toks;
    }
    Some(seen)
}
