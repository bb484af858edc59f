//! Every GPU kernel against its CPU reference, on every adapter the machine offers
//! (here Vulkan on lavapipe with f16 and subgroups, and GL on llvmpipe without), at
//! awkward shapes, with guard regions after each output.

mod common;

use common::*;
use wgllm::gguf::TensorInfo;
use wgllm::gpu::{upload, DeviceOptions, GpuContext, GpuTensor};
use wgllm::ops::attention::{self, Attention, AttnTextures, CacheTextures, Chunks, LayerTextures};
use wgllm::ops::glu::{self, Activation};
use wgllm::ops::mul_mat::{self, Columns};
use wgllm::ops::rope::{Rope, RopeMode};
use wgllm::ops::{add, argmax, get_rows, kv_store, rms_norm, top_k, StepInfo, Store};
use wgllm::quant::{self, GgmlType};

const GPU_TYPES: [GgmlType; 13] = GgmlType::WEIGHT_TYPES;

/// GPU types whose rows may be any multiple of 32 long.
fn small_block_types() -> impl Iterator<Item = GgmlType> {
    GPU_TYPES.into_iter().filter(|t| t.block_size() <= 32)
}

/// GPU K types: rows are a multiple of 256 long.
fn k_types() -> impl Iterator<Item = GgmlType> {
    GPU_TYPES.into_iter().filter(|t| t.block_size() == 256)
}

/// A random weight matrix [n_cols, n_rows] of type `ty` as file bytes.
fn weight(ty: GgmlType, n_rows: usize, n_cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let x = rng.vec(n_rows * n_cols, 1.0);
    let mut out = Vec::new();
    quant::quantize(ty, &x, &mut out).expect("quantize");
    out
}

fn upload(ctx: &GpuContext, ty: GgmlType, n_rows: usize, n_cols: usize, bytes: &[u8]) -> GpuTensor {
    let info = TensorInfo {
        name: format!("w_{ty}"),
        dims: vec![n_cols as u64, n_rows as u64],
        ty,
        offset: 0,
        n_bytes: bytes.len() as u64,
    };
    GpuTensor::upload(ctx, &info, bytes).expect("upload")
}

fn check_mul_mat(
    ctx: &GpuContext,
    ty: GgmlType,
    n_rows: usize,
    n_cols: usize,
    n_tokens: usize,
    cols: Columns,
) {
    let w = weight(ty, n_rows, n_cols, (n_rows * 31 + n_cols) as u64);
    let x = Rng::new(7).vec(n_cols * n_tokens, 1.0);
    let gw = upload(ctx, ty, n_rows, n_cols, &w);
    let q8 = mul_mat::gpu_quantizes_batches(ctx, &gw, cols).expect("variant");
    let want = mul_mat_want(ty, &w, (n_rows, n_cols), &x, n_tokens, cols, q8);
    let step = StepInfo::new(0, n_tokens as u32);
    let sb = step_buffer(ctx, &step);
    let xb = buffer_with_guard(ctx, &x, 0);
    let yb = buffer_with_guard(ctx, &vec![0.0; want.len()], 64);
    let d = mul_mat::gpu(ctx, &sb, &gw, &xb, &yb, cols, Store::Write).expect("build");
    run(ctx, &d, &step);
    let got = read_checked(ctx, &yb, want.len(), 64);
    let e = nmse(&got, &want);
    assert!(
        e < 1e-10,
        "mul_mat {ty} {n_rows}x{n_cols} x{n_tokens} {cols:?} on {}: nmse {e:e}",
        label(ctx)
    );
}

#[test]
fn mul_mat_all_types_awkward_shapes() {
    for ctx in contexts() {
        for ty in small_block_types() {
            for (rows, cols, toks) in [
                (1, 32, 1),
                (67, 96, 1),
                (130, 64, 5),
                (64, 576, 3),
                (257, 160, 9),
                // Past 16 workgroups of 64 rows, where CPU-hosted drivers give each
                // workgroup more (`mul_mat::ks1_rows`): 144 rows each, the last 34;
                // and past the most, 512.
                (2050, 64, 6),
                (9001, 32, 1),
            ] {
                check_mul_mat(ctx, ty, rows, cols, toks, Columns::All);
            }
            check_mul_mat(ctx, ty, 70, 64, 6, Columns::Last);
        }
    }
}

#[test]
fn mul_mat_k_quants() {
    for ctx in contexts() {
        for ty in k_types() {
            // 256 and 768 columns give odd block counts per row, so Q3_K / Q6_K rows
            // alternate between word-aligned and half-word-aligned starts.
            for (rows, cols, toks) in [
                (1, 256, 1),
                (67, 512, 3),
                (130, 256, 5),
                (33, 2048, 2),
                (65, 768, 9),
                // Single tokens on CPU-hosted drivers: two and three chunk pairs a
                // lane (`PAIRS` in mul_mat_ks1.wgsl; 512 columns take one).
                (97, 1024, 2),
                (41, 1536, 1),
            ] {
                check_mul_mat(ctx, ty, rows, cols, toks, Columns::All);
            }
            check_mul_mat(ctx, ty, 70, 512, 6, Columns::Last);
        }
    }
}

#[test]
fn mul_mat_split_weights() {
    // A binding cap of 1 KiB splits the matrix into many parts.
    for ctx in contexts() {
        let small = GpuContext::from_adapter(
            ctx.adapter.clone(),
            &DeviceOptions {
                max_binding: Some(1024),
                ..Default::default()
            },
        )
        .expect("context");
        for ty in [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::F16] {
            let gw_rows = 301;
            let w = weight(ty, gw_rows, 64, 3);
            let gw = upload(&small, ty, gw_rows, 64, &w);
            assert!(
                gw.parts.len() > 3,
                "{ty}: expected a split, got {} parts",
                gw.parts.len()
            );
            check_mul_mat(&small, ty, gw_rows, 64, 2, Columns::All);
        }
    }
}

