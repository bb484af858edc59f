//! `wgllm-bench sync`: the cost of ordering a chain of small dependent steps on a
//! device, each step as a dispatch of its own (as a decode step's ops run now) against
//! the steps as phases of one dispatch whose workgroups wait for each other through
//! counters in storage (`grid_sync.wgsl` has the protocol). On CPU-hosted drivers a
//! dispatch hands its workgroups to the driver's threads, which sleep between
//! dispatches; this measures what a kernel that walks a layer's ops in one dispatch
//! would save per op. Every run is checked: a phase that saw anything of the phase
//! before but its finished values fails the command.

use wgllm::gpu::readback::read_buffer;
use wgllm::gpu::GpuContext;
use wgllm::{Error, Result};

use crate::timing::{Samples, Timer};

const SOURCE: &str = include_str!("grid_sync.wgsl");

/// Lanes per item (the shader's workgroup size).
const LANES: u64 = 8;

/// Loop trips a workgroup may take in all on llvmpipe (its loop limiter), which the
/// one-dispatch chain's waits and work share (`grid_sync.wgsl`).
const MAX_TRIPS: u32 = 65_535;

#[derive(clap::Args)]
pub struct SyncArgs {
    /// Adapter index or name substring.
    #[arg(long)]
    device: Option<String>,
    /// Steps in the chain (SmolLM2's decode step has about 150 dispatches).
    #[arg(long, default_value_t = 150)]
    phases: u32,
    /// Items per step, 8 lanes each (a dispatch's workgroups).
    #[arg(long, default_value_t = 16)]
    items: u32,
    /// Workgroups of the one-dispatch chain, comma-separated; default: the host's
    /// cores (a CPU-hosted driver's threads) and `--items`.
    #[arg(long, value_delimiter = ',')]
    workgroups: Vec<u32>,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Time with the host clock even when the device has timestamp queries.
    #[arg(long)]
    host_clock: bool,
    #[arg(long)]
    json: bool,
}

/// One timed chain and what its runs left behind.
struct Outcome {
    chain: &'static str,
    workgroups: u32,
    samples: Samples,
    /// Workgroups that gave up waiting, summed over the runs.
    gave_up: u32,
}

/// The buffers and pipelines one probe shares between its chains.
struct Probe {
    pipeline_layout: wgpu::PipelineLayout,
    bind: wgpu::BindGroup,
    vals: wgpu::Buffer,
    sync: wgpu::Buffer,
    /// Byte stride of the per-phase parameters (the uniform offset alignment).
    stride: u64,
    phases: u32,
    items: u32,
}

fn check(a: &SyncArgs) -> Result<()> {
    let bad = |what: String| Err(Error::invalid(format!("wgllm-bench sync: {what}")));
    if !(1..=1024).contains(&a.phases) {
        return bad(format!("--phases {} is outside 1..=1024", a.phases));
    }
    if !(1..=65_535).contains(&a.items) {
        return bad(format!("--items {} is outside 1..=65535", a.items));
    }
    if spin_budget(a) == 0 {
        return bad(format!(
            "{} phases of {} items would spend a workgroup's {MAX_TRIPS} loop trips on \
             their own work, with none left for waiting",
            a.phases, a.items
        ));
    }
    if let Some(w) = a.workgroups.iter().find(|w| !(1..=65_535).contains(*w)) {
        return bad(format!("--workgroups {w} is outside 1..=65535"));
    }
    if a.reps == 0 {
        return bad("--reps must be at least 1".into());
    }
    Ok(())
}

/// The done-counter reads a one-dispatch chain's workgroup may spend waiting: what
/// llvmpipe's loop limiter leaves after the most work one workgroup can take (every
/// phase's loop, its claims, one past the last) and a margin.
fn spin_budget(a: &SyncArgs) -> u32 {
    let work = u64::from(a.phases) * (u64::from(a.items) + 3) + 64;
    u64::from(MAX_TRIPS).saturating_sub(work) as u32
}

