//! Tensor element types as GGML numbers them, their block geometry, and CPU
//! reference dequantization / dot products (one file per family).

/// GGML tensor types. The discriminant is the on-disk id (ggml.h `enum ggml_type`).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    BF16 = 30,
}

impl GgmlType {
    pub const ALL: [GgmlType; 15] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::BF16,
    ];

    /// The types model weights may be stored in: every backend (GPU kernels, CPU
    /// kernels) runs all of them. Q8_1 and Q8_K only ever hold activations.
    pub const WEIGHT_TYPES: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// The type for an on-disk id, or `None` for ids this engine does not know.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Self::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => 256,
        }
    }

    /// Bytes per block (ggml-common.h).
    pub fn type_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
        }
    }

    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            BF16 => "BF16",
        }
    }

    /// Bytes used by a row of `n` elements, or `None` if `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if n % bs != 0 {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod block;
pub mod float;
pub mod kquant;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;

pub use block::{Block, Quantize};
pub use float::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

use block::{dequantize_row, dot_row, quantize_row};
use half::{bf16, f16};

/// Calls `$f::<Block type of $ty>($args)`: the one place that maps a type to its block.
/// The match is exhaustive, so a new `GgmlType` variant fails to compile here.
macro_rules! dispatch {
    ($ty:expr, $f:ident ( $($arg:expr),* )) => {
        match $ty {
            GgmlType::F32 => $f::<f32>($($arg),*),
            GgmlType::F16 => $f::<f16>($($arg),*),
            GgmlType::BF16 => $f::<bf16>($($arg),*),
            GgmlType::Q4_0 => $f::<q4_0::BlockQ4_0>($($arg),*),
            GgmlType::Q4_1 => $f::<q4_1::BlockQ4_1>($($arg),*),
            GgmlType::Q5_0 => $f::<q5_0::BlockQ5_0>($($arg),*),
            GgmlType::Q5_1 => $f::<q5_1::BlockQ5_1>($($arg),*),
            GgmlType::Q8_0 => $f::<q8_0::BlockQ8_0>($($arg),*),
            GgmlType::Q8_1 => $f::<q8_1::BlockQ8_1>($($arg),*),
            GgmlType::Q2_K => $f::<q2_k::BlockQ2K>($($arg),*),
            GgmlType::Q3_K => $f::<q3_k::BlockQ3K>($($arg),*),
            GgmlType::Q4_K => $f::<q4_k::BlockQ4K>($($arg),*),
            GgmlType::Q5_K => $f::<q5_k::BlockQ5K>($($arg),*),
            GgmlType::Q6_K => $f::<q6_k::BlockQ6K>($($arg),*),
            GgmlType::Q8_K => $f::<q8_k::BlockQ8K>($($arg),*),
        }
    };
}

/// Dequantizes `bytes` (whole blocks of `ty`) into `out` (`n_blocks * block_size` values).
/// `Err(Invalid)` if the lengths do not match.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> crate::Result<()> {
    dispatch!(ty, dequantize_row(bytes, out))
}

/// Reference dot product of one row of `ty` (`x.len()` elements) with f32 `x`,
/// accumulated in f32 per block in the factored form (scales times integer sums).
pub fn dot_f32(ty: GgmlType, row: &[u8], x: &[f32]) -> crate::Result<f32> {
    dispatch!(ty, dot_row(row, x))
}

/// Quantizes `x` (a whole number of blocks) to `ty`, appending to `out`; bit-compatible
/// with ggml's `quantize_row_*_ref` reference quantizers (no importance matrix).
pub fn quantize(ty: GgmlType, x: &[f32], out: &mut Vec<u8>) -> crate::Result<()> {
    dispatch!(ty, quantize_row(x, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_the_type_table() {
        fn check<B: Block>() {
            assert_eq!(std::mem::size_of::<B>(), B::TYPE.type_size(), "{}", B::TYPE);
            assert_eq!(B::QK, B::TYPE.block_size(), "{}", B::TYPE);
        }
        for ty in GgmlType::ALL {
            // Route through the dispatcher so every variant is covered.
            fn probe<B: Block>() -> crate::Result<()> {
                check::<B>();
                Ok(())
            }
            dispatch!(ty, probe()).unwrap();
        }
    }

    #[test]
    fn dispatch_checks_lengths() {
        let bytes = vec![0u8; 34];
        let mut out = vec![0.0; 32];
        assert!(dequantize(GgmlType::Q8_0, &bytes, &mut out).is_ok());
        assert!(dequantize(GgmlType::Q8_0, &bytes[..33], &mut out).is_err());
        assert!(dequantize(GgmlType::Q4_0, &bytes, &mut out).is_err());
        assert!(dot_f32(GgmlType::Q8_0, &bytes, &out[..31]).is_err());
        let mut q = Vec::new();
        assert!(quantize(GgmlType::Q4_K, &out, &mut q).is_err());
        assert!(quantize(GgmlType::Q4_0, &out, &mut q).is_ok());
        assert_eq!(q.len(), 18);
    }
}