fn check_get_rows(ctx: &GpuContext, ty: GgmlType, n_rows: usize, n_cols: usize, ids: &[u32]) {
    let w = weight(ty, n_rows, n_cols, 11);
    let mut want = Vec::new();
    let rb = ty.row_bytes(n_cols as u64).unwrap() as usize;
    for &id in ids {
        let mut row = vec![0f32; n_cols];
        quant::dequantize(ty, &w[id as usize * rb..][..rb], &mut row).unwrap();
        want.extend(row.iter().map(|v| v * 2.5));
    }
    let gw = upload(ctx, ty, n_rows, n_cols, &w);
    let step = StepInfo::new(0, ids.len() as u32);
    let sb = step_buffer(ctx, &step);
    let idb = wgllm::gpu::upload::storage_init(ctx, "ids", ids);
    let out = buffer_with_guard(ctx, &vec![0.0; want.len()], 32);
    let d = get_rows::gpu(ctx, &sb, &gw, &idb, &out, 2.5).unwrap();
    run(ctx, &d, &step);
    let got = read_checked(ctx, &out, want.len(), 32);
    assert!(
        nmse(&got, &want) < 1e-12,
        "get_rows {ty} {n_rows}x{n_cols} on {}",
        label(ctx)
    );
}

#[test]
fn get_rows_all_types() {
    for ctx in contexts() {
        for ty in small_block_types() {
            check_get_rows(ctx, ty, 77, 96, &[0, 76, 5, 5, 40]);
        }
    }
}

#[test]
fn get_rows_from_textures() {
    for ctx in texture_contexts() {
        for ty in small_block_types().chain(k_types()) {
            let cols = if ty.block_size() == 256 { 256 } else { 96 };
            check_get_rows(ctx, ty, 77, cols, &[0, 76, 5, 5, 40]);
        }
    }
}

#[test]
fn get_rows_k_quants() {
    for ctx in contexts() {
        for ty in k_types() {
            check_get_rows(ctx, ty, 77, 256, &[0, 76, 5, 5, 40]);
            check_get_rows(ctx, ty, 9, 768, &[8, 1, 3]);
        }
    }
}

#[test]
fn rms_norm_rows() {
    // The tree contexts run 64 to 256 lanes a row, four elements a lane per trip: rows
    // shorter than a trip, whole trips, and trips cut short.
    for ctx in contexts().iter().chain(tree_contexts()) {
        let shapes = [
            (576, 1, 3),
            (67, 3, 2),
            (256, 4, 1),
            (1000, 1, 1),
            (4096, 1, 2),
            (5000, 2, 1),
        ];
        for (n, rows, toks) in shapes {
            let mut rng = Rng::new(n as u64);
            let x = rng.vec(n * rows * toks, 3.0);
            let w = rng.vec(n, 1.0);
            let mut want = vec![0f32; x.len()];
            rms_norm::reference(&x, &w, &mut want, n, 1e-5);
            let step = StepInfo::new(0, toks as u32);
            let sb = step_buffer(ctx, &step);
            let (xb, wb) = (buffer_with_guard(ctx, &x, 0), buffer_with_guard(ctx, &w, 0));
            // Written, and added to a residual stream (y0 + the norm).
            let y0 = rng.vec(x.len(), 1.0);
            for (store, start) in [(Store::Write, vec![0.0; x.len()]), (Store::Add, y0.clone())] {
                let yb = buffer_with_guard(ctx, &start, 16);
                let (n32, r32) = (n as u32, rows as u32);
                let d = rms_norm::gpu(ctx, &sb, &xb, &wb, &yb, n32, r32, 1e-5, store).unwrap();
                run(ctx, &[d], &step);
                let got = read_checked(ctx, &yb, x.len(), 16);
                let want: Vec<f32> = want.iter().zip(&start).map(|(a, b)| a + b).collect();
                assert!(
                    nmse(&got, &want) < 1e-10,
                    "rms_norm n={n} {store:?} on {}",
                    label(ctx)
                );
            }
        }
    }
}

#[test]
fn rope_both_modes() {
    for ctx in contexts() {
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            for (hd, heads, n_rot, toks, pos) in [
                (64, 9, 64, 3, 0),
                (256, 4, 256, 2, 1000),
                (64, 3, 32, 5, 17),
            ] {
                let r = Rope {
                    head_dim: hd,
                    n_heads: heads,
                    n_rot,
                    mode,
                    freq_base: 10000.0,
                    freq_scale: 1.0,
                };
                let x = Rng::new(hd as u64).vec((hd * heads * toks) as usize, 1.0);
                let mut want = x.clone();
                r.reference(&mut want, pos);
                let step = StepInfo::new(pos, toks);
                let sb = step_buffer(ctx, &step);
                let xb = buffer_with_guard(ctx, &x, 16);
                let d = r.gpu(ctx, &sb, &xb).unwrap();
                run(ctx, &[d], &step);
                let got = read_checked(ctx, &xb, x.len(), 16);
                let e = nmse(&got, &want);
                assert!(
                    e < 1e-9,
                    "rope {mode:?} hd={hd} pos={pos} on {}: {e:e}",
                    label(ctx)
                );
                // Q and K of a layer in one dispatch (K with fewer heads).
                let k_heads = heads.div_ceil(3);
                let k = Rng::new(hd as u64 + 1).vec((hd * k_heads * toks) as usize, 1.0);
                let mut want_k = k.clone();
                Rope {
                    n_heads: k_heads,
                    ..r
                }
                .reference(&mut want_k, pos);
                let (qb, kb) = (
                    buffer_with_guard(ctx, &x, 16),
                    buffer_with_guard(ctx, &k, 16),
                );
                let d = r.gpu_pair(ctx, &sb, &qb, Some((&kb, k_heads))).unwrap();
                run(ctx, &[d], &step);
                let got_q = read_checked(ctx, &qb, x.len(), 16);
                let got_k = read_checked(ctx, &kb, k.len(), 16);
                let e = nmse(&got_q, &want).max(nmse(&got_k, &want_k));
                assert!(
                    e < 1e-9,
                    "rope pair {mode:?} hd={hd} pos={pos} on {}: {e:e}",
                    label(ctx)
                );
            }
        }
    }
}

