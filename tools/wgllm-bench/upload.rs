//! Upload bandwidth: how fast weights reach device memory through `GpuTensor::upload`
//! (the path model loading takes, including the planar reordering of `gpu::layout`),
//! against the device's own write bandwidth measured in the same run.
//!
//! The source bytes are resident host memory, so the figures are the copy into the
//! device, not the disk (a cold model load adds the page-in of the file map).

use std::time::Instant;

use wgllm::gguf::TensorInfo;
use wgllm::gpu::upload::flush_uploads;
use wgllm::gpu::{GpuContext, GpuTensor};
use wgllm::quant::GgmlType;
use wgllm::{Error, Result};

#[derive(clap::Args)]
pub struct UploadArgs {
    /// Adapter index or name substring.
    #[arg(long)]
    device: Option<String>,
    /// MiB per upload (capped at the device's binding limit).
    #[arg(long, default_value_t = 64)]
    mib: u64,
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

/// Best (highest) GB/s of `reps` runs of `f`, which moves `bytes` bytes.
fn best(reps: usize, bytes: u64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut gbps: f64 = 0.0;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        gbps = gbps.max(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(gbps)
}

/// The device's write bandwidth from the host, each path waited for: into fresh
/// buffers (`queue.write_buffer`, and the host writing a mappable buffer mapped at
/// creation) and into buffers already resident (no first-touch page faults):
/// `queue.write_buffer`, and the host writing a mappable buffer mapped again (on
/// devices whose memory is host memory, the plain write bandwidth). The peak is the
/// fastest of the four.
fn write_peak(ctx: &GpuContext, src: &[u8], reps: usize) -> Result<[f64; 4]> {
    let bytes = src.len() as u64;
    let mappable = |mapped_at_creation| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("upload peak mapped"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation,
        })
    };
    let write_mapped = |b: &wgpu::Buffer| -> Result<()> {
        b.get_mapped_range_mut(..)
            .map_err(|e| Error::gpu(format!("mapping: {e}")))?
            .copy_from_slice(src);
        b.unmap();
        flush_uploads(ctx)
    };
    let fresh_queue = best(reps, bytes, || {
        let dst = wgllm::gpu::upload::storage(ctx, "upload peak", bytes)?;
        ctx.queue.write_buffer(&dst, 0, src);
        flush_uploads(ctx)
    })?;
    let fresh_mapped = best(reps, bytes, || write_mapped(&mappable(true)))?;
    let dst = wgllm::gpu::upload::storage(ctx, "upload peak resident", bytes)?;
    let resident_queue = best(reps, bytes, || {
        ctx.queue.write_buffer(&dst, 0, src);
        flush_uploads(ctx)
    })?;
    let resident = mappable(true);
    write_mapped(&resident)?;
    let resident_mapped = best(reps, bytes, || {
        let (tx, rx) = std::sync::mpsc::channel();
        resident.map_async(wgpu::MapMode::Write, .., move |r| {
            let _ = tx.send(r);
        });
        flush_uploads(ctx)?;
        rx.recv()
            .map_err(|_| Error::gpu("map callback never ran"))?
            .map_err(|e| Error::gpu(format!("mapping: {e}")))?;
        write_mapped(&resident)
    })?;
    Ok([fresh_queue, fresh_mapped, resident_queue, resident_mapped])
}

pub fn run(a: &UploadArgs) -> Result<()> {
    let ctx = crate::context(&a.device)?;
    println!("device: {}", ctx.describe());
    let cap = ctx.max_binding().min(ctx.limits.max_buffer_size);
    let bytes = (a.mib << 20).min(cap) as usize;
    // Cheap non-zero contents, resident before any timing.
    let src: Vec<u8> = (0..bytes)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
        .collect();
    let peaks = write_peak(&ctx, &src, a.reps)?;
    let peak = peaks.into_iter().fold(0.0, f64::max);
    let mib = bytes >> 20;
    let pct = |g: f64| g / peak * 100.0;
    println!("| path | MiB | GB/s | of write peak |");
    println!("|---|---:|---:|---:|");
    let paths = [
        "fresh buffer, queue.write_buffer",
        "fresh mappable buffer, written mapped",
        "resident buffer, queue.write_buffer",
        "resident mappable buffer, written mapped",
    ];
    for (path, g) in paths.into_iter().zip(peaks) {
        println!("| {path} | {mib} | {g:.2} | {:.0}% |", pct(g));
    }
    for ty in [
        GgmlType::F16,
        GgmlType::Q4_K,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
    ] {
        let n_cols = 4096u64;
        let row = ty
            .row_bytes(n_cols)
            .ok_or_else(|| Error::invalid("row is not whole blocks"))?;
        let n_rows = bytes as u64 / row;
        let len = (n_rows * row) as usize;
        let info = TensorInfo {
            name: format!("upload {ty}"),
            dims: vec![n_cols, n_rows],
            ty,
            offset: 0,
            n_bytes: len as u64,
        };
        let gbps = best(a.reps, len as u64, || {
            let t = GpuTensor::upload(&ctx, &info, &src[..len])?;
            flush_uploads(&ctx)?;
            drop(t);
            Ok(())
        })?;
        let layout = if wgllm::gpu::layout::planes(ty).is_some() {
            "planar"
        } else {
            "verbatim"
        };
        println!(
            "| GpuTensor::upload {ty} ({layout}) | {} | {gbps:.2} | {:.0}% |",
            len >> 20,
            gbps / peak * 100.0
        );
    }
    Ok(())
}
