//! Rotary position embedding (`shaders/ops/rope.wgsl`).

use super::{dispatch, groups, op_pipeline, Dispatch, WG};
use crate::gpu::GpuContext;
use crate::Result;

/// ggml's rope modes: pairs (2i, 2i+1) or NeoX pairs (i, i + n_rot/2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    Normal = 0,
    Neox = 2,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub head_dim: u32,
    pub n_heads: u32,
    pub n_rot: u32,
    pub mode: u32,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub n_heads2: u32,
    pub _pad1: u32,
}

#[derive(Clone, Copy, Debug)]
pub struct Rope {
    pub head_dim: u32,
    pub n_heads: u32,
    pub n_rot: u32,
    pub mode: RopeMode,
    pub freq_base: f32,
    pub freq_scale: f32,
}

impl Rope {
    /// The kernel parameters (`rope.wgsl`; also the head of `rope_store.wgsl`'s).
    pub(crate) fn params(&self) -> Params {
        Params {
            head_dim: self.head_dim,
            n_heads: self.n_heads,
            n_rot: self.n_rot,
            mode: self.mode as u32,
            freq_base: self.freq_base,
            freq_scale: self.freq_scale,
            n_heads2: 0,
            _pad1: 0,
        }
    }

    /// In place on x: [head_dim, n_heads, n_tokens].
    pub fn gpu(&self, ctx: &GpuContext, step: &wgpu::Buffer, x: &wgpu::Buffer) -> Result<Dispatch> {
        self.gpu_pair(ctx, step, x, None)
    }

    /// In place on x and, with the same rotation, on `also` = (x2, its heads): a
    /// layer's Q and K in one dispatch.
    pub fn gpu_pair(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        x: &wgpu::Buffer,
        also: Option<(&wgpu::Buffer, u32)>,
    ) -> Result<Dispatch> {
        let pipe = op_pipeline(ctx, "rope")?;
        let (x2, n_heads2) = also.unwrap_or((x, 0));
        let params = Params {
            n_heads2,
            ..self.params()
        };
        let pairs = self.n_rot / 2 * (self.n_heads + n_heads2);
        dispatch(ctx, "rope", pipe, step, &params, &[x, x2], move |s| {
            [groups(pairs, WG), s.n_tokens, 1]
        })
    }

    /// CPU reference for tokens at positions pos0, pos0 + 1, ...
    pub fn reference(&self, x: &mut [f32], pos0: u32) {
        let hd = self.head_dim as usize;
        let half = (self.n_rot / 2) as usize;
        for (row, xr) in x.chunks_mut(hd).enumerate() {
            let t = row / self.n_heads as usize;
            let pos = (pos0 as usize + t) as f32;
            for i in 0..half {
                let inv_freq = self.freq_base.powf(-((2 * i) as f32) / self.n_rot as f32);
                let theta = pos * self.freq_scale * inv_freq;
                let (s, c) = theta.sin_cos();
                let (a, b) = match self.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (xr[a], xr[b]);
                xr[a] = x0 * c - x1 * s;
                xr[b] = x0 * s + x1 * c;
            }
        }
    }
}

#[cfg(test)]
mod mirror_tests {
    use crate::gpu::wgsl_layout::wgsl_mirror;

    #[test]
    fn params_mirror_the_shader() {
        wgsl_mirror!(super::Params, "ops/rope.wgsl", "Params", {
            head_dim, n_heads, n_rot, mode, freq_base, freq_scale, n_heads2
        });
    }
}
