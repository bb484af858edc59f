//! Activations quantized for the integer dot products, once per op: every weight type
//! pairs with the activation type its kernel multiplies against (ggml's `vec_dot_type`).

use crate::quant::kquant::QK_K;
use crate::quant::GgmlType;
use crate::{Error, Result};
use half::f16;

/// How activations are stored for a weight type's dot product (named after the ggml types).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActType {
    /// Plain f32 (float weights).
    F32,
    /// 34-byte blocks of 32: f16 scale, 32 i8.
    Q8_0,
    /// 36-byte blocks of 32: f16 scale, f16 scale times sum, 32 i8 (weights with a min).
    Q8_1,
    /// 292-byte blocks of 256: f32 scale, 256 i8, 16 i16 sums of 16 (K-quants).
    Q8_K,
}

impl ActType {
    /// The activation type weights of `ty` are multiplied with.
    pub fn for_weight(ty: GgmlType) -> Result<ActType> {
        use GgmlType::*;
        Ok(match ty {
            F32 | F16 | BF16 => ActType::F32,
            Q4_0 | Q5_0 | Q8_0 => ActType::Q8_0,
            Q4_1 | Q5_1 => ActType::Q8_1,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => ActType::Q8_K,
            Q8_1 | Q8_K => {
                return Err(Error::Unsupported(format!(
                    "{ty} is an activation format, not a weight type the CPU multiplies"
                )))
            }
        })
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            ActType::F32 => 1,
            ActType::Q8_0 | ActType::Q8_1 => 32,
            ActType::Q8_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            ActType::F32 => 4,
            ActType::Q8_0 => 34,
            ActType::Q8_1 => 36,
            ActType::Q8_K => 292,
        }
    }

    /// Bytes of a row of `n` values (`n` a whole number of blocks).
    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.block_bytes()
    }
}

/// Quantizes `n_rows` rows of `n` values from `x` ([n, n_rows]) into `out`, which is
/// resized (its capacity kept between calls) to `n_rows * row_bytes(n)`.
pub fn quantize_rows(at: ActType, x: &[f32], n: usize, out: &mut Vec<u8>) -> Result<()> {
    let bs = at.block_size();
    if n == 0 || n % bs != 0 || x.len() % n != 0 {
        return Err(Error::invalid(format!(
            "cannot quantize {} values in rows of {n} to {at:?} blocks of {bs}",
            x.len()
        )));
    }
    let rb = at.row_bytes(n);
    out.clear();
    out.resize(x.len() / n * rb, 0);
    match at {
        ActType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        ActType::Q8_0 | ActType::Q8_1 => {
            for (o, xs) in out
                .chunks_exact_mut(at.block_bytes())
                .zip(x.chunks_exact(32))
            {
                q8_block(xs, o, at == ActType::Q8_1);
            }
        }
        ActType::Q8_K => {
            let mut tmp = Vec::with_capacity(292);
            for (o, xs) in out.chunks_exact_mut(292).zip(x.chunks_exact(QK_K)) {
                tmp.clear();
                crate::quant::quantize(GgmlType::Q8_K, xs, &mut tmp)?;
                o.copy_from_slice(&tmp);
            }
        }
    }
    Ok(())
}

/// One Q8_0 (or Q8_1, with the sum) block of 32 values, as ggml's reference quantizer
/// computes it (scale = absmax / 127, round half away from zero).
fn q8_block(x: &[f32], out: &mut [u8], with_sum: bool) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let off = if with_sum { 4 } else { 2 };
    let mut sum = 0i32;
    for (o, v) in out[off..off + 32].iter_mut().zip(x) {
        let q = (v * id).round() as i8;
        sum += q as i32;
        *o = q as u8;
    }
    out[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    if with_sum {
        out[2..4].copy_from_slice(&f16::from_f32(sum as f32 * d).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_blocks_match_the_reference_quantizer() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        for (at, ty) in [
            (ActType::Q8_0, GgmlType::Q8_0),
            (ActType::Q8_1, GgmlType::Q8_1),
            (ActType::Q8_K, GgmlType::Q8_K),
        ] {
            let mut got = Vec::new();
            quantize_rows(at, &x, 256, &mut got).unwrap();
            let mut want = Vec::new();
            crate::quant::quantize(ty, &x, &mut want).unwrap();
            assert_eq!(got, want, "{at:?}");
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let mut out = Vec::new();
        assert!(quantize_rows(ActType::Q8_0, &[0.0; 48], 48, &mut out).is_err());
        assert!(quantize_rows(ActType::Q8_0, &[0.0; 48], 32, &mut out).is_err());
        assert!(ActType::for_weight(GgmlType::Q8_K).is_err());
    }
}
