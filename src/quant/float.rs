//! Unquantized element types: F32, F16 and BF16 (a "block" of one value).
//!
//! F16 rounds to nearest even (ggml `GGML_FP32_TO_FP16`); BF16 follows ggml's
//! `ggml_compute_fp32_to_bf16`: round to nearest even, NaN forced to a quiet NaN.

use super::block::{Block, Quantize};
use super::GgmlType;
use half::{bf16, f16};

/// IEEE half to f32 (exact).
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// f32 to IEEE half, round to nearest even; overflow gives infinity.
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// bfloat16 to f32 (exact: the bits are the top half of an f32).
pub fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

/// f32 to bfloat16 the way ggml rounds it: nearest even, NaNs made quiet.
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        // Keep the sign and top payload bits, set the quiet bit.
        return ((u >> 16) | 64) as u16;
    }
    // Largest finite input plus the bias stays below 2^32 (0xff7fffff + 0x8000).
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

impl Block for f32 {
    const TYPE: GgmlType = GgmlType::F32;
    const QK: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = *self;
    }
    fn dot(&self, x: &[f32]) -> f32 {
        self * x[0]
    }
}

impl Quantize for f32 {
    fn quantize(x: &[f32]) -> Self {
        x[0]
    }
}

impl Block for f16 {
    const TYPE: GgmlType = GgmlType::F16;
    const QK: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.to_f32();
    }
    fn dot(&self, x: &[f32]) -> f32 {
        self.to_f32() * x[0]
    }
}

impl Quantize for f16 {
    fn quantize(x: &[f32]) -> Self {
        f16::from_bits(f32_to_f16(x[0]))
    }
}

impl Block for bf16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const QK: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.to_f32();
    }
    fn dot(&self, x: &[f32]) -> f32 {
        self.to_f32() * x[0]
    }
}

impl Quantize for bf16 {
    fn quantize(x: &[f32]) -> Self {
        bf16::from_bits(f32_to_bf16(x[0]))
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::testutil::*;
    use super::*;

    #[test]
    fn f16_known_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds up to infinity
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00); // tie to even
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }

    #[test]
    fn bf16_rounding_and_nan() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        // 1 + 2^-8 is a tie between 0x3f80 and 0x3f81: even wins.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        // A signalling NaN whose payload lives in the low bits stays a NaN.
        let nan = f32_to_bf16(f32::from_bits(0x7f80_0001));
        assert!(bf16_to_f32(nan).is_nan());
        assert_eq!(nan, 0x7fc0);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80); // rounds to infinity
    }

    #[test]
    fn roundtrip_errors_within_ggml_bounds() {
        assert_eq!(roundtrip_error::<f32>(), 0.0);
        assert!(roundtrip_error::<f16>() < MAX_TOTAL_ERROR);
        assert!(roundtrip_error::<bf16>() < MAX_TOTAL_ERROR);
    }

    #[test]
    fn dot_and_lengths() {
        check_dot_matches_dequantize::<f32>();
        check_dot_matches_dequantize::<f16>();
        check_dot_matches_dequantize::<bf16>();
        check_length_errors::<f16>();
        check_length_errors::<bf16>();
    }
}
