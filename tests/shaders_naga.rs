//! Every shader the engine can build, parsed and validated by naga with no GPU, with
//! its override constants set as production sets them, and then translated to SPIR-V
//! as the Vulkan backend would.

use naga::valid::{Capabilities, ValidationFlags, Validator};

/// Override values production uses (`WG` = 64 for every kernel that has it).
fn production_constants(module: &naga::Module) -> naga::back::PipelineConstants {
    let mut c = naga::back::PipelineConstants::default();
    for (_, o) in module.overrides.iter() {
        if o.name.as_deref() == Some("WG") {
            c.insert("WG".to_string(), 64.0);
        }
    }
    c
}

#[test]
fn every_shader_validates() {
    let shaders = wgllm::gpu::shaders::all();
    assert!(
        shaders.len() >= 20,
        "expected every kernel and type, got {}",
        shaders.len()
    );
    for (label, src) in &shaders {
        let module = naga::front::wgsl::parse_str(src)
            .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(src)));
        // Validate as the portable path (no f16 arithmetic, no subgroups) must run everywhere;
        // unpack2x16float is core WGSL, which naga files under this capability.
        let mut v = Validator::new(
            ValidationFlags::all(),
            Capabilities::SHADER_FLOAT16_IN_FLOAT32,
        );
        let info = v
            .validate(&module)
            .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(src)));
        let constants = production_constants(&module);
        let (m, i) = naga::back::pipeline_constants::process_overrides(
            &module,
            &info,
            Some((naga::ShaderStage::Compute, "main")),
            &constants,
        )
        .unwrap_or_else(|e| panic!("{label}: overrides: {e}"));
        naga::back::spv::write_vec(&m, &i, &Default::default(), None)
            .unwrap_or_else(|e| panic!("{label}: SPIR-V: {e}"));
    }
}

#[test]
fn every_gpu_weight_type_has_kernels() {
    use wgllm::quant::GgmlType::*;
    for ty in [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    ] {
        for op in ["mul_mat", "get_rows"] {
            assert!(
                wgllm::gpu::shaders::quant_source(op, ty).is_ok(),
                "{op} has no GPU kernel for {ty}"
            );
        }
    }
}