#[test]
fn rope_store_matches_rope_then_kv_store() {
    // The tree contexts run the normed form's reduction as GPUs do.
    for ctx in contexts().iter().chain(tree_contexts()) {
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            // (head_dim, Q heads, K heads, n_rot, tokens, position): GQA, a partial
            // rotation, odd positions (V pairs straddling steps), single tokens.
            for (hd, heads, k_heads, n_rot, toks, pos) in [
                (64u32, 9u32, 3u32, 64u32, 3u32, 0u32),
                (256, 4, 1, 256, 1, 21),
                (64, 3, 3, 32, 5, 17),
                (32, 2, 2, 32, 1, 0),
            ] {
                // Plain, and with the heads' norms before RoPE (Gemma 3).
                for normed in [false, true] {
                    check_rope_store(ctx, mode, (hd, heads, k_heads, n_rot), (toks, pos), normed);
                }
            }
        }
    }
}

/// `rope_store` (`normed`: with the heads' norms folded in) against `rope` and
/// `kv_store` on the same inputs (normalised on the host first).
fn check_rope_store(
    ctx: &GpuContext,
    mode: RopeMode,
    (hd, heads, k_heads, n_rot): (u32, u32, u32, u32),
    (toks, pos): (u32, u32),
    normed: bool,
) {
    let r = Rope {
        head_dim: hd,
        n_heads: heads,
        n_rot,
        mode,
        freq_base: 10000.0,
        freq_scale: 0.5,
    };
    let (kv_dim, n_ctx) = (hd * k_heads, 64u32);
    let mut rng = Rng::new((hd + pos) as u64);
    let q = rng.vec((hd * heads * toks) as usize, 1.0);
    let k = rng.vec((kv_dim * toks) as usize, 1.0);
    let v = rng.vec((kv_dim * toks) as usize, 1.0);
    let old = (pos * kv_dim) as usize;
    let (k0, v0) = (rng.vec(old, 1.0), rng.vec(old, 1.0));
    let (kc0, vc0) = kv_store::pack_caches(&k0, &v0, kv_dim as usize, n_ctx);
    let (qw, kw) = (rng.vec(hd as usize, 2.0), rng.vec(hd as usize, 2.0));
    let eps = 1e-6;
    let step = StepInfo::new(pos, toks);
    let sb = step_buffer(ctx, &step);
    // Both paths from the given inputs; each returns (Q, K cache, V cache).
    let run_path = |fused: bool, q: &[f32], k: &[f32]| {
        let (qb, kb, vb) = (
            buffer_with_guard(ctx, q, 16),
            buffer_with_guard(ctx, k, 0),
            buffer_with_guard(ctx, &v, 0),
        );
        let (kcb, vcb) = (
            buffer_with_guard(ctx, &words(&kc0), 16),
            buffer_with_guard(ctx, &words(&vc0), 16),
        );
        let qwb = upload::vector_init(ctx, "q_norm", &qw).unwrap();
        let kwb = upload::vector_init(ctx, "k_norm", &kw).unwrap();
        let norms = kv_store::QkNorms {
            q: &qwb,
            k: &kwb,
            eps,
        };
        let d = if fused {
            let dims = (kv_dim, n_ctx);
            let norms = normed.then_some(norms);
            let append = kv_store::CacheAppend {
                rope: &r,
                caches: [&kcb, &vcb],
                dims,
                norms,
                tex: None,
            };
            let d = kv_store::gpu_with_rope(ctx, &sb, &qb, [&kb, &vb], &append, false);
            vec![d.unwrap()]
        } else {
            vec![
                r.gpu_pair(ctx, &sb, &qb, Some((&kb, k_heads))).unwrap(),
                kv_store::gpu(ctx, &sb, &kb, &vb, &kcb, &vcb, kv_dim, n_ctx).unwrap(),
            ]
        };
        run(ctx, &d, &step);
        let halves = |b: &wgpu::Buffer| -> Vec<f32> {
            read_checked(ctx, b, kc0.len(), 16)
                .iter()
                .flat_map(|w| {
                    let b = w.to_bits();
                    [b as u16, (b >> 16) as u16].map(|h| half::f16::from_bits(h).to_f32())
                })
                .collect()
        };
        (
            read_checked(ctx, &qb, q.len(), 16),
            halves(&kcb),
            halves(&vcb),
        )
    };
    let want = if normed {
        let (mut qn, mut kn) = (vec![0.0; q.len()], vec![0.0; k.len()]);
        rms_norm::reference(&q, &qw, &mut qn, hd as usize, eps);
        rms_norm::reference(&k, &kw, &mut kn, hd as usize, eps);
        run_path(false, &qn, &kn)
    } else {
        run_path(false, &q, &k)
    };
    let got = run_path(true, &q, &k);
    let what = format!(
        "{mode:?} hd={hd} rot={n_rot} pos={pos} x{toks} normed={normed} on {}",
        label(ctx)
    );
    assert!(nmse(&got.0, &want.0) < 1e-10, "rope_store Q {what}");
    assert!(nmse(&got.1, &want.1) < 1e-6, "rope_store K cache {what}");
    assert_eq!(got.2, want.2, "rope_store V cache {what}");
}

#[test]
fn glu_and_add() {
    for ctx in contexts() {
        // An odd width and a model's.
        for (act, n) in [
            (Activation::Silu, 1537),
            (Activation::GeluTanh, 1537),
            (Activation::Silu, 2048),
            (Activation::GeluTanh, 2048),
        ] {
            let toks = 3u32;
            let mut rng = Rng::new(5);
            let g = rng.vec(n * toks as usize, 6.0);
            let u = rng.vec(n * toks as usize, 2.0);
            let mut want = vec![0f32; g.len()];
            glu::reference(&g, &u, &mut want, act);
            let step = StepInfo::new(0, toks);
            let sb = step_buffer(ctx, &step);
            let (gb, ub) = (buffer_with_guard(ctx, &g, 0), buffer_with_guard(ctx, &u, 0));
            let ob = buffer_with_guard(ctx, &vec![0.0; g.len()], 16);
            let d = glu::gpu(ctx, &sb, &gb, &ub, &ob, n as u32, act).unwrap();
            run(ctx, &[d], &step);
            let got = read_checked(ctx, &ob, g.len(), 16);
            assert!(
                nmse(&got, &want) < 1e-10,
                "glu {act:?} n={n} on {}",
                label(ctx)
            );
        }
        let (n, toks) = (333usize, 2u32);
        let mut rng = Rng::new(9);
        let x = rng.vec(n * 2, 1.0);
        let y = rng.vec(n * 2, 1.0);
        let mut want = x.clone();
        add::reference(&mut want, &y);
        let step = StepInfo::new(0, toks);
        let sb = step_buffer(ctx, &step);
        let xb = buffer_with_guard(ctx, &x, 16);
        let yb = buffer_with_guard(ctx, &y, 0);
        run(
            ctx,
            &[add::gpu(ctx, &sb, &xb, &yb, n as u32).unwrap()],
            &step,
        );
        assert!(nmse(&read_checked(ctx, &xb, x.len(), 16), &want) < 1e-14);
    }
}

