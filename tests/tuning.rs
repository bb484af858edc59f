//! The per-adapter kernel choices: `wgllm-bench kernels --save` records the fastest
//! correct variant for the adapter it ran on, a context on that adapter then uses it,
//! `WGLLM_MUL_MAT` still overrides it, and names it does not know (or a file it cannot
//! read) fall back to the default. One test: it sets process-wide environment variables.

use std::process::Command;

use wgllm::gpu::tuning::{adapter_key, Choices, Tuning, TUNING_ENV};
use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::ops::mul_mat::{default_variant, variant, Variant, VARIANT_ENV};
use wgllm::quant::GgmlType;

fn xdg(cmd: &mut Command) {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("wgllm-xdg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        cmd.env("XDG_RUNTIME_DIR", dir);
    }
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
            "--reps",
            "2",
            "--save",
        ])
        .env(TUNING_ENV, &file);
    xdg(&mut cmd);
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

    // A context on that adapter runs the recorded variant for Q4_0 only.
    let ctx = GpuContext::new(&DeviceOptions::default()).unwrap();
    assert_eq!(&adapter_key(&ctx.info), key);
    let want = Variant::parse(chosen).unwrap();
    assert_eq!(variant(&ctx, GgmlType::Q4_0).unwrap(), want);
    assert_eq!(
        variant(&ctx, GgmlType::Q8_0).unwrap(),
        default_variant(&ctx)
    );

    // Another choice, and one this build does not know, for the same adapter.
    let mut t = Tuning::default();
    let mut c = Choices::default();
    c.mul_mat.insert("Q4_0".into(), "row".into());
    c.mul_mat.insert("Q8_0".into(), "no-such-variant".into());
    t.adapters.insert(key.clone(), c);
    t.save().unwrap();
    let ctx = GpuContext::new(&DeviceOptions::default()).unwrap();
    assert_eq!(variant(&ctx, GgmlType::Q4_0).unwrap(), Variant::Row);
    assert_eq!(
        variant(&ctx, GgmlType::Q8_0).unwrap(),
        default_variant(&ctx)
    );
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
