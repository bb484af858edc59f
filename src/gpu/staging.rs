//! Filling weight textures through a small ring of staging buffers.
//!
//! A texture has no memory the host can map, so its bytes reach it through a mapped
//! buffer and a buffer-to-texture copy. Staging a whole part at once (up to one storage
//! binding: 128 MiB on lavapipe) took a fresh buffer of that size for every part, which
//! the driver faults in page by page, wgpu zero-fills, the host fills and the device
//! reads back: four passes over memory the size of the model, and the staged copy stayed
//! resident until its copy had run. The ring instead streams every texture through
//! [`STAGES`] buffers of [`STAGE_BYTES`] that are reused from one texture to the next:
//! the host fills one while the device copies the other, and the staged bytes are
//! written and read while they are still in the cache.

use std::sync::mpsc;

use super::upload::{TEXEL_BYTES, TEX_W};
use super::GpuContext;
use crate::{Error, Result};

/// Bytes per staging buffer: a whole number of texture rows, so that every full buffer
/// lands on whole rows of the texture.
pub const STAGE_BYTES: u64 = 4 << 20;
/// Staging buffers in the ring: one being filled while the other's copy runs.
pub const STAGES: usize = 2;

/// Bytes per texture row.
const ROW_BYTES: u64 = TEX_W as u64 * TEXEL_BYTES;

const _: () = assert!(STAGE_BYTES % ROW_BYTES == 0);

/// The staging buffers a [`GpuContext`] keeps between texture uploads (see
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
                    label: Some("texture staging"),
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
            .map_err(|e| Error::gpu(format!("waiting for a texture upload: {e}")))?;
        rx.recv()
            .map_err(|_| Error::gpu("mapping a staging buffer: the callback never ran"))?
            .map_err(|e| Error::gpu(format!("mapping a staging buffer: {e}")))?;
        self.mapped[i] = true;
        Ok(())
    }
}

/// Writes one texture's bytes, row-major from texel 0, through the context's staging
/// ring: [`TextureFill::write`] appends, [`TextureFill::finish`] pads the last row with
/// zeros and checks that every row was written.
pub struct TextureFill<'a> {
    ctx: &'a GpuContext,
    ring: std::sync::MutexGuard<'a, StagingRing>,
    texture: &'a wgpu::Texture,
    /// The buffer being filled and its mapped view.
    current: Option<(usize, wgpu::BufferViewMut)>,
    /// Bytes in the current buffer.
    filled: u64,
    /// The texture row the current buffer's bytes land on.
    row: u32,
}

impl<'a> TextureFill<'a> {
    /// Starts filling `texture` (as wide as [`TEX_W`] texels).
    pub fn new(ctx: &'a GpuContext, texture: &'a wgpu::Texture) -> Result<TextureFill<'a>> {
        let ring = ctx
            .staging
            .lock()
            .map_err(|_| Error::gpu("the staging buffers were poisoned by a failed upload"))?;
        Ok(TextureFill {
            ctx,
            ring,
            texture,
            current: None,
            filled: 0,
            row: 0,
        })
    }

    /// Appends `bytes`.
    pub fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
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

    /// Pads the last row with zeros, copies what is left and checks that the texture's
    /// every row was written.
    pub fn finish(mut self) -> Result<()> {
        if self.filled > 0 {
            let end = self.filled.next_multiple_of(ROW_BYTES);
            let at = self.filled as usize;
            let zeros = vec![0u8; (end - self.filled) as usize];
            self.view()?
                .slice(at..at + zeros.len())
                .copy_from_slice(&zeros);
            self.filled = end;
            self.flush()?;
        }
        let height = self.texture.height();
        if self.row != height {
            return Err(Error::gpu(format!(
                "texture {height} rows high filled with {} rows",
                self.row
            )));
        }
        Ok(())
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

    /// Copies the current buffer's whole rows into the texture (one submission) and
    /// moves on to the ring's next buffer.
    fn flush(&mut self) -> Result<()> {
        let Some((i, view)) = self.current.take() else {
            return Ok(());
        };
        drop(view);
        let buffer = self.ring.buffer(self.ctx, i);
        buffer.unmap();
        self.ring.mapped[i] = false;
        let rows = (self.filled / ROW_BYTES) as u32;
        if self.row + rows > self.texture.height() {
            return Err(Error::gpu(format!(
                "texture {} rows high written past its end",
                self.texture.height()
            )));
        }
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer: &buffer,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: 0,
                    bytes_per_row: Some(ROW_BYTES as u32),
                    rows_per_image: Some(rows),
                },
            },
            wgpu::TexelCopyTextureInfo {
                texture: self.texture,
                mip_level: 0,
                origin: wgpu::Origin3d {
                    x: 0,
                    y: self.row,
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
        self.ctx.queue.submit([enc.finish()]);
        self.row += rows;
        self.filled = 0;
        self.ring.next = (i + 1) % STAGES;
        Ok(())
    }
}
