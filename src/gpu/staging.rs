//! Filling weight buffers and textures through a small ring of staging buffers.
//!
//! A texture has no memory the host can map, and neither has a discrete GPU's buffer,
//! so weights reach the device through mapped staging buffers and device copies. The
//! ring streams every weight through [`STAGES`] buffers of [`STAGE_BYTES`], reused from
//! one tensor to the next: the host fills one while the device copies the other, and
//! the staged bytes are written and read while they are still in the cache.
//!
//! Before, a texture part (up to one storage binding: 128 MiB on lavapipe) was staged
//! whole in a fresh buffer, which the driver faulted in page by page, wgpu zero-filled,
//! the host filled and the device read back, and which stayed resident until its copy
//! had run; buffers on devices whose memory is host memory were mapped at creation
//! (zero-filled by wgpu, then written) and elsewhere staged by wgpu a whole buffer at a
//! time. On lavapipe the ring uploads 3-6x faster than either (docs/perf.md, "Upload
//! bandwidth").

use std::sync::mpsc;

use super::upload::{TEXEL_BYTES, TEX_W};
use super::GpuContext;
use crate::{Error, Result};

/// Bytes per staging buffer: a whole number of texture rows, so that every full buffer
/// lands on whole rows of a texture. Measured on lavapipe (`wgllm-bench upload`), 2 MiB
/// uploads as fast as 4 MiB and holds 4-6 MiB less at the peak of a model's load.
pub const STAGE_BYTES: u64 = 2 << 20;
/// Staging buffers in the ring: one being filled while the other's copy runs.
pub const STAGES: usize = 2;

/// Bytes per texture row.
const ROW_BYTES: u64 = TEX_W as u64 * TEXEL_BYTES;

const _: () = assert!(STAGE_BYTES % ROW_BYTES == 0);

/// The staging buffers a [`GpuContext`] keeps between weight uploads (see
/// [`GpuContext::release_staging`]).
#[derive(Default)]
pub struct StagingRing {
    buffers: Vec<wgpu::Buffer>,
    /// Whether buffer i is mapped, ready for writing; a buffer whose copy was submitted
    /// is mapped again before its next use, which waits for that copy.
    mapped: Vec<bool>,
    /// The buffer the next write goes to.
    next: usize,
}

impl StagingRing {
    /// Buffer `i`, created on first use (mapped at creation).
    fn buffer(&mut self, ctx: &GpuContext, i: usize) -> wgpu::Buffer {
        while self.buffers.len() <= i {
            self.buffers
                .push(ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("weight staging"),
                    size: STAGE_BYTES,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: true,
                }));
            self.mapped.push(true);
        }
        self.buffers[i].clone()
    }

    /// Maps buffer `i` for writing if its last copy made it unmapped, waiting for that
    /// copy to finish.
    fn map(&mut self, ctx: &GpuContext, i: usize) -> Result<()> {
        if self.mapped[i] {
            return Ok(());
        }
        let (tx, rx) = mpsc::channel();
        self.buffers[i].map_async(wgpu::MapMode::Write, .., move |r| {
            let _ = tx.send(r);
        });
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::gpu(format!("waiting for a weight upload: {e}")))?;
        rx.recv()
            .map_err(|_| Error::gpu("mapping a staging buffer: the callback never ran"))?
            .map_err(|e| Error::gpu(format!("mapping a staging buffer: {e}")))?;
        self.mapped[i] = true;
        Ok(())
    }
}

/// Where a [`StagedFill`] writes: a weight texture (as wide as [`TEX_W`] texels, filled
/// row-major from texel 0) or a buffer (from byte 0).
#[derive(Clone, Copy)]
pub enum Target<'a> {
    Texture(&'a wgpu::Texture),
    Buffer(&'a wgpu::Buffer),
}

impl Target<'_> {
    /// Bytes the target holds, all of which a fill writes.
    fn size(&self) -> u64 {
        match self {
            Target::Texture(t) => t.height() as u64 * ROW_BYTES,
            Target::Buffer(b) => b.size(),
        }
    }
}

/// Writes a texture's or buffer's bytes in order through the context's staging ring:
/// [`StagedFill::write`] appends, [`StagedFill::finish`] pads the rest of the target
/// with zeros and copies what is left.
pub struct StagedFill<'a> {
    ctx: &'a GpuContext,
    ring: std::sync::MutexGuard<'a, StagingRing>,
    target: Target<'a>,
    /// The buffer being filled and its mapped view.
    current: Option<(usize, wgpu::BufferViewMut)>,
    /// Bytes in the current buffer.
    filled: u64,
    /// Bytes of the target already copied (the current buffer's offset in it).
    done: u64,
}

