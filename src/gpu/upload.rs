//! Weights go from the memory-mapped file into GPU buffers or textures, in the layout
//! of [`super::layout`] (the file encoding, or its bytes reordered planar per row): the
//! tensor's rows are copied from the map into a small ring of staging buffers, a few
//! MiB at a time, and from there by the device into the weight's own memory
//! ([`super::staging`]); no copy of the model is ever held on the host. A tensor larger
//! than one storage binding allows is split into row ranges.
//!
//! Where the context keeps a type's weights in textures ([`GpuContext::matrix_memory`]), a
//! matrix's bytes run row-major through rgba32uint texels, [`TEX_W`] texels to a texture
//! row (`shaders/common/w_texture.wgsl` reads them).

use wgpu::util::DeviceExt;

use crate::gguf::TensorInfo;
use crate::quant::GgmlType;
use crate::{Error, Result};

use super::staging::{StagedFill, Target};
use super::GpuContext;

/// Where weights are held: storage buffers, or textures bound as read-only storage
/// textures (which CPU-hosted drivers gather with SIMD loads, where each storage-buffer
/// load is a loop over the lanes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightMemory {
    Buffer,
    Texture,
}

impl WeightMemory {
    pub fn name(self) -> &'static str {
        match self {
            WeightMemory::Buffer => "buffer",
            WeightMemory::Texture => "texture",
        }
    }

    pub fn parse(s: &str) -> Option<WeightMemory> {
        [WeightMemory::Buffer, WeightMemory::Texture]
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
    }
}

/// log2 of [`TEX_W`] (`TEX_SHIFT` in shaders/common/w_texture.wgsl).
pub const TEX_SHIFT: u32 = 12;
/// Texels per row of a weight texture: 64 KiB, a multiple of the 256-byte row pitch a
/// buffer-to-texture copy needs.
pub const TEX_W: u32 = 1 << TEX_SHIFT;
/// Bytes per texel (rgba32uint).
pub(crate) const TEXEL_BYTES: u64 = 16;

/// The memory of one part.
pub enum PartMemory {
    Buffer(wgpu::Buffer),
    /// The view is what binds; the texture is kept with it.
    Texture(wgpu::Texture, wgpu::TextureView),
}

/// Rows `row0 .. row0 + n_rows` of a tensor, in one buffer or texture.
pub struct Part {
    pub memory: PartMemory,
    pub row0: u32,
    pub n_rows: u32,
}

impl Part {
    /// The buffer, for kernels that read this part from storage.
    pub fn buffer(&self) -> Option<&wgpu::Buffer> {
        match &self.memory {
            PartMemory::Buffer(b) => Some(b),
            PartMemory::Texture(..) => None,
        }
    }

    /// The whole part as a binding.
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        match &self.memory {
            PartMemory::Buffer(b) => b.as_entire_binding(),
            PartMemory::Texture(_, view) => wgpu::BindingResource::TextureView(view),
        }
    }
}

/// A weight tensor on the GPU, still quantized as in the file ([`super::layout`] says
/// how each row's bytes are ordered).
pub struct GpuTensor {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: ne[0] is the row length.
    pub ne: [u64; 4],
    /// Bytes per row on the GPU ([`super::layout::row_bytes`]).
    pub row_bytes: u64,
    /// Where every part is held.
    pub memory: WeightMemory,
    pub parts: Vec<Part>,
}

impl GpuTensor {
    pub fn n_cols(&self) -> u64 {
        self.ne[0]
    }

    /// Rows when the tensor is seen as a matrix [ne0, ne1 * ne2 * ne3].
    pub fn n_rows(&self) -> u64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    pub fn n_bytes(&self) -> u64 {
        self.row_bytes * self.n_rows()
    }

    /// Upload `data` (the tensor's bytes, borrowed from the file map) described by `info`.
    pub fn upload(ctx: &GpuContext, info: &TensorInfo, data: &[u8]) -> Result<GpuTensor> {
        Self::upload_with(ctx, info, data, &mut |_| {})
    }

    /// [`Self::upload`], calling `copied` with each run of `data` once it is in device
    /// memory (the caller can let the file map's pages go before the tensor is done: a
    /// large tensor would otherwise be resident twice).
    pub fn upload_with(
        ctx: &GpuContext,
        info: &TensorInfo,
        data: &[u8],
        copied: &mut dyn FnMut(&[u8]),
    ) -> Result<GpuTensor> {
        let n_rows: u64 = info.dims.iter().skip(1).take(3).product();
        let memory = memory_for(ctx, info.ty, n_rows);
        Self::upload_to(ctx, info, data, memory, copied)
    }