/// Greedy sampling on the device picks the host's token: the largest logit, ties to the
/// lowest id (within a quad, across lanes and across spans), NaN as -inf, -0 equal to
/// +0, denormals ordered. Both builds on every adapter that runs them: `argmax_sg`
/// (CPU-hosted Vulkan, logits through a texture) and the tree (GPUs, GL, and lavapipe
/// with its reductions forced through workgroup memory).
#[test]
fn argmax_matches_the_host() {
    let mut cases: Vec<(String, Vec<f32>)> = Vec::new();
    for (n, seed) in [
        (1usize, 1u64),
        (2, 10),
        (3, 11),
        (63, 2),
        (4096, 3),
        (4097, 4),
        (262_149, 5),
    ] {
        cases.push((format!("random {n}"), Rng::new(seed).vec(n, 30.0)));
    }
    // Ties in one quad (9 and 10, quad 2), between lanes (21 in quad 5, 65 in quad 16: of
    // eight lanes, lane 5's first quad and lane 0's third), and in the last, partial
    // quad.
    for (n, tied) in [
        (41, vec![9usize, 10]),
        (203, vec![65, 21]),
        (203, vec![202, 201]),
    ] {
        let mut v = Rng::new(12).vec(n, 1.0);
        for &i in &tied {
            v[i] = 3.0;
        }
        cases.push((format!("{n} logits, tied at {tied:?}"), v));
    }
    let mut ties = Rng::new(6).vec(20_000, 1.0);
    for i in [13_000, 9_000, 4_200, 4_100] {
        ties[i] = 7.5;
    }
    cases.push(("ties across spans".into(), ties));
    let mut in_span = vec![-3.0f32; 5000];
    for i in [4_999, 4_200, 4_097] {
        in_span[i] = 2.0;
    }
    cases.push(("ties within a span".into(), in_span));
    let mut nan = Rng::new(7).vec(9000, 1.0);
    for i in (0..9000).step_by(3) {
        nan[i] = f32::NAN;
    }
    nan[8999] = f32::from_bits(0xffc0_0001); // a negative NaN with a payload
    cases.push(("NaN".into(), nan));
    cases.push(("all NaN".into(), vec![f32::NAN; 5000]));
    cases.push(("all -inf".into(), vec![f32::NEG_INFINITY; 5000]));
    let mut zeros = vec![-1.0f32; 6000];
    (zeros[4100], zeros[5000]) = (-0.0, 0.0);
    cases.push(("-0 before +0".into(), zeros.clone()));
    (zeros[4100], zeros[5000]) = (0.0, -0.0);
    cases.push(("+0 before -0".into(), zeros));
    // Lengths just past a span or a multiple of four: the best among the last logits,
    // and a tie between a span's first logit and the last one.
    for (n, best) in [(4099, 4098), (4101, 4100), (8193, 8192), (6002, 4096)] {
        let mut tail = Rng::new(9).vec(n, 1.0);
        tail[best] = 5.0;
        tail[n - 1] = 5.0;
        cases.push((format!("{n} logits, best at {best}"), tail));
    }
    let mut tiny = vec![0.0f32; 300];
    tiny[200] = f32::from_bits(1); // the smallest denormal beats 0
    cases.push(("denormal".into(), tiny));
    let mut inf = Rng::new(8).vec(7000, 1e30);
    (inf[6000], inf[6500]) = (f32::INFINITY, f32::INFINITY);
    cases.push(("+inf".into(), inf));
    let mut builds = std::collections::HashSet::new();
    for ctx in contexts().iter().chain(tree_contexts()) {
        for (name, logits) in &cases {
            let n = logits.len() as u32;
            builds.insert(argmax::split(ctx, n).build);
            let step = StepInfo::new(0, 1);
            let sb = step_buffer(ctx, &step);
            // Guard values larger than most logits: a read past the end would pick one.
            let lb = buffer_with_guard(ctx, logits, 4);
            let groups = argmax::split(ctx, n).groups as usize;
            let ob = buffer_with_guard(ctx, &vec![0.0; 2 * groups], 16);
            run(ctx, &[argmax::gpu(ctx, &sb, &lb, &ob, n).unwrap()], &step);
            let words: Vec<u32> = read_checked(ctx, &ob, 2 * groups, 16)
                .iter()
                .map(|w| w.to_bits())
                .collect();
            let pairs: Vec<[u32; 2]> = words.chunks(2).map(|p| [p[0], p[1]]).collect();
            assert_eq!(
                argmax::pick(&pairs).unwrap(),
                wgllm::sampling::argmax(logits),
                "{name} on {}",
                label(ctx)
            );
        }
    }
    assert!(builds.contains("argmax"), "{builds:?}");
    let sg_here = contexts()
        .iter()
        .any(|c| c.info.device_type == wgpu::DeviceType::Cpu && c.fixed_subgroup().is_some());
    assert_eq!(builds.contains("argmax_sg"), sg_here, "{builds:?}");
}