impl<'a> StagedFill<'a> {
    pub fn new(ctx: &'a GpuContext, target: Target<'a>) -> StagedFill<'a> {
        // A fill that panicked left the ring in an unknown state: start a new one.
        let ring = ctx.staging.lock().unwrap_or_else(|poisoned| {
            let mut ring = poisoned.into_inner();
            *ring = StagingRing::default();
            ring
        });
        StagedFill {
            ctx,
            ring,
            target,
            current: None,
            filled: 0,
            done: 0,
        }
    }

    /// Appends `bytes`.
    pub fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
        let size = self.target.size();
        if self.done + self.filled + bytes.len() as u64 > size {
            return Err(Error::gpu(format!(
                "{} bytes staged for a target of {size}",
                self.done + self.filled + bytes.len() as u64
            )));
        }
        while !bytes.is_empty() {
            let free = (STAGE_BYTES - self.filled) as usize;
            let n = free.min(bytes.len());
            let at = self.filled as usize;
            let view = self.view()?;
            view.slice(at..at + n).copy_from_slice(&bytes[..n]);
            self.filled += n as u64;
            bytes = &bytes[n..];
            if self.filled == STAGE_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Fills the rest of the target with zeros and copies what is left.
    pub fn finish(mut self) -> Result<()> {
        let zeros = vec![0u8; ROW_BYTES as usize];
        loop {
            let rest = self.target.size() - self.done - self.filled;
            if rest == 0 {
                break;
            }
            self.write(&zeros[..rest.min(ROW_BYTES) as usize])?;
        }
        self.flush()
    }

    /// The mapped view of the buffer being filled, mapping the ring's next one first.
    fn view(&mut self) -> Result<&mut wgpu::BufferViewMut> {
        if self.current.is_none() {
            let i = self.ring.next;
            let buffer = self.ring.buffer(self.ctx, i);
            self.ring.map(self.ctx, i)?;
            let view = buffer
                .get_mapped_range_mut(..)
                .map_err(|e| Error::gpu(format!("mapping a staging buffer: {e}")))?;
            self.current = Some((i, view));
        }
        match &mut self.current {
            Some((_, view)) => Ok(view),
            None => Err(Error::gpu("no staging buffer mapped")),
        }
    }

    /// Copies the current buffer's bytes into the target (one submission) and moves on
    /// to the ring's next buffer. A texture takes whole rows: the buffer is full, or the
    /// fill has reached the texture's end.
    fn flush(&mut self) -> Result<()> {
        let Some((i, view)) = self.current.take() else {
            return Ok(());
        };
        drop(view);
        let buffer = self.ring.buffer(self.ctx, i);
        buffer.unmap();
        self.ring.mapped[i] = false;
        self.ring.next = (i + 1) % STAGES;
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        match self.target {
            Target::Buffer(dst) => {
                enc.copy_buffer_to_buffer(&buffer, 0, dst, self.done, self.filled);
            }
            Target::Texture(texture) => {
                copy_rows(&mut enc, &buffer, texture, self.done, self.filled)
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.done += self.filled;
        self.filled = 0;
        Ok(())
    }
}

/// Records the copy of `bytes` (whole texture rows) from the start of `src` into
/// `texture` from byte `at` (a whole row) on.
fn copy_rows(
    enc: &mut wgpu::CommandEncoder,
    src: &wgpu::Buffer,
    texture: &wgpu::Texture,
    at: u64,
    bytes: u64,
) {
    let rows = (bytes / ROW_BYTES) as u32;
    enc.copy_buffer_to_texture(
        wgpu::TexelCopyBufferInfo {
            buffer: src,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(ROW_BYTES as u32),
                rows_per_image: Some(rows),
            },
        },
        wgpu::TexelCopyTextureInfo {
            texture,
            mip_level: 0,
            origin: wgpu::Origin3d {
                x: 0,
                y: (at / ROW_BYTES) as u32,
                z: 0,
            },
            aspect: wgpu::TextureAspect::All,
        },
        wgpu::Extent3d {
            width: TEX_W,
            height: rows,
            depth_or_array_layers: 1,
        },
    );
}