    /// [`Self::upload`] into `memory`, wherever the context would hold the tensor
    /// (benchmarks and tests compare the two).
    pub fn upload_in(
        ctx: &GpuContext,
        info: &TensorInfo,
        data: &[u8],
        memory: WeightMemory,
    ) -> Result<GpuTensor> {
        Self::upload_to(ctx, info, data, memory, &mut |_| {})
    }

    fn upload_to(
        ctx: &GpuContext,
        info: &TensorInfo,
        data: &[u8],
        memory: WeightMemory,
        copied: &mut dyn FnMut(&[u8]),
    ) -> Result<GpuTensor> {
        let mut ne = [1u64; 4];
        for (i, d) in info.dims.iter().take(4).enumerate() {
            ne[i] = *d;
        }
        let row_bytes = info.ty.row_bytes(ne[0]).ok_or_else(|| {
            Error::model(format!(
                "tensor {}: row of {} elements is not whole {} blocks",
                info.name, ne[0], info.ty
            ))
        })?;
        let n_rows = ne[1] * ne[2] * ne[3];
        if row_bytes.checked_mul(n_rows) != Some(data.len() as u64) {
            return Err(Error::model(format!(
                "tensor {}: {} bytes of data for {} rows of {} bytes",
                info.name,
                data.len(),
                n_rows,
                row_bytes
            )));
        }
        let gpu_row = super::layout::row_bytes(info.ty, ne[0]).unwrap_or(row_bytes);
        let max = part_capacity(ctx, memory);
        let rows_per_part = (max / gpu_row.max(1)).min(u32::MAX as u64);
        if rows_per_part == 0 {
            return Err(Error::gpu(format!(
                "tensor {}: one row ({} bytes) exceeds the device's binding limit ({} bytes); \
                 use --gpu-layers to run this part on the CPU",
                info.name, gpu_row, max
            )));
        }
        let rows = Rows {
            ty: info.ty,
            file: row_bytes as usize,
            gpu: gpu_row as usize,
        };
        let mut parts = Vec::new();
        let mut row0 = 0u64;
        while row0 < n_rows {
            let n = rows_per_part.min(n_rows - row0);
            let start = (row0 * row_bytes) as usize;
            let end = ((row0 + n) * row_bytes) as usize;
            let memory = ctx.scoped(&format!("uploading {}", info.name), || {
                upload_rows(ctx, &info.name, &[&data[start..end]], rows, memory, copied)
            })??;
            parts.push(Part {
                memory,
                row0: row0 as u32,
                n_rows: n as u32,
            });
            row0 += n;
        }
        Ok(GpuTensor {
            name: info.name.clone(),
            ty: info.ty,
            ne,
            row_bytes: gpu_row,
            memory,
            parts,
        })
    }

    /// One tensor holding the rows of `tensors` (each with its data from the file map)
    /// one after another, in one buffer: products of one input fused into one
    /// ([`crate::model::graph::Proj`]). The tensors must share their type and row
    /// length and fit one storage binding together.
    pub fn upload_fused(
        ctx: &GpuContext,
        name: &str,
        tensors: &[(&TensorInfo, &[u8])],
        copied: &mut dyn FnMut(&[u8]),
    ) -> Result<GpuTensor> {
        let (first, _) = tensors
            .first()
            .ok_or_else(|| Error::model(format!("{name}: nothing to fuse")))?;
        let (ty, n_cols) = (first.ty, first.dims.first().copied().unwrap_or(0));
        let row_bytes = ty.row_bytes(n_cols).ok_or_else(|| {
            Error::model(format!(
                "{name}: rows of {n_cols} elements are not whole {ty} blocks"
            ))
        })?;
        let mut n_rows = 0u64;
        for (info, data) in tensors {
            let rows: u64 = info.dims.iter().skip(1).product();
            if info.ty != ty
                || info.dims.first() != Some(&n_cols)
                || rows.checked_mul(row_bytes) != Some(data.len() as u64)
            {
                return Err(Error::model(format!(
                    "{name}: {} is not {n_cols}-element {ty} rows like {}",
                    info.name, first.name
                )));
            }
            n_rows += rows;
        }
        let gpu_row = super::layout::row_bytes(ty, n_cols).unwrap_or(row_bytes);
        let memory = memory_for(ctx, ty, n_rows);
        if n_rows * gpu_row > part_capacity(ctx, memory) {
            return Err(Error::gpu(format!(
                "{name}: {} bytes exceed one binding",
                n_rows * gpu_row
            )));
        }
        let rows = Rows {
            ty,
            file: row_bytes as usize,
            gpu: gpu_row as usize,
        };
        let srcs: Vec<&[u8]> = tensors.iter().map(|(_, d)| *d).collect();
        let part = ctx.scoped(&format!("uploading {name}"), || {
            upload_rows(ctx, name, &srcs, rows, memory, copied)
        })??;
        Ok(GpuTensor {
            name: name.to_string(),
            ty,
            ne: [n_cols, n_rows, 1, 1],
            row_bytes: gpu_row,
            memory,
            parts: vec![Part {
                memory: part,
                row0: 0,
                n_rows: n_rows as u32,
            }],
        })
    }
}

