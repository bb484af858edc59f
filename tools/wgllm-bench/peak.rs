//! Read-bandwidth probes (`read_peak.wgsl`): the device's practical peak for streaming
//! reads, measured in the same run as the kernels so "% of peak" compares like with like.

use wgllm::gpu::upload::storage;
use wgllm::gpu::GpuContext;
use wgllm::{Error, Result};

use crate::timing::{Samples, Timer};

const SOURCE: &str = include_str!("read_peak.wgsl");

/// One access pattern: entry point, workgroup size and vec4s per invocation.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    pub entry: &'static str,
    pub wg: u32,
    pub per_inv: u32,
}

impl Pattern {
    pub fn name(&self) -> String {
        format!("{} wg{} run{}", self.entry, self.wg, self.per_inv)
    }
}

#[derive(Clone, Debug)]
pub struct PeakResult {
    pub pattern: Pattern,
    pub bytes: u64,
    pub samples: Samples,
}

impl PeakResult {
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.samples.median() / 1e9
    }
}

/// Every probe, for `wgllm-bench peak --all`.
pub fn all_patterns() -> Vec<Pattern> {
    let mut v = Vec::new();
    for entry in ["run_vec4", "run_vec4_x4", "run_u32", "strided_vec4"] {
        for wg in [1, 8, 64, 256] {
            for per_inv in [64, 1024] {
                v.push(Pattern { entry, wg, per_inv });
            }
        }
    }
    for entry in ["tex_vec4", "tex_vec4_x4", "img_vec4", "img_vec4_x4"] {
        for wg in [8, 64] {
            for per_inv in [64, 1024] {
                v.push(Pattern { entry, wg, per_inv });
            }
        }
    }
    for wg in [1, 8, 64] {
        v.push(Pattern {
            entry: "same_addr_vec4",
            wg,
            per_inv: 1024,
        });
        v.push(Pattern {
            entry: "ubo_vec4",
            wg,
            per_inv: 1024,
        });
        v.push(Pattern {
            entry: "ubo_same_vec4",
            wg,
            per_inv: 1024,
        });
    }
    v
}

/// The patterns the peak is taken over: per-invocation contiguous runs (fastest on
/// CPU-hosted drivers) and grid-strided reads (fastest on real GPUs).
pub fn peak_patterns() -> Vec<Pattern> {
    vec![
        Pattern {
            entry: "run_vec4_x4",
            wg: 64,
            per_inv: 1024,
        },
        Pattern {
            entry: "run_vec4",
            wg: 64,
            per_inv: 256,
        },
        Pattern {
            entry: "strided_vec4",
            wg: 256,
            per_inv: 16,
        },
        Pattern {
            entry: "strided_vec4",
            wg: 64,
            per_inv: 64,
        },
    ]
}

fn layout(ctx: &GpuContext) -> wgpu::BindGroupLayout {
    use wgllm::gpu::pipelines::Binding;
    ctx.device
        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("read_peak"),
            entries: &[
                Binding::Uniform.entry(0),
                Binding::Read.entry(1),
                Binding::Read.entry(2),
                Binding::ReadWrite.entry(3),
                Binding::Uniform.entry(4),
                wgpu::BindGroupLayoutEntry {
                    binding: 5,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Texture {
                        sample_type: wgpu::TextureSampleType::Uint,
                        view_dimension: wgpu::TextureViewDimension::D2,
                        multisampled: false,
                    },
                    count: None,
                },
                wgpu::BindGroupLayoutEntry {
                    binding: 6,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::StorageTexture {
                        access: wgpu::StorageTextureAccess::ReadOnly,
                        format: wgpu::TextureFormat::Rgba32Uint,
                        view_dimension: wgpu::TextureViewDimension::D2,
                    },
                    count: None,
                },
            ],
        })
}

