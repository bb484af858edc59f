//! The per-adapter kernel choices: `wgllm-bench kernels --save` records the fastest
//! correct variant, and weight memory, for the adapter it ran on, a context on that
//! adapter then uses them, `WGLLM_MUL_MAT` and `WGLLM_WEIGHTS` still override them, and
//! names it does not know (or a file it cannot read) fall back to the default. One test: it sets process-wide environment variables.

mod common;

use std::process::Command;

use wgllm::gguf::TensorInfo;
use wgllm::gpu::context::WEIGHTS_ENV;
use wgllm::gpu::tuning::{adapter_key, Choices, Tuning, TUNING_ENV};
use wgllm::gpu::upload::WeightMemory;
use wgllm::gpu::{DeviceOptions, GpuContext, GpuTensor};
use wgllm::ops::mul_mat::{default_variant, variant, Variant, VARIANT_ENV};
use wgllm::quant::GgmlType;

/// A tensor of `rows` zero rows of 32 elements, uploaded where `ctx` holds its type.
fn upload(ctx: &GpuContext, ty: GgmlType, rows: u64) -> GpuTensor {
    let dims = if rows == 1 { vec![32] } else { vec![32, rows] };
    let n = ty.row_bytes(32).unwrap() * rows;
    let info = TensorInfo {
        name: format!("t.{ty}"),
        dims,
        ty,
        offset: 0,
        n_bytes: n,
    };
    GpuTensor::upload(ctx, &info, &vec![0u8; n as usize]).unwrap()
}

#[test]
fn saved_choices_are_used_on_their_adapter() {
    let dir = std::env::temp_dir().join(format!("wgllm-tuning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tuning.json");
    std::env::set_var(TUNING_ENV, &file);
    std::env::remove_var(VARIANT_ENV);

    // The bench measures two variants of one small case and records the faster.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgllm-bench"));
    cmd.args(["kernels", "--type", "q4_0", "--shape", "576x1536"])
        .args([
            "--batch",
            "1",
            "--variant",
            "row,wg",
            "--weights",
            "buffer,texture",
            "--reps",
            "2",
            "--save",
        ])
        .env(TUNING_ENV, &file);
    common::with_runtime_dir(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let saved = Tuning::parse(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved.adapters.len(), 1, "{saved:?}");
    let (key, choices) = saved.adapters.iter().next().unwrap();
    let chosen = &choices.mul_mat["Q4_0"];
    assert!(chosen == "row" || chosen == "wg", "{chosen}");
    let memory = WeightMemory::parse(&choices.weights["Q4_0"]).unwrap();

    // A context on that adapter runs the recorded variant for Q4_0 only.
    let ctx = GpuContext::new(&DeviceOptions::default()).unwrap();
    assert_eq!(&adapter_key(&ctx.info), key);
    let want = Variant::parse(chosen).unwrap();
    assert_eq!(variant(&ctx, GgmlType::Q4_0).unwrap(), want);
    assert_eq!(ctx.matrix_memory(GgmlType::Q4_0), memory);
    assert_eq!(ctx.matrix_memory(GgmlType::Q8_0), ctx.default_memory());
    assert_eq!(
        variant(&ctx, GgmlType::Q8_0).unwrap(),
        default_variant(&ctx)
    );

    // Another choice, and one this build does not know, for the same adapter.
    let mut t = Tuning::default();
    let mut c = Choices::default();
    c.mul_mat.insert("Q4_0".into(), "row".into());
    c.mul_mat.insert("Q8_0".into(), "no-such-variant".into());
    c.weights.insert("Q4_0".into(), "texture".into());
    c.weights.insert("Q8_0".into(), "no-such-memory".into());
    t.adapters.insert(key.clone(), c);
    t.save().unwrap();
    let ctx = GpuContext::new(&DeviceOptions::default()).unwrap();
    assert_eq!(variant(&ctx, GgmlType::Q4_0).unwrap(), Variant::Row);
    assert_eq!(
        variant(&ctx, GgmlType::Q8_0).unwrap(),
        default_variant(&ctx)
    );
    // Q4_0 matrices go into textures; Q8_0 ones where the device's default puts them,
    // and vectors of any type into buffers.
    assert_eq!(
        upload(&ctx, GgmlType::Q4_0, 3).memory,
        WeightMemory::Texture
    );
    assert_eq!(upload(&ctx, GgmlType::Q4_0, 1).memory, WeightMemory::Buffer);
    assert_eq!(upload(&ctx, GgmlType::Q8_0, 3).memory, ctx.default_memory());
    // The environment variable holds every matrix where it says, or names its mistake.
    std::env::set_var(WEIGHTS_ENV, "buffer");
    let forced = GpuContext::new(&DeviceOptions::default()).unwrap();
    assert_eq!(forced.matrix_memory(GgmlType::Q4_0), WeightMemory::Buffer);
    std::env::set_var(WEIGHTS_ENV, "Texture");
    let forced = GpuContext::new(&DeviceOptions::default()).unwrap();
    assert_eq!(forced.matrix_memory(GgmlType::Q8_0), WeightMemory::Texture);
    std::env::set_var(WEIGHTS_ENV, "vram");
    let err = GpuContext::new(&DeviceOptions::default()).err().unwrap();
    assert!(err.to_string().contains("WGLLM_WEIGHTS=\"vram\""), "{err}");
    std::env::remove_var(WEIGHTS_ENV);
    // The environment variable wins over the file.
    std::env::set_var(VARIANT_ENV, "wg");
    assert_eq!(variant(&ctx, GgmlType::Q4_0).unwrap(), Variant::Wg);
    std::env::remove_var(VARIANT_ENV);

    // A file that cannot be parsed is ignored: the context opens with the defaults.
    std::fs::write(&file, "{ not json").unwrap();
    let ctx = GpuContext::new(&DeviceOptions::default()).unwrap();
    assert!(ctx.tuned.mul_mat.is_empty());
    assert_eq!(
        variant(&ctx, GgmlType::Q4_0).unwrap(),
        default_variant(&ctx)
    );
    // And `off` ignores the file altogether.
    t.save().unwrap();
    std::env::set_var(TUNING_ENV, "off");
    let ctx = GpuContext::new(&DeviceOptions::default()).unwrap();
    assert!(ctx.tuned.mul_mat.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
