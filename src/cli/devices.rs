//! `wgllm devices`: the GPU adapters this machine offers.

use clap::Args;

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Also print every limit.
    #[arg(long)]
    pub verbose: bool,
}

pub fn run(args: DevicesArgs) -> wgllm::Result<()> {
    let list = wgllm::gpu::context::list_adapters();
    if list.is_empty() {
        println!("no GPU adapters found (install a Vulkan driver, e.g. mesa-vulkan-drivers, or use --gpu-layers 0)");
        return Ok(());
    }
    for a in list {
        let i = &a.info;
        println!("[{}] {}", a.index, i.name);
        println!("    backend: {:?}, type: {:?}", i.backend, i.device_type);
        println!("    driver: {} {}", i.driver, i.driver_info);
        println!("    features: {:?}", a.features & interesting());
        if i.subgroup_min_size > 0 {
            println!(
                "    subgroup size: {}..{}",
                i.subgroup_min_size, i.subgroup_max_size
            );
        }
        let l = &a.limits;
        println!(
            "    max storage binding: {} MiB, max buffer: {} MiB, workgroup storage: {} KiB, invocations: {}",
            l.max_storage_buffer_binding_size >> 20,
            l.max_buffer_size >> 20,
            l.max_compute_workgroup_storage_size >> 10,
            l.max_compute_invocations_per_workgroup
        );
        if args.verbose {
            println!("    limits: {l:#?}");
        }
    }
    Ok(())
}

fn interesting() -> wgpu::Features {
    wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
        | wgpu::Features::SHADER_INT64
}
