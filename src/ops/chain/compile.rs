//! Compiling a chain's pipeline: its bindings' layout, and the thread that compiles
//! the chains beside the first steps.

use super::*;

/// What compiles the pipeline of a chain of `members`, and its one group's layout: the
/// chain's counters and parameters at 0 and 1, then each member's bindings
/// ([`member_bases`]).
pub(super) fn build(ctx: &GpuContext, members: &[&Arc<Deferred>]) -> Result<Build> {
    let (source, constants) = chain_source(members)?;
    let mut entries = Vec::new();
    let bases = member_bases(members);
    for (k, d) in members.iter().enumerate() {
        for (b, kind) in (0u32..).zip(writable(d.bindings())).skip(1) {
            entries.push(kind.entry(bases[k] + b));
        }
    }
    entries.push(Binding::ReadWrite.entry(0));
    entries.push(Binding::ReadWrite.entry(1));
    entries.push(Binding::Uniform.entry(2));
    let labels: Vec<&str> = members.iter().map(|d| d.label()).collect();
    let label = format!("chain {}", labels.join(" + "));
    let layout = ctx
        .device
        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(&label),
            entries: &entries,
        });
    Ok(Build {
        label,
        source,
        constants,
        layout,
    })
}

/// Compiles `builds` on a thread of its own and sets `made` when done. The load once
/// waited for it; now the first single tokens run meanwhile, without chains.
pub(super) fn compile_apart(
    device: wgpu::Device,
    builds: Vec<Build>,
    made: Arc<OnceLock<std::result::Result<Vec<Arc<wgpu::ComputePipeline>>, String>>>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("chain pipelines".into())
        .spawn(move || {
            let compiled = builds
                .iter()
                .map(|b| {
                    let constants: Vec<(&str, f64)> =
                        b.constants.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                    let p = crate::gpu::pipelines::compile(
                        &device,
                        &b.label,
                        &constants,
                        Some(&b.layout),
                        &b.source,
                    );
                    p.map(Arc::new).map_err(|e| e.to_string())
                })
                .collect();
            let _ = made.set(compiled);
            release_compiler_memory();
        })
        .map_err(|e| {
            Error::gpu(format!(
                "chains: cannot start a thread to compile them: {e}"
            ))
        })
}

/// Hands the heap's free memory back to the system. llvmpipe's compiler leaves about
/// 46 MiB free in this thread's malloc arena after SmolLM2's chains, which would
/// otherwise stay resident for the whole run (docs/perf.md).
fn release_compiler_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: glibc's `malloc_trim` only returns free heap pages; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}
