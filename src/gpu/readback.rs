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

    /// Make room for readbacks of `bytes`: a larger staging buffer where this one is
    /// smaller, never a smaller one (each output a model reads back needs its own size:
    /// logits of a token or of a batch, top-k's candidate list).
    pub fn reserve(&mut self, ctx: &GpuContext, bytes: u64) {
        if bytes > self.capacity {
            *self = Readback::new(ctx, bytes);
        }
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
        self.read_waiting(ctx, count, Wait::Block)
    }

    /// [`read`](Self::read), waiting as `wait` says.
    pub fn read_waiting<T: bytemuck::Pod>(
        &self,
        ctx: &GpuContext,
        count: usize,
        wait: Wait,
    ) -> Result<Vec<T>> {
        let bytes = (count * std::mem::size_of::<T>()) as u64;
        if bytes > self.capacity {
            return Err(Error::gpu("readback larger than its staging buffer"));
        }
        if bytes == 0 {
            return Ok(Vec::new());
        }
        map_read_waiting(ctx, &self.staging, count, wait)
    }
}

/// How the host waits for submitted work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Sleep until the device signals.
    Block,
    /// Poll, yielding the core between polls, for up to this long; then sleep.
    ///
    /// On CPU-hosted drivers (lavapipe) every dispatch hands its workgroups to the
    /// driver's worker threads and waits for them, so a step of a few hundred small
    /// dispatches wakes those threads a few hundred times; where an idle core halts at
    /// once (virtual machines without halt polling) each wake-up costs tens of
    /// microseconds. A host thread that stays runnable keeps a core awake for them.
    /// Measured on lavapipe, single-token steps alternated in one process: SmolLM2
    /// 0.84-0.85x and Gemma 3 0.88-0.95x the time (docs/perf.md). Long dispatches lose instead (a
    /// 64-token prompt step 1.14-1.38x slower: the polling thread takes time from the
    /// workers), hence the cap and only single tokens (`model::gpu_backend`), whose
    /// output head, one long product, is waited for blocking.
    Spin(std::time::Duration),
}

/// Wait for the work submitted so far, then return the first `count` values of the
/// MAP_READ buffer `buffer` (which must hold them) and unmap it again.
pub fn map_read<T: bytemuck::Pod>(
    ctx: &GpuContext,
    buffer: &wgpu::Buffer,
    count: usize,
) -> Result<Vec<T>> {
    map_read_waiting(ctx, buffer, count, Wait::Block)
}

/// [`map_read`], waiting as `wait` says.
pub fn map_read_waiting<T: bytemuck::Pod>(
    ctx: &GpuContext,
    buffer: &wgpu::Buffer,
    count: usize,
    wait: Wait,
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
    let mapped = match wait_spinning(ctx, &rx, wait)? {
        Some(r) => r,
        None => {
            ctx.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::gpu(format!("waiting for the GPU: {e}")))?;
            rx.recv()
                .map_err(|_| Error::gpu("readback callback never ran"))?
        }
    };
    mapped.map_err(|e| Error::gpu(format!("mapping a readback buffer: {e}")))?;
    let out = {
        let view = slice
            .get_mapped_range()
            .map_err(|e| Error::gpu(format!("reading back: {e}")))?;
        bytemuck::cast_slice::<u8, T>(&view).to_vec()
    };
    buffer.unmap();
    Ok(out)
}

type MapResult = std::result::Result<(), wgpu::BufferAsyncError>;

/// With [`Wait::Spin`], poll until the mapping's callback has run or the time is up:
/// its result, or `None` to go on waiting by blocking.
fn wait_spinning(
    ctx: &GpuContext,
    rx: &std::sync::mpsc::Receiver<MapResult>,
    wait: Wait,
) -> Result<Option<MapResult>> {
    match wait {
        Wait::Spin(cap) => poll_for(ctx, rx, cap),
        Wait::Block => Ok(None),
    }
}

/// Poll the device, giving the core away between polls, until a callback sends on `rx`
/// or `cap` has passed: what it sent, or `None` at the cap.
pub fn poll_for<R>(
    ctx: &GpuContext,
    rx: &std::sync::mpsc::Receiver<R>,
    cap: std::time::Duration,
) -> Result<Option<R>> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < cap {
        ctx.device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| Error::gpu(format!("waiting for the GPU: {e}")))?;
        match rx.try_recv() {
            Ok(r) => return Ok(Some(r)),
            Err(std::sync::mpsc::TryRecvError::Empty) => std::thread::yield_now(),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                return Err(Error::gpu("a GPU callback never ran"))
            }
        }
    }
    Ok(None)
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
