//! Dot products of one weight row (blocks read in place from the file map) with one
//! activation row quantized by [`super::act`], per weight type and instruction set.
//!
//! [`scalar`] is the portable path and the oracle for the SIMD kernels. The SIMD ones
//! are chosen at run time by [`Isa::detect`]: on x86_64 `avx2` when the CPU has AVX2,
//! FMA and F16C (AVX-512 VNNI adds tile kernels, not row dots); on little-endian aarch64
//! `neon`, on the `sdot` dot-product instructions where the CPU has them and on plain
//! NEON otherwise. Q2_K and Q3_K have scalar row dots only; on x86_64 the tile kernels
//! ([`super::tile`]) cover them.

use super::act::ActType;
use crate::quant::GgmlType;
use crate::{Error, Result};

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
pub mod neon;
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
    /// aarch64 NEON without the dot-product extension (Armv8.0 cores such as the
    /// Cortex-A53/A72): integer dots by widening multiplies.
    Neon,
    /// aarch64 NEON with the dot-product extension (`sdot`, Armv8.2 and later). Kept
    /// apart from [`Isa::Neon`] so that both kernel sets can run, and be tested, on one
    /// CPU that has it.
    NeonDot,
}

impl Isa {
    /// The best instruction set this CPU runs.
    pub fn detect() -> Isa {
        [Isa::Avx512Vnni, Isa::Avx2, Isa::NeonDot, Isa::Neon]
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
            Isa::Neon => neon_available(),
            Isa::NeonDot => neon_available() && dotprod_available(),
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

// Big-endian aarch64 has no NEON kernels: they read the blocks' little-endian fields
// by reinterpreting byte vectors.
#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
fn neon_available() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}

#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
fn dotprod_available() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

#[cfg(not(all(target_arch = "aarch64", target_endian = "little")))]
fn neon_available() -> bool {
    false
}

#[cfg(not(all(target_arch = "aarch64", target_endian = "little")))]
fn dotprod_available() -> bool {
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
    let simd = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => avx2::kernel(ty),
        #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
        Isa::Neon | Isa::NeonDot => neon::kernel(ty, isa == Isa::NeonDot),
        // The rest are scalar, or not available on this architecture (refused above).
        _ => None,
    };
    match simd {
        Some(f) => Ok(f),
        None => scalar::kernel(ty),
    }
}