/// Top-k sampling's candidates chosen on the device, cut to the best k, are the host's
/// top-k of the whole vocabulary: the same ids and values in the same order (ties to
/// the lower id within and across spans, NaN as -inf, +inf as the largest float, -0
/// below +0). A list past its slots says so.
#[test]
fn top_k_matches_the_host() {
    const OVERFLOWS: &str = "more logits at the floor than the list holds";
    let mut cases: Vec<(String, Vec<f32>, Vec<u32>)> = Vec::new();
    let all_k = [1u32, 2, 40, 128];
    for (n, seed) in [
        (128usize, 1u64),
        (1000, 2),
        (16_449, 3),
        (49_152, 4),
        (262_149, 5),
    ] {
        cases.push((
            format!("random {n}"),
            Rng::new(seed).vec(n, 30.0),
            all_k.into(),
        ));
    }
    // Real logits have heavy tails: a few hundred well above the rest.
    let mut tail = Rng::new(6).vec(262_144, 1.0);
    for (i, v) in tail.iter_mut().enumerate().step_by(997) {
        *v += 12.0 + (i % 7) as f32;
    }
    cases.push(("a heavy tail".into(), tail, vec![40, 128]));
    // Few distinct values: ties at the k-th place, within a span and across spans.
    let mut rng = Rng::new(7);
    let levels: Vec<f32> = rng
        .vec(50_000, 1.0)
        .iter()
        .map(|v| (v * 2.0).round() + if v.abs() > 0.997 { 10.0 } else { 0.0 })
        .collect();
    cases.push(("ties".into(), levels, vec![1, 3, 40, 97]));
    let mut specials = Rng::new(8).vec(30_000, 1.0);
    for (i, v) in specials.iter_mut().enumerate() {
        *v = match i % 11 {
            0 => f32::NAN,
            1 => f32::NEG_INFINITY,
            2 => f32::from_bits(0xffc0_0001), // a negative NaN with a payload
            _ => *v,
        };
    }
    (specials[100], specials[29_999]) = (f32::INFINITY, f32::INFINITY);
    cases.push(("NaN and infinities".into(), specials, vec![1, 2, 40]));
    let mut zeros = vec![-1.0f32; 20_000];
    for i in (0..20_000).step_by(1_001) {
        zeros[i] = if i % 2 == 0 { -0.0 } else { 0.0 };
    }
    zeros[19_999] = f32::from_bits(1); // the smallest denormal beats +0
    cases.push(("zeros and a denormal".into(), zeros.clone(), vec![1, 5, 12]));
    // The floor at -1, where 20000 logits are: more than the list holds.
    cases.push((OVERFLOWS.into(), zeros, vec![30]));
    cases.push((OVERFLOWS.into(), vec![f32::NEG_INFINITY; 5000], vec![3]));
    for ctx in contexts() {
        let b = buffer_with_guard(ctx, &[0.0; 64], 0);
        assert!(
            top_k::gpu(ctx, &b, [&b, &b], &b, &b, 64).is_err(),
            "one span"
        );
        for (name, logits, ks) in &cases {
            let n = logits.len() as u32;
            for &k in ks {
                // Tokens a penalty would change, asked for whatever their rank: a third
                // of k, up to the most a step may list.
                let mut listed: Vec<u32> = (0..(k as usize / 3).min(top_k::MAX_LISTED))
                    .map(|i| ((i as u64 * 7919 + k as u64 * 31) % n as u64) as u32)
                    .collect();
                listed.sort_unstable();
                listed.dedup();
                if !top_k::supports(n, k, listed.len()) {
                    continue;
                }
                let step = StepInfo::new(0, 1);
                let sb = step_buffer(ctx, &step);
                // Guard values larger than most logits: a read past the end would join.
                let lb = buffer_with_guard(ctx, logits, 4);
                let want: Vec<f32> = top_k::want(k, &listed)
                    .iter()
                    .map(|&w| f32::from_bits(w))
                    .collect();
                let wb = buffer_with_guard(ctx, &want, 0);
                let spans = top_k::MAX_SPANS as usize;
                let mb = buffer_with_guard(ctx, &vec![0.0; spans], 4);
                let fb = buffer_with_guard(ctx, &vec![0.0; top_k::FOUND_WORDS], 4);
                let passes = top_k::gpu(ctx, &sb, [&lb, &wb], &mb, &fb, n).unwrap();
                run(ctx, &passes, &step);
                let words: Vec<u32> = read_checked(ctx, &fb, top_k::FOUND_WORDS, 4)
                    .iter()
                    .map(|w| w.to_bits())
                    .collect();
                let what = format!(
                    "{name}, top-{k} with {} listed, {} found on {}",
                    listed.len(),
                    words[0],
                    label(ctx)
                );
                let Some(got) = top_k::best(&words, k, &listed).unwrap() else {
                    assert_eq!(name, OVERFLOWS, "{what}");
                    continue;
                };
                assert!(words[0] as usize <= 4 * k as usize + 400, "{what}");
                let bits = |c: &[(u32, f32)]| -> Vec<(u32, u32)> {
                    c.iter().map(|&(i, l)| (i, l.to_bits())).collect()
                };
                let mut ids: Vec<u32> = got.iter().map(|c| c.0).collect();
                ids.sort_unstable();
                ids.dedup();
                assert_eq!(ids.len(), got.len(), "{what}: an id twice");
                for &id in &listed {
                    let l = wgllm::sampling::top_k(&logits[id as usize..][..1], 1)[0].1;
                    assert!(bits(&got).contains(&(id, l.to_bits())), "{what}: {id}");
                }
                let mut best = got.clone();
                wgllm::sampling::keep_best(&mut best, k as usize);
                let want = wgllm::sampling::top_k(logits, k as usize);
                assert_eq!(bits(&best), bits(&want), "{what}");
            }
        }
    }
}

