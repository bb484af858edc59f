//! Dot products of one weight row (blocks read in place from the file map) with one
//! activation row quantized by [`super::act`], per weight type and instruction set.
//!
//! [`scalar`] is the portable path and the oracle for the SIMD kernels; [`avx2`] is
//! chosen at run time when the CPU has AVX2, FMA and F16C.

use super::act::ActType;
use crate::quant::GgmlType;
use crate::{Error, Result};

#[cfg(target_arch = "x86_64")]
pub mod avx2;
pub mod scalar;

/// A row dot product: `w` holds whole weight blocks, `a` the activation blocks of the
/// same number of values (see [`ActType::for_weight`]). Extra blocks on either side are
/// ignored, so a kernel never reads out of bounds.
pub type DotFn = fn(w: &[u8], a: &[u8]) -> f32;

/// The instruction sets the kernels are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    /// AVX2 plus AVX-512 VNNI (with VL and BW): the tile kernels use `vpdpbusd` and
    /// 32 vector registers; row dots are the AVX2 ones.
    Avx512Vnni,
}

impl Isa {
    /// The best instruction set this CPU runs.
    pub fn detect() -> Isa {
        [Isa::Avx512Vnni, Isa::Avx2]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Scalar)
    }

    /// Whether this CPU runs `self`.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => avx2_available(),
            Isa::Avx512Vnni => vnni_available(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
fn vnni_available() -> bool {
    avx2_available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn vnni_available() -> bool {
    false
}

/// The dot product for weights of `ty` on `isa`. Types without a kernel for `isa` get
/// the scalar one; asking for an instruction set the CPU lacks is an error.
pub fn kernel(ty: GgmlType, isa: Isa) -> Result<DotFn> {
    ActType::for_weight(ty)?;
    if !isa.available() {
        return Err(Error::Unsupported(format!(
            "{isa:?} kernels on a CPU without the instructions"
        )));
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        if let Some(f) = avx2::kernel(ty) {
            return Ok(f);
        }
    }
    scalar::kernel(ty)
}