/// Bytes copied between calls of an upload's `copied`.
const COPY_RUN: usize = 8 << 20;

/// Row sizes of a tensor being uploaded: in the file and in the GPU layout.
#[derive(Clone, Copy)]
struct Rows {
    ty: GgmlType,
    file: usize,
    gpu: usize,
}

/// Where a tensor of `n_rows` rows of type `ty` is held: vectors (norm weights, which
/// the norm kernels read from storage) always in buffers, matrices where the context
/// keeps the type's.
fn memory_for(ctx: &GpuContext, ty: GgmlType, n_rows: u64) -> WeightMemory {
    if n_rows > 1 {
        ctx.matrix_memory(ty)
    } else {
        WeightMemory::Buffer
    }
}

/// Largest part, in bytes, of a tensor held in `memory`.
fn part_capacity(ctx: &GpuContext, memory: WeightMemory) -> u64 {
    match memory {
        WeightMemory::Buffer => ctx.max_binding(),
        // Parts stay within one storage binding too, so both memories split a tensor
        // alike (and the staging copy stays that small).
        WeightMemory::Texture => ctx
            .max_binding()
            .min(TEX_W as u64 * TEXEL_BYTES * ctx.limits.max_texture_dimension_2d as u64),
    }
}

/// The file rows of `srcs`, one after another, in the GPU layout, in a new buffer or
/// texture (padded with zeros to whole vec4s, or whole texture rows, so the weights
/// bind as whole vec4s).
fn upload_rows(
    ctx: &GpuContext,
    label: &str,
    srcs: &[&[u8]],
    rows: Rows,
    memory: WeightMemory,
    copied: &mut dyn FnMut(&[u8]),
) -> Result<PartMemory> {
    let n_rows: usize = srcs.iter().map(|b| b.len() / rows.file.max(1)).sum();
    let bytes = ((n_rows * rows.gpu) as u64).max(16);
    let part = if memory == WeightMemory::Buffer {
        // One row (a norm's weight): bindable as the uniform of common/x_norm.wgsl too.
        let (size, usage) = match n_rows == 1 && bytes <= VECTOR_UNIFORM_BYTES {
            true => (VECTOR_UNIFORM_BYTES, VECTOR_USAGE),
            false => (bytes.next_multiple_of(16), WEIGHT_USAGE),
        };
        PartMemory::Buffer(ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        }))
    } else {
        let texture = weight_texture(ctx, label, scratch_rows(bytes) as u32);
        let view = texture.create_view(&Default::default());
        PartMemory::Texture(texture, view)
    };
    // The part's memory is fresh: the fill below is its first touch.
    ctx.advise_huge_pages();
    let target = match &part {
        PartMemory::Buffer(b) => Target::Buffer(b),
        PartMemory::Texture(t, _) => Target::Texture(t),
    };
    let mut stream = StagedFill::new(ctx, target);
    walk_rows(srcs, rows, copied, &mut |gpu_bytes| stream.write(gpu_bytes))?;
    stream.finish()?;
    Ok(part)
}

/// Rows of [`TEX_W`] texels that hold `bytes` bytes.
fn scratch_rows(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(TEX_W as u64 * TEXEL_BYTES)
}

/// Whether a [`scratch_texture`] of `bytes` bytes fits the device's largest texture.
pub fn scratch_fits(ctx: &GpuContext, bytes: u64) -> bool {
    scratch_rows(bytes) <= ctx.limits.max_texture_dimension_2d as u64
}

