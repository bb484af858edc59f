//! Painting egui output with wgpu, into the window's surface or an offscreen texture, and
//! writing an offscreen frame to a PNG.

use std::path::Path;

use wgllm::gpu::GpuContext;
use wgllm::{Error, Result};

/// Background behind the panels.
const CLEAR: wgpu::Color = wgpu::Color {
    r: 0.05,
    g: 0.05,
    b: 0.06,
    a: 1.0,
};

/// Upload `out`'s texture changes, draw its shapes into `view` and submit.
pub fn paint(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    renderer: &mut egui_wgpu::Renderer,
    egui_ctx: &egui::Context,
    mut out: egui::FullOutput,
    view: &wgpu::TextureView,
    size: [u32; 2],
) {
    let ppp = out.pixels_per_point;
    let mut textures = std::mem::take(&mut out.textures_delta);
    upload_textures(device, queue, renderer, &textures);
    let prims = egui_ctx.tessellate(out.shapes, ppp);
    let screen = egui_wgpu::ScreenDescriptor {
        size_in_pixels: size,
        pixels_per_point: ppp,
    };
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("viz frame"),
    });
    let extra = renderer.update_buffers(device, queue, &mut encoder, &prims, &screen);
    {
        let pass = encoder.begin_render_pass(&wgpu::RenderPassDescriptor {
            label: Some("viz egui"),
            color_attachments: &[Some(wgpu::RenderPassColorAttachment {
                view,
                resolve_target: None,
                ops: wgpu::Operations {
                    load: wgpu::LoadOp::Clear(CLEAR),
                    store: wgpu::StoreOp::Store,
                },
                depth_slice: None,
            })],
            depth_stencil_attachment: None,
            timestamp_writes: None,
            occlusion_query_set: None,
            multiview_mask: None,
        });
        renderer.render(&mut pass.forget_lifetime(), &prims, &screen);
    }
    queue.submit(extra.into_iter().chain([encoder.finish()]));
    for id in &textures.free {
        renderer.free_texture(id);
    }
    textures.clear();
}

fn upload_textures(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    renderer: &mut egui_wgpu::Renderer,
    textures: &egui::TexturesDelta,
) {
    for (id, deltas) in &textures.set {
        for delta in deltas {
            renderer.update_texture(device, queue, *id, delta);
        }
    }
}

/// The offscreen target's format: 8-bit sRGB, the same bytes a PNG stores.
const FORMAT: wgpu::TextureFormat = wgpu::TextureFormat::Rgba8UnormSrgb;

/// Run `ui` for a few passes at `width`×`height` (egui sizes some widgets in a first
/// pass), render the last into a texture and write it to `path` as an RGBA PNG.
pub fn capture(
    ctx: &GpuContext,
    width: u32,
    height: u32,
    path: &Path,
    mut ui: impl FnMut(&mut egui::Ui),
) -> Result<()> {
    let max = ctx.limits.max_texture_dimension_2d;
    if width == 0 || height == 0 || width > max || height > max {
        return Err(Error::invalid(format!(
            "screenshot size {width}x{height}: each side must be 1..={max}"
        )));
    }
    let device = &ctx.device;
    let texture = device.create_texture(&wgpu::TextureDescriptor {
        label: Some("viz screenshot"),
        size: wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: FORMAT,
        usage: wgpu::TextureUsages::RENDER_ATTACHMENT | wgpu::TextureUsages::COPY_SRC,
        view_formats: &[],
    });
    let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
    let mut renderer =
        egui_wgpu::Renderer::new(device, FORMAT, egui_wgpu::RendererOptions::default());
    let egui_ctx = egui::Context::default();
    let input = || egui::RawInput {
        screen_rect: Some(egui::Rect::from_min_size(
            egui::Pos2::ZERO,
            egui::vec2(width as f32, height as f32),
        )),
        ..Default::default()
    };
    // Earlier passes only settle layout; their texture uploads (the font atlas) still
    // have to reach the renderer.
    for _ in 0..3 {
        let mut out = egui_ctx.run_ui(input(), &mut ui);
        upload_textures(device, &ctx.queue, &mut renderer, &out.textures_delta);
        for id in &out.textures_delta.free {
            renderer.free_texture(id);
        }
        out.textures_delta.clear();
    }
    let out = egui_ctx.run_ui(input(), &mut ui);
    ctx.scoped("screenshot render", || {
        paint(
            device,
            &ctx.queue,
            &mut renderer,
            &egui_ctx,
            out,
            &view,
            [width, height],
        )
    })?;
    let rgba = read_texture(ctx, &texture, width, height)?;
    write_png(path, width, height, &rgba)
}

/// The texture's pixels, tightly packed RGBA rows.
fn read_texture(
    ctx: &GpuContext,
    texture: &wgpu::Texture,
    width: u32,
    height: u32,
) -> Result<Vec<u8>> {
    let row = width as u64 * 4;
    // Copies to buffers need rows padded to 256 bytes.
    let padded = row.next_multiple_of(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT as u64);
    let bytes = padded * height as u64;
    let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("viz screenshot copy"),
        size: bytes,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("viz screenshot copy"),
        });
    encoder.copy_texture_to_buffer(
        texture.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &buffer,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(padded as u32),
                rows_per_image: Some(height),
            },
        },
        wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
    );
    ctx.queue.submit([encoder.finish()]);
    let raw: Vec<u8> = wgllm::gpu::readback::read_buffer(ctx, &buffer, bytes as usize)?;
    let mut out = Vec::with_capacity((row * height as u64) as usize);
    for r in raw.chunks(padded as usize).take(height as usize) {
        out.extend_from_slice(&r[..row as usize]);
    }
    Ok(out)
}

fn write_png(path: &Path, width: u32, height: u32, rgba: &[u8]) -> Result<()> {
    let io = |e: std::io::Error| Error::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let png_err = |e: png::EncodingError| Error::invalid(format!("{}: {e}", path.display()));
    let mut w = enc.write_header().map_err(png_err)?;
    w.write_image_data(rgba).map_err(png_err)?;
    w.finish().map_err(png_err)
}