/// Store k/v for positions pos.. into caches that already hold 0..pos, then attend.
#[test]
fn attention_gqa_window_batches() {
    // The tree contexts run the softmax's reductions as GPUs do.
    for ctx in contexts().iter().chain(tree_contexts()) {
        for (hd, nh, nkv, window, pos, toks) in [
            (64u32, 9u32, 3u32, 0u32, 0u32, 5u32),
            (64, 9, 3, 0, 37, 1),
            (256, 4, 1, 8, 20, 6),
            (32, 4, 4, 0, 3, 70),
            // A head size that is an odd multiple of 4 (scores read its last four
            // dimensions apart, and never from textures); Q and K of more than one row
            // of texels (4096 x 16 bytes).
            (12, 3, 1, 0, 5, 7),
            (64, 9, 3, 0, 0, 40),
            (64, 9, 3, 0, 200, 9),
            // Single tokens: a sliding window, the first position, and a context past
            // what the one-dispatch decode kernel covers.
            (256, 4, 1, 8, 20, 1),
            // A window far behind the token: the decode kernel and its copies start at
            // the eight-key block of its first key.
            (64, 8, 2, 16, 101, 1),
            (32, 4, 4, 0, 0, 1),
            (32, 2, 1, 0, attention::DECODE_MAX_KV + 3, 1),
            // Long enough that the decode kernel splits its keys where its groups of
            // heads do not fill the host's cores (three groups here on two cores; the
            // second with a window, whose first block the splits start at).
            (64, 9, 3, 0, attention::SPLIT_MIN_KV + 477, 1),
            (64, 6, 3, 100, attention::SPLIT_MIN_KV + 276, 1),
        ] {
            // An odd context gives V rows a padded stride.
            let n_ctx = if pos % 2 == 1 { 127u32 } else { 128 }.max(pos + toks);
            let kv_dim = hd * nkv;
            let mut rng = Rng::new((hd + pos) as u64);
            let n_kv = (pos + toks) as usize;
            // The cache keeps f16: round the values first so the f32 reference sees
            // what the GPU stores.
            let f16r = |v: Vec<f32>| -> Vec<f32> {
                v.into_iter()
                    .map(|x| half::f16::from_f32(x).to_f32())
                    .collect()
            };
            let kd = kv_dim as usize;
            let k_all = f16r(rng.vec(n_kv * kd, 1.0));
            let v_all = f16r(rng.vec(n_kv * kd, 1.0));
            // Reference caches in the GPU's order, in f32; positions >= n_kv stay zero.
            let mut kc = vec![0f32; kd * n_ctx as usize];
            let mut vc = vec![0f32; kd * n_ctx as usize];
            for j in 0..n_kv {
                for i in 0..kd {
                    kc[j * kd + i] = k_all[j * kd + i];
                    vc[i * n_ctx as usize + j] = v_all[j * kd + i];
                }
            }
            let q = rng.vec((hd * nh * toks) as usize, 1.0);
            let attn = Attention {
                head_dim: hd,
                n_head: nh,
                n_head_kv: nkv,
                n_ctx,
                window,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let mut want = vec![0f32; q.len()];
            attn.reference(&q, &kc, &vc, &mut want, pos, toks);
            // GPU: packed caches hold 0..pos; this step stores pos..pos+toks through
            // kv_store (pairs of V positions straddling the two when pos is odd).
            let old = pos as usize * kd;
            // Positions past this step's hold stale values, as after a rewind: a
            // kernel that weighs them at all (rather than by zero) shows.
            let stale = |cache: &[f32]| -> Vec<f32> {
                let mut c = cache[..old].to_vec();
                c.resize(n_kv * kd, 0.0);
                c.extend(Rng::new(5).vec((n_ctx as usize - n_kv) * kd, 1.0));
                c
            };
            let (kc0, vc0) = kv_store::pack_caches(&stale(&k_all), &stale(&v_all), kd, n_ctx);
            let k_new = &k_all[old..];
            let v_new = &v_all[old..];
            let step = StepInfo::new(pos, toks);
            let sb = step_buffer(ctx, &step);
            let (knb, vnb) = (
                buffer_with_guard(ctx, k_new, 0),
                buffer_with_guard(ctx, v_new, 0),
            );
            // As the models hold it: bindable as a uniform, which single tokens read
            // it as where they read K from a texture (`attn_decode_tex`).
            let qb = wgllm::gpu::upload::activations(ctx, "q", q.len() as u64 * 4).unwrap();
            ctx.queue.write_buffer(&qb, 0, bytemuck::cast_slice(&q));
            // The whole batch in one chunk, and in chunks of 3 tokens (the last partly
            // filled, and one recorded past the batch's end).
            let threes = Chunks {
                tokens: 3,
                count: toks.div_ceil(3) + 1,
            };
            // Batches' scores from Q and K in their buffers, and where the device
            // reads them from textures, from there: the shared set, which a step fills
            // with every position it reads (kept textures, which hold what earlier
            // steps copied, are `attention_kept_textures_across_steps`).
            let shared = CacheTextures::Shared;
            let tex = AttnTextures::new(ctx, &attn, toks, Chunks::one(toks), shared).unwrap();
            let texs: Vec<Option<LayerTextures<'_>>> = [None, tex.as_ref()]
                .into_iter()
                .enumerate()
                .filter(|(i, t)| *i == 0 || t.is_some())
                .map(|(_, t)| t.and_then(|t| t.layer(0)))
                .collect();
            for (chunks, tex) in [Chunks::one(toks), threes]
                .into_iter()
                .flat_map(|c| texs.iter().map(move |t| (c, *t)))
            {
                // Rows of whole pairs of vec4s.
                let probs_len =
                    (nh * chunks.tokens) as usize * attention::probs_row(n_kv as u32) as usize;
                // Stale from another layer: every entry a kernel reads must have been
                // written in this step.
                let probs = buffer_with_guard(ctx, &vec![f32::NAN; probs_len], 16);
                let ob = buffer_with_guard(ctx, &vec![0.0; q.len()], 16);
                let (kb, vb) = (
                    buffer_with_guard(ctx, &words(&kc0), 0),
                    buffer_with_guard(ctx, &words(&vc0), 0),
                );
                let mut d =
                    vec![kv_store::gpu(ctx, &sb, &knb, &vnb, &kb, &vb, kv_dim, n_ctx).unwrap()];
                d.extend(
                    attn.gpu(ctx, &sb, &qb, &kb, &vb, &probs, &ob, chunks, tex)
                        .unwrap(),
                );
                // Single tokens with textures read K and V from them (the decode
                // kernel's copies), where the device runs that kernel.
                let decodes = ctx.fixed_subgroup().is_some()
                    && n_kv as u32 <= attention::DECODE_MAX_KV
                    && wgllm::ops::mul_mat::binds_x_view(ctx);
                if toks == 1 && tex.is_some() && decodes {
                    let copied = d
                        .iter()
                        .any(|x| x.label == "attn_decode" && x.copies_in(&step));
                    assert!(copied, "attn_decode did not read K and V from textures");
                }
                run(ctx, &d, &step);
                if toks == 1 {
                    check_probs_row(ctx, &probs, probs_len, chunks, nh, n_kv, window);
                }
                let got = read_checked(ctx, &ob, q.len(), 16);
                let e = nmse(&got, &want);
                assert!(
                    e < 1e-10,
                    "attention hd={hd} nh={nh}/{nkv} w={window} pos={pos} x{toks} {chunks:?} \
                     textures {} on {}: {e:e}",
                    tex.is_some(),
                    label(ctx)
                );
            }
        }
    }
}

/// How `check_steps` appends each step's keys and values to the caches.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Append {
    /// `kv_store`: the attention's copies bring them into the textures.
    KvStore,
    /// `rope_store` (with the heads' norms first where `normed`), which writes a single
    /// token's key and value into kept textures itself: those steps copy nothing.
    RopeStore { normed: bool },
}