/// A texture of [`weight_texture`]'s shape holding at least `bytes` bytes, which kernels
/// read through texel loads after [`copy_to_texture`] fills it from a buffer each step.
pub fn scratch_texture(ctx: &GpuContext, label: &str, bytes: u64) -> Result<wgpu::Texture> {
    let height = scratch_rows(bytes);
    let max = ctx.limits.max_texture_dimension_2d;
    if height > max as u64 {
        return Err(Error::gpu(format!(
            "texture {label} needs {height} rows of {TEX_W} texels, over the device's {max}; \
             lower -c (context) or -b (batch)"
        )));
    }
    ctx.scoped(&format!("allocating {label}"), || {
        weight_texture(ctx, label, height as u32)
    })
}

/// Record a copy of bytes `range` of `src` (whole texels, within both) into the same
/// texels of `dst`, row-major as [`scratch_texture`] lays them out: a partial first
/// row, the whole rows in one copy and the rest of the last row, so that `src` need not
/// hold whole rows.
pub fn copy_to_texture(
    enc: &mut wgpu::CommandEncoder,
    src: &wgpu::Buffer,
    dst: &wgpu::Texture,
    range: std::ops::Range<u64>,
) {
    let row = TEX_W as u64;
    let (mut t, end) = (range.start / TEXEL_BYTES, range.end / TEXEL_BYTES);
    while t < end {
        let (y, x) = (t / row, t % row);
        let (width, height) = match x == 0 && end - t >= row {
            true => (row, (end - t) / row),
            false => ((row - x).min(end - t), 1),
        };
        texel_copy(
            enc,
            (src, t * TEXEL_BYTES, (row * TEXEL_BYTES) as u32),
            dst,
            [x as u32, y as u32],
            [width as u32, height as u32],
        );
        t += width * height;
    }
}

/// One copy from `src` (from `offset`, rows `row_bytes` apart) into the `size` texels of
/// `dst` at `origin`.
fn texel_copy(
    enc: &mut wgpu::CommandEncoder,
    (src, offset, row_bytes): (&wgpu::Buffer, u64, u32),
    dst: &wgpu::Texture,
    [x, y]: [u32; 2],
    [width, height]: [u32; 2],
) {
    enc.copy_buffer_to_texture(
        wgpu::TexelCopyBufferInfo {
            buffer: src,
            layout: wgpu::TexelCopyBufferLayout {
                offset,
                bytes_per_row: Some(row_bytes),
                rows_per_image: None,
            },
        },
        wgpu::TexelCopyTextureInfo {
            texture: dst,
            mip_level: 0,
            origin: wgpu::Origin3d { x, y, z: 0 },
            aspect: wgpu::TextureAspect::All,
        },
        wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
    );
}

/// An rgba32uint texture [`TEX_W`] texels wide and `height` rows high, to be written by
/// copies and read by `textureLoad`: the kernels bind it as a read-only storage texture
/// (no sampler state, no mip levels to address); the bench's probes also read it
/// sampled, to compare the two (`wgllm-bench peak --all`).
pub fn weight_texture(ctx: &GpuContext, label: &str, height: u32) -> wgpu::Texture {
    texels_2d(
        ctx,
        label,
        (TEX_W, height),
        wgpu::TextureUsages::TEXTURE_BINDING,
    )
}

/// A 2D rgba32uint texture of `width` x `height` texels, one level, that kernels read
/// as a storage texture and copies write; `usage` adds to those two.
fn texels_2d(
    ctx: &GpuContext,
    label: &str,
    (width, height): (u32, u32),
    usage: wgpu::TextureUsages,
) -> wgpu::Texture {
    ctx.device.create_texture(&wgpu::TextureDescriptor {
        label: Some(label),
        size: wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba32Uint,
        usage: usage | wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::COPY_DST,
        view_formats: &[],
    })
}

/// Hands the file rows of `srcs` to `put` in the GPU layout, in order: runs of rows as
/// they lie in the file, or one row at a time where the layout reorders a row's fields
/// (through a row-sized scratch). `copied` gets each run of the file once it has been
/// put.
fn walk_rows(
    srcs: &[&[u8]],
    rows: Rows,
    copied: &mut dyn FnMut(&[u8]),
    put: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let run_rows = (COPY_RUN / rows.file.max(1)).max(1);
    let runs = srcs.iter().flat_map(|b| b.chunks(run_rows * rows.file));
    let planar = super::layout::planes(rows.ty).is_some();
    let mut row = vec![0u8; if planar { rows.gpu } else { 0 }];
    for src in runs {
        if !planar {
            put(src)?;
        } else {
            for s in src.chunks(rows.file) {
                super::layout::write_row(rows.ty, s, &mut row);
                put(&row)?;
            }
        }
        copied(src);
    }
    Ok(())
}

