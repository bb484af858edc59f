//! The one shader table. Every WGSL file is included here; a kernel's source is its
//! common helpers followed by its own file. A quantized kernel additionally gets the
//! weight type's `decode32` from `shaders/common/quant/`.

use crate::quant::GgmlType;
use crate::{Error, Result};

macro_rules! wgsl {
    ($path:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $path))
    };
}

const STEP: &str = wgsl!("common/step.wgsl");
const BYTES: &str = wgsl!("common/bytes.wgsl");
const REDUCE: &str = wgsl!("common/reduce.wgsl");

/// Kernels that are the same for every weight type: (name, helpers, body).
const OPS: &[(&str, &[&str], &str)] = &[
    ("rms_norm", &[STEP, REDUCE], wgsl!("ops/rms_norm.wgsl")),
    ("rope", &[STEP], wgsl!("ops/rope.wgsl")),
    ("kv_store", &[STEP], wgsl!("ops/kv_store.wgsl")),
    ("attn_scores", &[STEP], wgsl!("ops/attn_scores.wgsl")),
    ("softmax", &[STEP, REDUCE], wgsl!("ops/softmax.wgsl")),
    ("attn_out", &[STEP], wgsl!("ops/attn_out.wgsl")),
    ("attn_capture", &[STEP], wgsl!("ops/attn_capture.wgsl")),
    ("glu", &[STEP], wgsl!("ops/glu.wgsl")),
    ("add", &[STEP], wgsl!("ops/add.wgsl")),
];

/// Kernels specialised by weight type: (name, body).
const QUANT_OPS: &[(&str, &str)] = &[
    ("mul_mat", wgsl!("ops/mul_mat.wgsl")),
    ("get_rows", wgsl!("ops/get_rows.wgsl")),
];

/// The `decode32` implementation for a weight type, if the GPU supports it.
pub fn decoder(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => wgsl!("common/quant/f32.wgsl"),
        F16 => wgsl!("common/quant/f16.wgsl"),
        BF16 => wgsl!("common/quant/bf16.wgsl"),
        Q4_0 => wgsl!("common/quant/q4_0.wgsl"),
        Q4_1 => wgsl!("common/quant/q4_1.wgsl"),
        Q5_0 => wgsl!("common/quant/q5_0.wgsl"),
        Q5_1 => wgsl!("common/quant/q5_1.wgsl"),
        Q8_0 => wgsl!("common/quant/q8_0.wgsl"),
        Q2_K => wgsl!("common/quant/q2_k.wgsl"),
        Q3_K => wgsl!("common/quant/q3_k.wgsl"),
        Q4_K => wgsl!("common/quant/q4_k.wgsl"),
        Q5_K => wgsl!("common/quant/q5_k.wgsl"),
        Q6_K => wgsl!("common/quant/q6_k.wgsl"),
        Q8_1 | Q8_K => return None,
    })
}

fn join(parts: &[&str]) -> String {
    parts.join("\n")
}

/// Source of a type-independent kernel.
pub fn op_source(name: &str) -> Result<String> {
    let (_, helpers, body) = OPS
        .iter()
        .find(|(n, _, _)| *n == name)
        .ok_or_else(|| Error::gpu(format!("no shader named {name}")))?;
    let mut parts: Vec<&str> = helpers.to_vec();
    parts.push(body);
    Ok(join(&parts))
}

/// Source of a kernel specialised for weight type `ty`.
pub fn quant_source(name: &str, ty: GgmlType) -> Result<String> {
    let (_, body) = QUANT_OPS
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| Error::gpu(format!("no shader named {name}")))?;
    let dec = decoder(ty)
        .ok_or_else(|| Error::Unsupported(format!("{name} for {ty} weights on the GPU")))?;
    Ok(join(&[STEP, BYTES, dec, body]))
}

/// Every shader the engine can build, as (label, source), for offline validation.
pub fn all() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, _, _) in OPS {
        if let Ok(src) = op_source(name) {
            out.push((name.to_string(), src));
        }
    }
    for (name, _) in QUANT_OPS {
        for ty in GgmlType::ALL {
            if let Ok(src) = quant_source(name, ty) {
                out.push((format!("{name}_{ty}"), src));
            }
        }
    }
    out
}
