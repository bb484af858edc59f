//! The parameters every kernel reads (Rust's side of `common/mul_mat_params.wgsl`): the
//! product's shape, the windowed walk's windows, the fused outputs' segments, and the
//! uniform copy of the activations.

use super::*;

/// How `mul_mat_win` walks a row of type `ty`: windows of whole blocks, at most
/// `WIN_MAX` bytes so that the window, its misalignment (< 16 bytes) and one straddling
/// word fit the kernel's 256-byte private array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// 32-element chunks per window.
    pub chunks: u32,
    /// Bytes of W per window.
    pub bytes: u32,
    /// vec4 loads per window.
    pub nv: u32,
}

const WIN_ARRAY_BYTES: u64 = 256;

const WIN_MAX: u64 = WIN_ARRAY_BYTES - 15 - 4;

impl Window {
    /// The window fields of the variants that do not walk windows.
    pub(super) const NONE: Window = Window {
        chunks: 0,
        bytes: 0,
        nv: 0,
    };

    pub fn of(ty: GgmlType) -> Result<Window> {
        // A unit is one chunk, or one block when blocks are larger (K types: 256).
        let unit = (ty.block_size() as u64).max(32);
        let unit_bytes = ty
            .row_bytes(unit)
            .ok_or_else(|| Error::Unsupported(format!("mul_mat_win for {ty}")))?;
        if unit_bytes > WIN_MAX {
            return Err(Error::Unsupported(format!(
                "mul_mat_win: {ty} blocks of {unit_bytes} bytes exceed the window"
            )));
        }
        let units = WIN_MAX / unit_bytes;
        let bytes = units * unit_bytes;
        // Rows and windows are whole units, so windows start on 16-byte boundaries when
        // units are multiples of 16 bytes; otherwise allow for up to 15 bytes before.
        let misalign = if unit_bytes % 16 == 0 { 0 } else { 15 };
        Ok(Window {
            chunks: (units * unit / 32) as u32,
            bytes: bytes as u32,
            nv: (misalign + bytes + 4).div_ceil(16) as u32,
        })
    }
}

/// Every variant's uniform, `common/mul_mat_params.wgsl`'s `Params`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct WinParams {
    base: Params,
    win_chunks: u32,
    win_bytes: u32,
    tok0: u32,
    tok_n: u32,
    seg: Segments,
    /// The folded norm's epsilon ([`Norm`]).
    pub(super) norm_eps: f32,
    /// 0, or 1 + the activation of a GLU store ([`Outputs::glu`]).
    glu: u32,
    /// Rows per workgroup of `mul_mat_ks1` ([`ks1_rows`]); the other kernels' are
    /// constants.
    pub(super) wg_rows: u32,
    /// Output tokens per workgroup of the `Ks` family ([`ks_tok_win`]).
    pub(super) tok_win: u32,
    /// The chunks of 32 columns `mul_mat_ks1`'s builds dot: the whole row, or a slice
    /// of it ([`WinParams::slice`]).
    chunk0: u32,
    chunk_n: u32,
    _pad: [u32; 3],
}

impl WinParams {
    /// One parameter block for every variant (`common/mul_mat_params.wgsl`): part `part`
    /// of `w` into `out`, over output tokens `tok0 .. tok0 + tok_n`; the window fields are
    /// the windowed walk's.
    pub(super) fn new(
        w: &GpuTensor,
        part: &Part,
        cols: Columns,
        out: &Outputs<'_>,
        win: Window,
        (tok0, tok_n): (u32, u32),
    ) -> WinParams {
        WinParams {
            base: Params {
                n_rows: part.n_rows,
                n_cols: w.n_cols() as u32,
                row_bytes: w.row_bytes as u32,
                row0: part.row0,
                x_stride: (w.n_cols() / 4) as u32,
                y_stride: out.y_stride,
                last_only: (cols == Columns::Last) as u32,
                acc: (out.store == Store::Add) as u32,
            },
            win_chunks: win.chunks,
            win_bytes: win.bytes,
            tok0,
            tok_n,
            seg: out.seg,
            norm_eps: 0.0,
            glu: out.glu,
            wg_rows: KS_ROWS,
            tok_win: KS_TOK_WIN_ALL,
            chunk0: 0,
            chunk_n: (w.n_cols() / 32) as u32,
            _pad: [0; 3],
        }
    }

    /// These parameters for slice `i` of a batch's columns, `chunks` chunks of 32 each
    /// ([`ks1_slices`]; the last slice may be shorter): its columns only, stored as the
    /// product's store for the first slice and added to the output after that.
    pub(super) fn slice(self, i: u32, chunks: u32) -> WinParams {
        let chunk0 = i * chunks;
        WinParams {
            base: Params {
                acc: (self.base.acc != 0 || i > 0) as u32,
                ..self.base
            },
            chunk0,
            chunk_n: (self.base.n_cols / 32 - chunk0).min(chunks),
            ..self
        }
    }
}

/// Where a fused product's rows go (`store_out` in common/mul_mat_params.wgsl): rows
/// `seg1..seg2` to the second output, `seg2..seg_end` to the third.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Segments {
    seg1: u32,
    seg2: u32,
    seg_end: u32,
}

impl Segments {
    /// A plain product: every row to the first output.
    pub(super) const NONE: Segments = Segments {
        seg1: u32::MAX,
        seg2: u32::MAX,
        seg_end: u32::MAX,
    };

    /// Products of `rows[i]` rows each (one to three), one after another.
    pub(super) fn of(rows: &[u32]) -> Result<Segments> {
        let sum = |r: &[u32]| u32::try_from(r.iter().map(|&n| n as u64).sum::<u64>());
        let too_many = || Error::invalid(format!("a fused product of {rows:?} rows"));
        match *rows {
            [_] => Ok(Segments::NONE),
            [a, _] | [a, _, _] => Ok(Segments {
                seg1: a,
                seg2: sum(&rows[..2]).map_err(|_| too_many())?,
                seg_end: sum(rows).map_err(|_| too_many())?,
            }),
            _ => Err(too_many()),
        }
    }
}

/// Parameters of `mul_mat_xcopy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct CopyParams {
    pub(super) x_stride: u32,
    pub(super) tok0: u32,
    pub(super) tok_n: u32,
    pub(super) last_only: u32,
}

/// Bytes of the uniform activation buffer of `WinU` (the WGSL array is 4096 vec4s).
pub const X_UNIFORM_BYTES: u64 = 65536;

/// Output tokens per uniform-buffer load for rows of `n_cols`, 0 if not even one fits.
pub(super) fn tokens_per_xu(ctx: &GpuContext, n_cols: u64) -> u64 {
    let cap = X_UNIFORM_BYTES.min(ctx.limits.max_uniform_buffer_binding_size);
    cap / (n_cols * 4).max(1)
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::wgsl_mirror;

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::WinParams, "common/mul_mat_params.wgsl", "Params", {
            n_rows: base.n_rows,
            n_cols: base.n_cols,
            row_bytes: base.row_bytes,
            row0: base.row0,
            x_stride: base.x_stride,
            y_stride: base.y_stride,
            last_only: base.last_only,
            acc: base.acc,
            win_chunks,
            win_bytes,
            tok0,
            tok_n,
            seg1: seg.seg1,
            seg2: seg.seg2,
            seg_end: seg.seg_end,
            norm_eps,
            glu,
            wg_rows,
            tok_win,
            chunk0,
            chunk_n,
        });
        wgsl_mirror!(super::CopyParams, "ops/mul_mat_xcopy.wgsl", "Params", {
            x_stride, tok0, tok_n, last_only
        });
    }
}