/// Measure `patterns` over a buffer of `bytes` bytes.
pub fn measure(
    ctx: &GpuContext,
    timer: &Timer,
    bytes: u64,
    patterns: &[Pattern],
    reps: usize,
) -> Result<Vec<PeakResult>> {
    let max = ctx.max_binding().min(ctx.limits.max_buffer_size);
    let bytes = bytes.min(max) / 16 * 16;
    let n_vec4 = (bytes / 16) as u32;
    // Cheap non-zero contents: the page must be touched for the reads to be real.
    let words: Vec<u32> = (0..n_vec4 * 4)
        .map(|i| i.wrapping_mul(2654435761))
        .collect();
    // Created, then (on CPU-hosted devices) marked for huge pages before the writes
    // first touch them, as the weights' memory is: the peak and the kernels read the
    // same kind of pages.
    let src = storage(ctx, "peak src", bytes)?;
    ctx.advise_huge_pages();
    ctx.queue
        .write_buffer(&src, 0, bytemuck::cast_slice(&words));
    let tex_view = texture(ctx, &words);
    drop(words);
    let ubo_init: Vec<u32> = (0..4096 * 4).collect();
    let ubo = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("peak ubo"),
        size: 65536,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx.queue
        .write_buffer(&ubo, 0, bytemuck::cast_slice(&ubo_init));
    let bgl = layout(ctx);
    let pl = ctx
        .device
        .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("read_peak"),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
    let module = ctx.scoped("read_peak shader", || {
        ctx.device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("read_peak"),
                source: wgpu::ShaderSource::Wgsl(SOURCE.into()),
            })
    })?;
    let mut out = Vec::new();
    for pat in patterns {
        let n_inv = n_vec4 / pat.per_inv;
        let (groups, out_words) =
            if pat.entry.starts_with("same_addr") || pat.entry == "ubo_same_vec4" {
                (n_inv, n_inv as u64 * pat.wg as u64)
            } else {
                (n_inv.div_ceil(pat.wg), n_inv as u64)
            };
        if groups == 0 || groups > ctx.limits.max_compute_workgroups_per_dimension {
            continue;
        }
        let pipe = ctx.scoped(&format!("read_peak {}", pat.name()), || {
            ctx.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(pat.entry),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some(pat.entry),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &[("WG", pat.wg as f64)],
                        zero_initialize_workgroup_memory: false,
                    },
                    cache: None,
                })
        })?;
        let params = [pat.per_inv, n_inv, n_vec4, 0];
        let pb = storage_uniform(ctx, &params);
        let ob = storage(ctx, "peak out", out_words * 4)?;
        let bg = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("read_peak"),
            layout: &bgl,
            entries: &[
                bind(0, &pb),
                bind(1, &src),
                bind(2, &src),
                bind(3, &ob),
                bind(4, &ubo),
                wgpu::BindGroupEntry {
                    binding: 5,
                    resource: wgpu::BindingResource::TextureView(&tex_view),
                },
                wgpu::BindGroupEntry {
                    binding: 6,
                    resource: wgpu::BindingResource::TextureView(&tex_view),
                },
            ],
        });
        let samples = timer.time(ctx, 1, reps, &|pass| {
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(groups, 1, 1);
            Ok(())
        })?;
        // run_u32 reads words, not vec4s.
        let read = if pat.entry == "run_u32" {
            n_inv as u64 * pat.per_inv as u64 * 4
        } else {
            n_inv as u64 * pat.per_inv as u64 * 16
        };
        out.push(PeakResult {
            pattern: *pat,
            bytes: read,
            samples,
        });
    }
    Ok(out)
}

/// The texture-read probes the peak of weights held in textures is taken over: loads
/// through a read-only storage binding, as the kernels read their weight textures.
pub fn texture_patterns() -> Vec<Pattern> {
    ["img_vec4_x4", "img_vec4"]
        .into_iter()
        .map(|entry| Pattern {
            entry,
            wg: 64,
            per_inv: 1024,
        })
        .collect()
}

/// The fastest of `patterns` over `bytes` bytes.
pub fn peak(
    ctx: &GpuContext,
    timer: &Timer,
    bytes: u64,
    patterns: &[Pattern],
    reps: usize,
) -> Result<PeakResult> {
    measure(ctx, timer, bytes, patterns, reps)?
        .into_iter()
        .max_by(|a, b| a.gbps().total_cmp(&b.gbps()))
        .ok_or_else(|| Error::gpu("no read pattern could run on this device"))
}

/// TEX_W (read_peak.wgsl, the weights' `gpu::upload::TEX_W`) texels wide: `words` as
/// rgba32uint texels, row-major.
fn texture(ctx: &GpuContext, words: &[u32]) -> wgpu::TextureView {
    use wgllm::gpu::upload::{weight_texture, TEX_W};
    let height = ((words.len() / 4) as u32 / TEX_W).clamp(1, ctx.limits.max_texture_dimension_2d);
    let tex = weight_texture(ctx, "peak texture", height);
    ctx.advise_huge_pages();
    let size = tex.size();
    let n = (TEX_W * height * 4) as usize;
    if words.len() >= n {
        ctx.queue.write_texture(
            wgpu::TexelCopyTextureInfo {
                texture: &tex,
                mip_level: 0,
                origin: wgpu::Origin3d::ZERO,
                aspect: wgpu::TextureAspect::All,
            },
            bytemuck::cast_slice(&words[..n]),
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(TEX_W * 16),
                rows_per_image: Some(height),
            },
            size,
        );
    }
    tex.create_view(&wgpu::TextureViewDescriptor::default())
}

fn bind(binding: u32, b: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: b.as_entire_binding(),
    }
}

fn storage_uniform(ctx: &GpuContext, v: &[u32; 4]) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    ctx.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("peak params"),
            contents: bytemuck::cast_slice(v),
            usage: wgpu::BufferUsages::UNIFORM,
        })
}
