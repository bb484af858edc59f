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

/// Scalars in a local variable of type `ty` (arrays of vectors and scalars).
fn scalars(module: &naga::Module, ty: naga::Handle<naga::Type>) -> u32 {
    match module.types[ty].inner {
        naga::TypeInner::Scalar(_) => 1,
        naga::TypeInner::Vector { size, .. } => size as u32,
        naga::TypeInner::Matrix { columns, rows, .. } => columns as u32 * rows as u32,
        naga::TypeInner::Array {
            base,
            size: naga::ArraySize::Constant(n),
            ..
        } => n.get() * scalars(module, base),
        _ => 0,
    }
}

/// Locals of `f` large enough that zeroing one costs lavapipe's compiler dearly.
fn big_locals(module: &naga::Module, f: &naga::Function) -> Vec<naga::Handle<naga::LocalVariable>> {
    f.local_variables
        .iter()
        .filter(|(_, v)| scalars(module, v.ty) >= BIG_LOCAL)
        .map(|(h, _)| h)
        .collect()
}

/// Scalars from which a local array counts as large (`ROWS` = 64 accumulators).
const BIG_LOCAL: u32 = 64;

/// Whole-variable stores to any of `big` inside a loop of `block`, as their spans.
fn stores_in_loops(
    f: &naga::Function,
    block: &naga::Block,
    in_loop: bool,
    big: &[naga::Handle<naga::LocalVariable>],
    found: &mut Vec<naga::Span>,
) {
    for (stmt, span) in block.span_iter() {
        match stmt {
            naga::Statement::Store { pointer, .. } if in_loop => {
                if let naga::Expression::LocalVariable(v) = f.expressions[*pointer] {
                    if big.contains(&v) {
                        found.push(*span);
                    }
                }
            }
            naga::Statement::Block(b) => stores_in_loops(f, b, in_loop, big, found),
            naga::Statement::If { accept, reject, .. } => {
                stores_in_loops(f, accept, in_loop, big, found);
                stores_in_loops(f, reject, in_loop, big, found);
            }
            naga::Statement::Switch { cases, .. } => {
                for case in cases {
                    stores_in_loops(f, &case.body, in_loop, big, found);
                }
            }
            naga::Statement::Loop {
                body, continuing, ..
            } => {
                stores_in_loops(f, body, true, big, found);
                stores_in_loops(f, continuing, true, big, found);
            }
            _ => {}
        }
    }
}

/// A local array's zero value is stored element by element, each element a per-lane
/// scatter on lavapipe, and LLVM 15's coroutine pass (llvmpipe builds every compute
/// shader as a coroutine) slows with those stores: a 64-row accumulator array declared
/// inside a loop (zeroed there, and again at the function's entry) made `mul_mat_ks`'s
/// tile build take 11 s of compilation instead of 3 (docs/perf.md). So large locals
/// live in the entry point, declared outside loops and cleared by a loop.
#[test]
fn large_local_arrays_are_not_zeroed_inside_loops() {
    let shaders = wgllm::gpu::shaders::all()
        .into_iter()
        .chain(wgllm::gpu::shaders::all_with_subgroups());
    for (label, src) in &shaders.collect::<Vec<_>>() {
        let module = naga::front::wgsl::parse_str(src)
            .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(src)));
        for f in module.functions.iter().map(|(_, f)| f) {
            let big = big_locals(&module, f);
            assert!(
                big.is_empty(),
                "{label}: function {:?} declares a local of {BIG_LOCAL} scalars or more, \
                 zeroed at every call",
                f.name
            );
        }
        for ep in &module.entry_points {
            let f = &ep.function;
            let mut found = Vec::new();
            stores_in_loops(f, &f.body, false, &big_locals(&module, f), &mut found);
            if let Some(span) = found.first() {
                let at = span.location(src);
                panic!(
                    "{label}: line {}: a local array of {BIG_LOCAL} scalars or more is stored \
                     whole inside a loop (declare it outside, clear it with a loop)",
                    at.line_number
                );
            }
        }
    }
}