/// Usage of a weight buffer: read by kernels, filled by copies from the staging ring,
/// and copied out by tests and tools.
pub const WEIGHT_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// The size of the buffers of one-row tensors (norm weights) of at most this size, which
/// kernels that fold a norm in read as a uniform array of this size (common/x_norm.wgsl).
pub const VECTOR_UNIFORM_BYTES: u64 = 16 << 10;

/// Usage of those buffers: a weight's, and a uniform's.
const VECTOR_USAGE: wgpu::BufferUsages = WEIGHT_USAGE.union(wgpu::BufferUsages::UNIFORM);

/// Whether `b` binds as such a uniform vector (the upload's one-row tensors,
/// [`vector_init`]).
pub fn is_vector_uniform(b: &wgpu::Buffer) -> bool {
    b.size() >= VECTOR_UNIFORM_BYTES && b.usage().contains(wgpu::BufferUsages::UNIFORM)
}

/// Submits any queued writes and waits for everything submitted to finish (weight
/// uploads included).
pub fn flush_uploads(ctx: &GpuContext) -> Result<()> {
    ctx.queue.submit(std::iter::empty());
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::gpu(format!("waiting for the weight upload: {e}")))?;
    Ok(())
}

/// A storage buffer initialised from `data` (activations, small tables).
pub fn storage_init<T: bytemuck::Pod>(ctx: &GpuContext, label: &str, data: &[T]) -> wgpu::Buffer {
    ctx.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytemuck::cast_slice(data),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        })
}

/// `data` in a buffer as the upload holds a one-row tensor of at most
/// [`VECTOR_UNIFORM_BYTES`] (a norm's weight): storage and uniform, zero-padded to that
/// size, so that products folding a norm in bind it (`ops::mul_mat::gpu_normed`).
pub fn vector_init(ctx: &GpuContext, label: &str, data: &[f32]) -> Result<wgpu::Buffer> {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    if bytes.len() as u64 > VECTOR_UNIFORM_BYTES {
        return Err(Error::invalid(format!(
            "{label}: {} values, more than a uniform vector's {}",
            data.len(),
            VECTOR_UNIFORM_BYTES / 4
        )));
    }
    let mut padded = bytes.to_vec();
    padded.resize(VECTOR_UNIFORM_BYTES as usize, 0);
    Ok(ctx
        .device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: &padded,
            usage: VECTOR_USAGE,
        }))
}

/// A zeroed storage buffer of `bytes` bytes (at least 4).
pub fn storage(ctx: &GpuContext, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
    storage_as(ctx, label, bytes, wgpu::BufferUsages::empty())
}

/// A zeroed buffer for activations a product reads: storage, and where the device
/// binds uniforms of [`crate::ops::mul_mat::X_UNIFORM_BYTES`], also a uniform of at
/// least that size, so that a single token's products read it as one
/// (`ops::mul_mat::reads_uniform`).
pub fn activations(ctx: &GpuContext, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
    use crate::ops::mul_mat::{binds_x_view, X_UNIFORM_BYTES};
    if !binds_x_view(ctx) {
        return storage(ctx, label, bytes);
    }
    storage_as(
        ctx,
        label,
        bytes.max(X_UNIFORM_BYTES),
        wgpu::BufferUsages::UNIFORM,
    )
}

/// A zeroed storage buffer of `bytes` bytes (at least 4) with `usage` besides.
fn storage_as(
    ctx: &GpuContext,
    label: &str,
    bytes: u64,
    usage: wgpu::BufferUsages,
) -> Result<wgpu::Buffer> {
    let size = bytes.max(4).next_multiple_of(4);
    if size > ctx.limits.max_buffer_size {
        return Err(Error::gpu(format!(
            "buffer {label} needs {size} bytes, over the device's {} byte limit; \
             lower -c (context) or -b (batch), or use --gpu-layers",
            ctx.limits.max_buffer_size
        )));
    }
    ctx.scoped(&format!("allocating {label}"), || {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST
                | usage,
            mapped_at_creation: false,
        })
    })
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::check_const;

    #[test]
    fn texture_width_matches_the_shaders() {
        for (file, name) in [
            ("common/w_texture.wgsl", "TEX_SHIFT"),
            ("common/scratch_texel.wgsl", "SCRATCH_TEX_SHIFT"),
        ] {
            check_const(file, name, super::TEX_SHIFT.into());
        }
    }
}
