//! Steps of the same shapes compile nothing new on a CPU-hosted driver.
//!
//! lavapipe (Mesa 22.3) specializes a shader on the values of some of its uniforms, and
//! keeps the specializations it made; written one way, single-token attention made it
//! build a new shader at nearly every dispatch on Gemma 3's shapes (2-2.5 ms each,
//! docs/perf.md) while producing the right values. llvmpipe keeps the code it generates
//! in anonymous executable mappings, so this test counts those across steps. It has a
//! binary of its own: another test compiling in the same process would add mappings.

mod common;

use common::*;
use wgllm::gpu::upload;
use wgllm::ops::attention::{
    probs_row, Attention, AttnTextures, CacheTextures, Chunks, LayerTextures,
};
use wgllm::ops::{kv_store, Dispatch, StepInfo};

/// Anonymous executable mappings of this process (Linux), where llvmpipe's JIT puts its
/// code; `None` where /proc cannot be read.
fn jit_mappings() -> Option<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let anon_exec = |line: &&str| {
        let mut f = line.split_whitespace();
        let perms = f.nth(1).unwrap_or("");
        // address, perms, offset, device, inode, then the path if there is one
        perms.contains('x') && f.nth(2).is_some() && f.next().is_none()
    };
    Some(maps.lines().filter(anon_exec).count())
}

/// The dispatches of one layer's single-token attention step (the cache append, then
/// the attention), with caches and activations of its own.
fn layer(
    ctx: &wgllm::gpu::GpuContext,
    attn: &Attention,
    step: &wgpu::Buffer,
    tex: Option<LayerTextures<'_>>,
) -> Vec<Dispatch> {
    let kv_dim = attn.head_dim * attn.n_head_kv;
    // f16 pairs as f32 words, as many as the model's caches hold.
    let words = kv_store::cache_bytes(kv_dim, attn.n_ctx) / 4;
    let cache = vec![0.25f32; words as usize];
    let (kb, vb) = (
        upload::storage_init(ctx, "k", &cache),
        upload::storage_init(ctx, "v", &cache),
    );
    let new = Rng::new(3).vec(kv_dim as usize, 1.0);
    let (knb, vnb) = (
        upload::storage_init(ctx, "kn", &new),
        upload::storage_init(ctx, "vn", &new),
    );
    let q_len = (attn.head_dim * attn.n_head) as u64;
    let qb = upload::activations(ctx, "q", q_len * 4).expect("q");
    ctx.queue.write_buffer(
        &qb,
        0,
        bytemuck::cast_slice(&Rng::new(4).vec(q_len as usize, 1.0)),
    );
    let probs_len = attn.n_head as u64 * probs_row(attn.n_ctx);
    let probs = upload::storage(ctx, "probs", probs_len * 4).expect("probs");
    let out = upload::storage(ctx, "out", q_len * 4).expect("out");
    let mut dispatches =
        vec![kv_store::gpu(ctx, step, &knb, &vnb, &kb, &vb, kv_dim, attn.n_ctx).expect("store")];
    dispatches.extend(
        attn.gpu(ctx, step, &qb, &kb, &vb, &probs, &out, Chunks::one(1), tex)
            .expect("attention"),
    );
    dispatches
}

#[test]
fn decode_steps_compile_nothing_new() {
    for ctx in contexts() {
        if ctx.info.device_type != wgpu::DeviceType::Cpu || jit_mappings().is_none() {
            continue;
        }
        // Gemma 3 270M's attention: 4 heads of 256 over one KV head.
        let gemma = |window| Attention {
            head_dim: 256,
            n_head: 4,
            n_head_kv: 1,
            n_ctx: 256,
            window,
            scale: 1.0 / 16.0,
        };
        let step0 = StepInfo::new(0, 1);
        let sb = step_buffer(ctx, &step0);
        // Each layer's caches in textures of its own, as a model's.
        let kept = CacheTextures::Kept { first: 0, n: 6 };
        let tex = AttnTextures::new(ctx, &gemma(8), 1, Chunks::one(1), kept).expect("textures");
        // Gemma 3's layers: five with a sliding window, then one without.
        let layers: Vec<Vec<Dispatch>> = [8, 8, 8, 8, 8, 0]
            .into_iter()
            .enumerate()
            .map(|(il, w)| layer(ctx, &gemma(w), &sb, tex.as_ref().and_then(|t| t.layer(il))))
            .collect();
        // Where the device reads the caches from textures, the steps do: the form that
        // once recompiled.
        if tex.is_some() {
            let copies = layers[0]
                .iter()
                .any(|d| d.label == "attn_decode" && d.copies_in(&step0));
            assert!(copies, "{}: attn_decode read no texture", label(ctx));
        }
        let mut counts = Vec::new();
        for pos in 0..48u32 {
            let step = StepInfo::new(pos, 1);
            ctx.queue.write_buffer(&sb, 0, bytemuck::bytes_of(&step));
            for l in &layers {
                run(ctx, l, &step);
            }
            counts.push(jit_mappings().unwrap_or(0));
        }
        // The first steps may compile (new pipelines, new texture states); after them,
        // 24 steps of 6 layers each add at most a couple of mappings.
        let (settled, last) = (counts[23], counts[47]);
        assert!(
            last <= settled + 2,
            "{}: executable mappings grew from {settled} to {last} over 24 steps \
             (the driver compiled during steady decoding): {counts:?}",
            label(ctx)
        );
    }
}