impl Probe {
    fn new(ctx: &GpuContext, a: &SyncArgs) -> Result<Probe> {
        let dev = &ctx.device;
        let stride = u64::from(ctx.limits.min_uniform_buffer_offset_alignment).max(16);
        let params: Vec<u8> = (0..a.phases)
            .flat_map(|k| {
                let mut entry = vec![0u8; stride as usize];
                let words = [k, a.items, spin_budget(a), a.phases];
                entry[..16].copy_from_slice(bytemuck::cast_slice(&words));
                entry
            })
            .collect();
        let uniform = wgpu::util::DeviceExt::create_buffer_init(
            dev,
            &wgpu::util::BufferInitDescriptor {
                label: Some("sync params"),
                contents: &params,
                usage: wgpu::BufferUsages::UNIFORM,
            },
        );
        let vals = wgllm::gpu::upload::storage(ctx, "sync vals", 8 * u64::from(a.items) * LANES)?;
        let sync =
            wgllm::gpu::upload::storage(ctx, "sync counters", 4 * (2 + 2 * u64::from(a.phases)))?;
        let storage_entry = |binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("sync"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: wgpu::BufferSize::new(16),
                    },
                    count: None,
                },
                storage_entry(1),
                storage_entry(2),
            ],
        });
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("sync"),
            layout: &layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &uniform,
                        offset: 0,
                        size: wgpu::BufferSize::new(16),
                    }),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: vals.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: sync.as_entire_binding(),
                },
            ],
        });
        let pipeline_layout = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("sync"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        Ok(Probe {
            pipeline_layout,
            bind,
            vals,
            sync,
            stride,
            phases: a.phases,
            items: a.items,
        })
    }

    fn pipeline(&self, ctx: &GpuContext, src: &str, entry: &str) -> Result<wgpu::ComputePipeline> {
        ctx.scoped("building the sync probe", || {
            let module = ctx
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some("grid_sync"),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                });
            ctx.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(entry),
                    layout: Some(&self.pipeline_layout),
                    module: &module,
                    entry_point: Some(entry),
                    compilation_options: Default::default(),
                    cache: None,
                })
        })
    }

    /// Zero the values and counters before a run.
    fn reset(&self, ctx: &GpuContext) {
        let zeros = |b: &wgpu::Buffer| vec![0u8; b.size() as usize];
        ctx.queue.write_buffer(&self.vals, 0, &zeros(&self.vals));
        ctx.queue.write_buffer(&self.sync, 0, &zeros(&self.sync));
    }

    /// After a run: every phase's items done, the last phase's values all `phases`, and
    /// no lane that read early. Returns the workgroups that gave up waiting.
    fn verify(&self, ctx: &GpuContext, chain: &str, grid: bool) -> Result<u32> {
        let counters: Vec<u32> = read_buffer(ctx, &self.sync, 2 + 2 * self.phases as usize)?;
        let n = (u64::from(self.items) * LANES) as usize;
        let vals: Vec<f32> = read_buffer(ctx, &self.vals, 2 * n)?;
        let last = if (self.phases - 1) % 2 == 0 { n } else { 0 };
        let want = self.phases as f32;
        let wrong_vals = vals[last..last + n].iter().filter(|v| **v != want).count();
        let unfinished = (0..self.phases as usize)
            .filter(|k| grid && counters[3 + 2 * k] != self.items)
            .count();
        if counters[0] != 0 || wrong_vals != 0 || unfinished != 0 {
            return Err(Error::gpu(format!(
                "sync probe, {chain}: {} lane reads saw a phase unfinished, {wrong_vals} of \
                 {n} final values are not {want}, {unfinished} phases left items undone",
                counters[0]
            )));
        }
        Ok(counters[1])
    }
}

/// One chain timed `reps` times, each run checked.
fn measure(
    ctx: &GpuContext,
    timer: &Timer,
    probe: &Probe,
    reps: usize,
    grid: Option<(&wgpu::ComputePipeline, u32)>,
    one: &wgpu::ComputePipeline,
) -> Result<Outcome> {
    let (chain, workgroups) = match grid {
        Some((_, w)) => ("one dispatch", w),
        None => ("a dispatch per phase", probe.items),
    };
    let record = |pass: &mut wgpu::ComputePass<'_>| -> Result<()> {
        match grid {
            Some((pipeline, w)) => {
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, &probe.bind, &[0]);
                pass.dispatch_workgroups(w, 1, 1);
            }
            None => {
                pass.set_pipeline(one);
                for k in 0..probe.phases {
                    pass.set_bind_group(0, &probe.bind, &[(u64::from(k) * probe.stride) as u32]);
                    pass.dispatch_workgroups(probe.items, 1, 1);
                }
            }
        }
        Ok(())
    };
    let mut secs = Vec::with_capacity(reps);
    let mut gave_up = 0;
    // One run first, untimed: llvmpipe compiles a pipeline's code at its first dispatch.
    for i in 0..=reps {
        probe.reset(ctx);
        let s = timer.once(ctx, &record)?;
        let g = probe.verify(ctx, chain, grid.is_some())?;
        if i > 0 {
            secs.push(s);
            gave_up += g;
        }
    }
    Ok(Outcome {
        chain,
        workgroups,
        samples: Samples {
            secs,
            gpu_clock: timer.gpu_clock(),
        },
        gave_up,
    })
}

pub fn run(a: &SyncArgs) -> Result<()> {
    check(a)?;
    let ctx = crate::context(&a.device)?;
    let timer = Timer::new(&ctx, !a.host_clock);
    let probe = Probe::new(&ctx, a)?;
    let one = probe.pipeline(&ctx, SOURCE, "one_phase")?;
    let grid = probe.pipeline(&ctx, SOURCE, "grid")?;
    let mut widths = a.workgroups.clone();
    if widths.is_empty() {
        widths = vec![wgllm::gpu::context::host_cores(), a.items];
        widths.dedup();
    }
    let mut results = vec![measure(&ctx, &timer, &probe, a.reps, None, &one)?];
    for w in widths {
        results.push(measure(
            &ctx,
            &timer,
            &probe,
            a.reps,
            Some((&grid, w)),
            &one,
        )?);
    }
    let per_phase = |o: &Outcome| o.samples.median() / f64::from(a.phases) * 1e6;
    if a.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|o| {
                serde_json::json!({
                    "chain": o.chain,
                    "workgroups": o.workgroups,
                    "median_ms": o.samples.median() * 1e3,
                    "us_per_phase": per_phase(o),
                    "gave_up": o.gave_up,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "device": ctx.describe(),
            "phases": a.phases,
            "items": a.items,
            "reps": a.reps,
            "results": rows,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return Ok(());
    }
    println!("device: {}", ctx.describe());
    println!(
        "{} phases of {} items (8 lanes each), {} checked runs each ({} clock)",
        a.phases,
        a.items,
        a.reps,
        if timer.gpu_clock() { "device" } else { "host" }
    );
    println!("| chain | workgroups | median ms | spread | us per phase | gave up waiting |");
    println!("|---|---:|---:|---:|---:|---:|");
    for o in &results {
        println!(
            "| {} | {} | {:.3} | {:.0}% | {:.1} | {} |",
            o.chain,
            o.workgroups,
            o.samples.median() * 1e3,
            o.samples.spread() * 100.0,
            per_phase(o),
            o.gave_up
        );
    }
    Ok(())
}