/// Steps of batches and single tokens from an empty cache, two layers each, with the
/// caches' textures kept per layer (each step copies only what it stores) and shared
/// (each step copies all it reads), the keys and values appended by `kv_store` and by
/// `rope_store`: every step matches the reference over all the positions stored so
/// far. A step that skips its copy on any path (batches, the decode kernel, the split
/// single-token kernels where the device has no decode kernel), or a single token
/// that `rope_store` leaves out of a kept texture, leaves a later step reading stale
/// texels.
#[test]
fn attention_kept_textures_across_steps() {
    for ctx in texture_contexts() {
        for (hd, nh, nkv, window) in [(64u32, 4u32, 2u32, 0u32), (32, 4, 1, 6)] {
            let attn = Attention {
                head_dim: hd,
                n_head: nh,
                n_head_kv: nkv,
                n_ctx: 30,
                window,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let chunks = Chunks {
                tokens: 4,
                count: 3,
            };
            // Layers 3 and 4 of a model whose first layers run elsewhere.
            let kept = CacheTextures::Kept { first: 3, n: 2 };
            let appends = [
                Append::KvStore,
                Append::RopeStore { normed: false },
                Append::RopeStore { normed: true },
            ];
            for caches in [kept, CacheTextures::Shared] {
                for append in appends {
                    let tex = AttnTextures::new(ctx, &attn, 9, chunks, caches).unwrap();
                    let Some(tex) = tex else {
                        panic!("{}: no attention textures", label(ctx));
                    };
                    check_steps(ctx, &attn, chunks, &tex, (caches, append));
                }
            }
        }
    }
}

/// The steps of `attention_kept_textures_across_steps` over layers 3 and 4 of `tex`.
fn check_steps(
    ctx: &GpuContext,
    attn: &Attention,
    chunks: Chunks,
    tex: &AttnTextures,
    (caches, append): (CacheTextures, Append),
) {
    // RoPE over whole heads of Q and of K (each with its own head count).
    let rope = |n_heads| Rope {
        head_dim: attn.head_dim,
        n_heads,
        n_rot: attn.head_dim,
        mode: RopeMode::Normal,
        freq_base: 10000.0,
        freq_scale: 1.0,
    };
    let hd = attn.head_dim as usize;
    let norm_w = Rng::new(5).vec(hd, 2.0);
    let (qwb, kwb) = (
        upload::vector_init(ctx, "q_norm", &norm_w).unwrap(),
        upload::vector_init(ctx, "k_norm", &norm_w).unwrap(),
    );
    let eps = 1e-6;
    // What `rope_store` makes of a step's Q or K (of `n_heads` heads) at `pos`.
    let stored = |x: &[f32], n_heads: u32, pos: u32, normed: bool| {
        let mut y = x.to_vec();
        if normed {
            rms_norm::reference(x, &norm_w, &mut y, hd, eps);
        }
        rope(n_heads).reference(&mut y, pos);
        y
    };
    let kd = (attn.head_dim * attn.n_head_kv) as usize;
    let n_ctx = attn.n_ctx as usize;
    let empty = kv_store::pack_caches(&[], &[], kd, attn.n_ctx).0;
    let mut rng = Rng::new(kd as u64 + attn.window as u64);
    // Per layer: its GPU caches, and the reference's in f32 (K [n_ctx, kd], V
    // [kd, n_ctx]) holding the f16-rounded values stored so far.
    let mut layers: Vec<_> = (3..5)
        .map(|il| {
            let kb = buffer_with_guard(ctx, &words(&empty), 0);
            let vb = buffer_with_guard(ctx, &words(&empty), 0);
            (il, kb, vb, vec![0f32; kd * n_ctx], vec![0f32; kd * n_ctx])
        })
        .collect();
    let f16r = |x: f32| half::f16::from_f32(x).to_f32();
    let mut pos = 0u32;
    for toks in [5u32, 1, 1, 3, 1, 9, 1, 2, 1] {
        let step = StepInfo::new(pos, toks);
        let sb = step_buffer(ctx, &step);
        for (il, kb, vb, kc, vc) in layers.iter_mut() {
            let k_new: Vec<f32> = rng
                .vec(toks as usize * kd, 1.0)
                .into_iter()
                .map(f16r)
                .collect();
            let v_new: Vec<f32> = rng
                .vec(toks as usize * kd, 1.0)
                .into_iter()
                .map(f16r)
                .collect();
            let q = rng.vec((attn.head_dim * attn.n_head * toks) as usize, 1.0);
            // The keys and Q the attention sees: as given, or as `rope_store` leaves
            // them (the cache's keys rounded to f16 after the rotation).
            let (k_seen, q_seen) = match append {
                Append::KvStore => (k_new.clone(), q.clone()),
                Append::RopeStore { normed } => (
                    stored(&k_new, attn.n_head_kv, pos, normed)
                        .into_iter()
                        .map(f16r)
                        .collect(),
                    stored(&q, attn.n_head, pos, normed),
                ),
            };
            for t in 0..toks as usize {
                for i in 0..kd {
                    let j = pos as usize + t;
                    kc[j * kd + i] = k_seen[t * kd + i];
                    vc[i * n_ctx + j] = v_new[t * kd + i];
                }
            }
            let mut want = vec![0f32; q.len()];
            attn.reference(&q_seen, kc, vc, &mut want, pos, toks);
            let qb = wgllm::gpu::upload::activations(ctx, "q", q.len() as u64 * 4).unwrap();
            ctx.queue.write_buffer(&qb, 0, bytemuck::cast_slice(&q));
            let (knb, vnb) = (
                buffer_with_guard(ctx, &k_new, 0),
                buffer_with_guard(ctx, &v_new, 0),
            );
            let probs_len =
                (attn.n_head * chunks.tokens) as usize * attention::probs_row(attn.n_ctx) as usize;
            let probs = buffer_with_guard(ctx, &vec![f32::NAN; probs_len], 16);
            let ob = buffer_with_guard(ctx, &vec![0.0; q.len()], 16);
            let kv_dim = kd as u32;
            let lt = tex.layer(*il as usize);
            assert!(lt.is_some(), "no textures for layer {il}");
            let (mut d, lt) = match append {
                Append::KvStore => (
                    vec![kv_store::gpu(ctx, &sb, &knb, &vnb, kb, vb, kv_dim, attn.n_ctx).unwrap()],
                    lt,
                ),
                Append::RopeStore { normed } => {
                    let views = lt.and_then(|t| t.cache_views());
                    assert_eq!(views.is_some(), caches != CacheTextures::Shared);
                    let norms = normed.then_some(kv_store::QkNorms {
                        q: &qwb,
                        k: &kwb,
                        eps,
                    });
                    let r = rope(attn.n_head);
                    let append = kv_store::CacheAppend {
                        rope: &r,
                        caches: [kb, vb],
                        dims: (kv_dim, attn.n_ctx),
                        norms,
                        tex: views,
                    };
                    let store =
                        kv_store::gpu_with_rope(ctx, &sb, &qb, [&knb, &vnb], &append, false);
                    (vec![store.unwrap()], lt.map(|t| t.stored_by_store()))
                }
            };
            d.extend(
                attn.gpu(ctx, &sb, &qb, kb, vb, &probs, &ob, chunks, lt)
                    .unwrap(),
            );
            run(ctx, &d, &step);
            let got = read_checked(ctx, &ob, q.len(), 16);
            let e = nmse(&got, &want);
            assert!(
                e < 1e-10,
                "{caches:?} textures, {append:?}, layer {il}, w={} pos={pos} x{toks} on {}: {e:e}",
                attn.window,
                label(ctx)
            );
        }
        pos += toks;
    }
}

/// A single-token step's probabilities (row 0 of each head): zero where masked or past
/// the cached positions, and summing to one.
fn check_probs_row(
    ctx: &GpuContext,
    probs: &wgpu::Buffer,
    len: usize,
    chunks: Chunks,
    n_head: u32,
    n_kv: usize,
    window: u32,
) {
    let got = read_checked(ctx, probs, len, 16);
    let stride = attention::probs_row(n_kv as u32) as usize;
    for h in 0..n_head as usize {
        let row = &got[h * chunks.tokens as usize * stride..][..stride];
        let qpos = n_kv - 1;
        for (j, &pr) in row.iter().enumerate() {
            let masked = j >= n_kv || (window > 0 && qpos - j >= window as usize);
            assert!(!masked || pr == 0.0, "head {h} key {j}: {pr} where masked");
        }
        let sum: f32 = row.iter().sum();
        assert!(
            (sum - 1.0).abs() < 1e-4,
            "head {h}: probabilities sum to {sum}"
        );
    }
}

/// Reading back while polling (`Wait::Spin`) returns what blocking returns: with a cap
/// long enough for the copy, with none (at once on to blocking), and behind a long run
/// of dispatches still in flight when the wait starts.
#[test]
fn readback_waits_spinning_or_blocking() {
    use std::time::Duration;
    use wgllm::gpu::readback::{Readback, Wait};
    for ctx in contexts() {
        let data = Rng::new(11).vec(3000, 1.0);
        let src = buffer_with_guard(ctx, &data, 0);
        let rb = Readback::new(ctx, 4 * data.len() as u64);
        for wait in [
            Wait::Block,
            Wait::Spin(Duration::from_secs(10)),
            Wait::Spin(Duration::ZERO),
        ] {
            // 200 adds of the buffer onto itself before the copy: y = 201 x.
            let y = buffer_with_guard(ctx, &data, 0);
            let step = StepInfo::new(0, 1);
            let sb = step_buffer(ctx, &step);
            let n = data.len() as u32;
            let adds: Vec<_> = (0..200)
                .map(|_| wgllm::ops::add::gpu(ctx, &sb, &y, &src, n).expect("add"))
                .collect();
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for d in &adds {
                    d.record(&mut pass, &step).expect("record");
                }
            }
            rb.record(&mut enc, &y, 0, 4 * n as u64).expect("record");
            ctx.queue.submit([enc.finish()]);
            let got: Vec<f32> = rb.read_waiting(ctx, data.len(), wait).expect("read");
            let want: Vec<f32> = data.iter().map(|x| x * 201.0).collect();
            assert!(
                nmse(&got, &want) < 1e-10,
                "{wait:?} on {}: readback differs",
                label(ctx)
            );
        }
    }
}

