//! Reading GPU buffers back to the host. Mapping and polling live only here.

use crate::{Error, Result};

use super::GpuContext;

/// A reusable staging buffer for reading results back.
pub struct Readback {
    staging: wgpu::Buffer,
    capacity: u64,
}

impl Readback {
    pub fn new(ctx: &GpuContext, capacity: u64) -> Readback {
        let capacity = capacity
            .max(4)
            .next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: capacity,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Readback { staging, capacity }
    }

    /// Record a copy of `bytes` bytes from `src` at `offset` into the staging buffer.
    pub fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<()> {
        if bytes > self.capacity || bytes % 4 != 0 || offset % 4 != 0 {
            return Err(Error::gpu(format!(
                "readback of {bytes} bytes at {offset} exceeds staging capacity {}",
                self.capacity
            )));
        }
        encoder.copy_buffer_to_buffer(src, offset, &self.staging, 0, bytes);
        Ok(())
    }

    /// Wait for the copy recorded by [`record`](Self::record) (after submission) and
    /// return its first `count` values.
    pub fn read<T: bytemuck::Pod>(&self, ctx: &GpuContext, count: usize) -> Result<Vec<T>> {
        let bytes = (count * std::mem::size_of::<T>()) as u64;
        if bytes > self.capacity {
            return Err(Error::gpu("readback larger than its staging buffer"));
        }
        if bytes == 0 {
            return Ok(Vec::new());
        }
        map_read(ctx, &self.staging, count)
    }
}

/// Wait for the work submitted so far, then return the first `count` values of the
/// MAP_READ buffer `buffer` (which must hold them) and unmap it again.
pub fn map_read<T: bytemuck::Pod>(
    ctx: &GpuContext,
    buffer: &wgpu::Buffer,
    count: usize,
) -> Result<Vec<T>> {
    let bytes = (count * std::mem::size_of::<T>()) as u64;
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let slice = buffer.slice(0..bytes);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::gpu(format!("waiting for the GPU: {e}")))?;
    rx.recv()
        .map_err(|_| Error::gpu("readback callback never ran"))?
        .map_err(|e| Error::gpu(format!("mapping a readback buffer: {e}")))?;
    let out = {
        let view = slice
            .get_mapped_range()
            .map_err(|e| Error::gpu(format!("reading back: {e}")))?;
        bytemuck::cast_slice::<u8, T>(&view).to_vec()
    };
    buffer.unmap();
    Ok(out)
}

/// Read `count` values of `T` from the start of `buffer` (a one-off, for tests and tools).
pub fn read_buffer<T: bytemuck::Pod>(
    ctx: &GpuContext,
    buffer: &wgpu::Buffer,
    count: usize,
) -> Result<Vec<T>> {
    let bytes = (count * std::mem::size_of::<T>()) as u64;
    let rb = Readback::new(ctx, bytes);
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("read"),
        });
    rb.record(&mut enc, buffer, 0, bytes.next_multiple_of(4))?;
    ctx.queue.submit([enc.finish()]);
    rb.read(ctx, count)
}
