//! Quant formats checked against fixtures made by an independent implementation (the
//! numpy code of the `gguf` Python package; see tools/gen-quant-fixtures.py for the
//! format), plus ggml test-quantize-fns.cpp-style error bounds for every type.

use std::path::PathBuf;
use wgllm::quant::{dequantize, dot_f32, quantize, GgmlType};

/// Types with a gguf-made `<name>.bin` / `<name>.f32` pair.
const DEQUANT_FIXTURES: [GgmlType; 12] = [
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

/// Types gguf quantizes, so `<name>.in.f32` exists and `<name>.bin` is its output.
const QUANT_FIXTURES: [GgmlType; 7] = [
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

fn fixture(ty: GgmlType, suffix: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quant")
        .join(format!("{}.{suffix}", ty.name().to_lowercase()));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Distance in units in the last place (0 for equal bits or two NaNs).
fn ulps(a: f32, b: f32) -> u32 {
    if a.is_nan() && b.is_nan() || a.to_bits() == b.to_bits() || a == b {
        return 0;
    }
    // Map the sign-magnitude bits onto a monotonic integer line.
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 {
            i32::MIN.wrapping_sub(i)
        } else {
            i
        }
    };
    key(a).abs_diff(key(b))
}

#[test]
fn dequantize_matches_gguf() {
    for ty in DEQUANT_FIXTURES {
        let bin = fixture(ty, "bin");
        let want = f32s(&fixture(ty, "f32"));
        let mut got = vec![0.0; want.len()];
        dequantize(ty, &bin, &mut got).unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(&a, &b)| ulps(a, b))
            .max()
            .unwrap_or(0);
        assert_eq!(
            worst, 0,
            "{ty}: dequantize differs from gguf by up to {worst} ulp"
        );
    }
}

#[test]
fn quantize_matches_gguf_bytes() {
    for ty in QUANT_FIXTURES {
        let x = f32s(&fixture(ty, "in.f32"));
        let want = fixture(ty, "bin");
        let mut got = Vec::new();
        quantize(ty, &x, &mut got).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(first_diff, None, "{ty}: quantized bytes differ from gguf");
    }
}

#[test]
fn q8_1_quants_match_gguf_q8_0() {
    // Q8_1 is Q8_0 (d, qs) plus the sum field: check the shared part against gguf.
    let x = f32s(&fixture(GgmlType::Q8_0, "in.f32"));
    let q8_0 = fixture(GgmlType::Q8_0, "bin");
    let mut q8_1 = Vec::new();
    quantize(GgmlType::Q8_1, &x, &mut q8_1).unwrap();
    for (a, b) in q8_1.chunks_exact(36).zip(q8_0.chunks_exact(34)) {
        assert_eq!(a[..2], b[..2]);
        assert_eq!(a[4..], b[2..]);
    }
}

#[test]
fn dot_matches_dequantize_then_dot() {
    for ty in DEQUANT_FIXTURES {
        if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
            continue; // the float fixtures hold infinities and NaN on purpose
        }
        let bin = fixture(ty, "bin");
        let w = f32s(&fixture(ty, "f32"));
        let x: Vec<f32> = (0..w.len())
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let want: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let scale: f64 = w
            .iter()
            .zip(&x)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        let got = dot_f32(ty, &bin, &x).unwrap() as f64;
        assert!(
            (got - want).abs() <= 1e-5 * scale,
            "{ty}: dot {got} vs dequantized dot {want} (scale {scale})"
        );
    }
}

/// test-quantize-fns.cpp: `0.1 + 2 cos(i + offset)`, 4096 values.
fn cos_wave(offset: f32) -> Vec<f32> {
    (0..4096)
        .map(|i| (0.1 + 2.0 * ((i as f32) + offset).cos() as f64) as f32)
        .collect()
}

#[test]
fn roundtrip_error_within_ggml_bounds() {
    let x = cos_wave(0.0);
    let y = cos_wave(1.0);
    let exact: f64 = x.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
    for ty in GgmlType::ALL {
        let mut q = Vec::new();
        quantize(ty, &x, &mut q).unwrap();
        assert_eq!(q.len() as u64, ty.row_bytes(x.len() as u64).unwrap());
        let mut back = vec![0.0; x.len()];
        dequantize(ty, &q, &mut back).unwrap();
        // test-quantize-fns.cpp's `array_rmse`: sqrt(sum of squares) / n.
        let sq: f64 = x
            .iter()
            .zip(&back)
            .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
            .sum();
        let err = sq.sqrt() / x.len() as f64;
        let bound = match ty {
            GgmlType::Q2_K => 0.0075,
            GgmlType::Q3_K => 0.0040,
            _ => 0.002,
        };
        // ggml's dot-product check, with f32 activations instead of the vec_dot type.
        let dot_err = (dot_f32(ty, &q, &y).unwrap() as f64 - exact).abs() / x.len() as f64;
        let dot_bound = if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K) {
            0.04
        } else {
            0.02
        };
        println!("{ty:>5}: total error {err:.6} (bound {bound}), dot error {dot_err:.6}");
        assert!(err < bound, "{ty}: total error {err} >= {bound}");
        assert!(
            dot_err < dot_bound,
            "{ty}: dot error {dot_err} >= {dot_bound}"
        );
    }
}