/// Batches long enough that a workgroup walking all their tokens over its rows would
/// pass llvmpipe's loop limiter, which ends the walk without a trace: the host splits
/// the tokens into windows along z (`mul_mat::ks_tok_win`). Without them, each of these
/// left tokens unwritten on lavapipe: `mul_mat_ks1` in 320-row workgroups from token
/// 144, `mul_mat_ks1i` in tiles of eight, `mul_mat_ks` on 4096 columns, and 64-row
/// workgroups from token 1372; and an 8B model's 14336-column `ffn_down` rows.
#[test]
fn mul_mat_long_batches() {
    for ctx in contexts() {
        for (ty, rows, cols, toks) in [
            (GgmlType::Q8_0, 640, 1024, 300),
            (GgmlType::Q5_0, 640, 512, 600),
            (GgmlType::Q5_0, 640, 4096, 512),
            (GgmlType::Q4_K, 640, 2048, 515),
            (GgmlType::Q8_0, 64, 64, 2048),
            (GgmlType::Q4_K, 64, 14336, 512),
            // A head's many rows over every token (`perplexity`): at one workgroup per
            // core, even a window of 8 tokens walked too far.
            (GgmlType::Q8_0, 30000, 32, 16),
        ] {
            check_mul_mat(ctx, ty, rows, cols, toks, Columns::All);
        }
    }
}
