//! The one shader table. Every WGSL file is included here; a kernel's source is its
//! common helpers followed by its own file. A quantized kernel additionally gets the
//! weight type's `decode32` from `shaders/common/quant/`.

use super::upload::WeightMemory;
use crate::quant::GgmlType;
use crate::{Error, Result};

macro_rules! wgsl {
    ($path:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $path))
    };
}

const STEP: &str = wgsl!("common/step.wgsl");
const BYTES: &str = wgsl!("common/bytes.wgsl");
/// The weight binding and its accessors, for kernels that read weights from storage.
const W_STORAGE: &str = wgsl!("common/w_storage.wgsl");
/// The same accessors over a texture (weights held as textures: `gpu::upload`).
const W_TEXTURE: &str = wgsl!("common/w_texture.wgsl");
const REDUCE: &str = wgsl!("common/reduce.wgsl");
const ROPE_ANGLE: &str = wgsl!("common/rope_angle.wgsl");
/// The gated activations (`glu`, and `mul_mat_ks1`'s GLU store).
const ACT: &str = wgsl!("common/act.wgsl");
const KV_STORE_V: &str = wgsl!("common/kv_store_v.wgsl");
/// Where a value row's positions lie in the V cache, for what writes and reads it.
const V_LAYOUT: &str = wgsl!("common/v_layout.wgsl");
const ROPE_STORE_IO: &str = wgsl!("common/rope_store_io.wgsl");
const ATTN_V: &str = wgsl!("common/attn_v.wgsl");
const ATTN_MASK: &str = wgsl!("common/attn_mask.wgsl");
const ATTN_SPLIT: &str = wgsl!("common/attn_split.wgsl");
const ATTN_DEC_PARAMS: &str = wgsl!("common/attn_dec_params.wgsl");
/// Where `attn_scores` reads Q and K, and `attn_out` the probabilities and V: their
/// storage buffers, or textures copied from them.
const ATTN_QK_BUFFER: &str = wgsl!("common/attn_qk_buffer.wgsl");
const ATTN_QK_TEXTURE: &str = wgsl!("common/attn_qk_texture.wgsl");
const ATTN_PV_BUFFER: &str = wgsl!("common/attn_pv_buffer.wgsl");
const ATTN_PV_TEXTURE: &str = wgsl!("common/attn_pv_texture.wgsl");
const SCRATCH_TEXEL: &str = wgsl!("common/scratch_texel.wgsl");
/// The parameters and logit order of top-k sampling's three passes.
const TOP_K: &str = wgsl!("common/top_k.wgsl");
/// What every kernel that rotates keys on their way into the KV cache includes (the
/// `rope_store` kernels and the RoPE builds of `mul_mat_ks1`): the rotation's angles,
/// its parameters, the V cache's layout, and a single token's key and value written
/// into the kept cache textures (their region `tex`). WGSL declares in any order, so
/// the files are one part.
const ROPE_APPEND: &str = concat!(
    wgsl!("common/rope_angle.wgsl"),
    wgsl!("common/rope_store_params.wgsl"),
    wgsl!("common/scratch_texel.wgsl"),
    wgsl!("common/v_layout.wgsl"),
    wgsl!("common/kv_tex.wgsl"),
);
/// The same reductions for workgroups of one subgroup (the `_sg` kernels).
const REDUCE_SG: &str = wgsl!("common/reduce_sg.wgsl");
/// `wdot32` from `decode32` (for `DOT32_PRE_GENERIC`) and `wdot64_pre` from
/// `wdot32_pre`, for decoders without their own.
const DOT32_GENERIC: &str = wgsl!("common/quant/dot32_generic.wgsl");
const DOT64_GENERIC: &str = wgsl!("common/quant/dot64_generic.wgsl");
/// `wdot64_pre` from `k_block` and `wdot64_blk`, for the K-quants that have them.
const DOT64_BLOCK: &str = wgsl!("common/quant/dot64_block.wgsl");
/// `x_pre` and `wdot32_pre` (the products' dots with quants read in place,
/// common/bytes.wgsl) from `wdot32`, for decoders without their own.
const DOT32_PRE_GENERIC: &str = wgsl!("common/quant/dot32_pre_generic.wgsl");

/// Tokens per tile of the attention kernels: one for single-token steps, four for
/// batches (a private array's size must be a constant, not an override).
const TT1: &str = "const TT: u32 = 1u;";
const TT8: &str = "const TT: u32 = 8u;";

/// Kernels that are the same for every weight type: (name, helpers, body).
const OPS: &[(&str, &[&str], &str)] = &[
    ("rms_norm", &[STEP, REDUCE], wgsl!("ops/rms_norm.wgsl")),
    (
        "rms_norm_sg",
        &[STEP, REDUCE_SG],
        wgsl!("ops/rms_norm.wgsl"),
    ),
    ("rope", &[STEP, ROPE_ANGLE], wgsl!("ops/rope.wgsl")),
    (
        "kv_store",
        &[STEP, V_LAYOUT, KV_STORE_V],
        wgsl!("ops/kv_store.wgsl"),
    ),
    (
        "rope_store",
        &[STEP, KV_STORE_V, ROPE_STORE_IO, ROPE_APPEND],
        wgsl!("ops/rope_store.wgsl"),
    ),
    (
        "rope_store_norm",
        &[STEP, REDUCE, KV_STORE_V, ROPE_STORE_IO, ROPE_APPEND],
        wgsl!("ops/rope_store_norm.wgsl"),
    ),
    (
        "rope_store_norm_sg",
        &[STEP, REDUCE_SG, KV_STORE_V, ROPE_STORE_IO, ROPE_APPEND],
        wgsl!("ops/rope_store_norm.wgsl"),
    ),
    (
        "attn_scores",
        &[STEP, TT1, ATTN_MASK, ATTN_QK_BUFFER],
        wgsl!("ops/attn_scores.wgsl"),
    ),
    (
        "attn_scores_t8",
        &[STEP, TT8, ATTN_MASK, ATTN_QK_BUFFER],
        wgsl!("ops/attn_scores.wgsl"),
    ),
    (
        "attn_scores_t8_tex",
        &[STEP, TT8, ATTN_MASK, SCRATCH_TEXEL, ATTN_QK_TEXTURE],
        wgsl!("ops/attn_scores.wgsl"),
    ),
    ("softmax", &[STEP, REDUCE], wgsl!("ops/softmax.wgsl")),
    ("softmax_sg", &[STEP, REDUCE_SG], wgsl!("ops/softmax.wgsl")),
    (
        "attn_out",
        &[STEP, TT1, ATTN_MASK, V_LAYOUT, ATTN_V, ATTN_PV_BUFFER],
        wgsl!("ops/attn_out.wgsl"),
    ),
    (
        "attn_out_t8",
        &[STEP, TT8, ATTN_MASK, V_LAYOUT, ATTN_V, ATTN_PV_BUFFER],
        wgsl!("ops/attn_out.wgsl"),
    ),
    (
        "attn_out_t8_tex",
        &[
            STEP,
            TT8,
            ATTN_MASK,
            SCRATCH_TEXEL,
            V_LAYOUT,
            ATTN_PV_TEXTURE,
        ],
        wgsl!("ops/attn_out.wgsl"),
    ),
    (
        "attn_decode",
        &[
            STEP,
            ATTN_DEC_PARAMS,
            V_LAYOUT,
            ATTN_V,
            ATTN_MASK,
            ATTN_SPLIT,
            wgsl!("common/attn_dec_buffer.wgsl"),
        ],
        wgsl!("ops/attn_decode.wgsl"),
    ),
    (
        "attn_decode_tex",
        &[
            STEP,
            ATTN_DEC_PARAMS,
            ATTN_MASK,
            ATTN_SPLIT,
            SCRATCH_TEXEL,
            V_LAYOUT,
            wgsl!("common/attn_dec_texture.wgsl"),
        ],
        wgsl!("ops/attn_decode.wgsl"),
    ),
    (
        "attn_decode_join",
        &[STEP, ATTN_DEC_PARAMS, ATTN_MASK, ATTN_SPLIT],
        wgsl!("ops/attn_decode_join.wgsl"),
    ),
    ("attn_capture", &[STEP], wgsl!("ops/attn_capture.wgsl")),
    ("glu", &[STEP, ACT], wgsl!("ops/glu.wgsl")),
    ("add", &[STEP], wgsl!("ops/add.wgsl")),
    (
        "argmax",
        &[
            STEP,
            wgsl!("common/argmax_buffer.wgsl"),
            wgsl!("common/argmax_tree.wgsl"),
        ],
        wgsl!("ops/argmax.wgsl"),
    ),
    (
        "argmax_sg",
        &[
            STEP,
            SCRATCH_TEXEL,
            wgsl!("common/argmax_texture.wgsl"),
            wgsl!("common/argmax_sg.wgsl"),
        ],
        wgsl!("ops/argmax.wgsl"),
    ),
    ("topk_spans", &[STEP, TOP_K], wgsl!("ops/topk_spans.wgsl")),
    ("topk_floor", &[STEP, TOP_K], wgsl!("ops/topk_floor.wgsl")),
    ("topk_gather", &[STEP, TOP_K], wgsl!("ops/topk_gather.wgsl")),
    ("mul_mat_xcopy", &[STEP], wgsl!("ops/mul_mat_xcopy.wgsl")),
];

const MUL_MAT_ROW: &str = wgsl!("ops/mul_mat_row.wgsl");
const MUL_MAT_PARAMS: &str = wgsl!("common/mul_mat_params.wgsl");
/// `store_out` with the outputs of fused products, and with the one output only (see
/// [`quant_source_as`] with a [`Form`] of one output).
const MUL_MAT_STORE: &str = wgsl!("common/mul_mat_store.wgsl");
const MUL_MAT_STORE1: &str = wgsl!("common/mul_mat_store1.wgsl");
const MUL_MAT_WIN: &str = wgsl!("ops/mul_mat_win.wgsl");
const MUL_MAT_XS: &str = wgsl!("ops/mul_mat_xs.wgsl");
const MUL_MAT_XU: &str = wgsl!("ops/mul_mat_xu.wgsl");
const MUL_MAT_KS: &str = wgsl!("ops/mul_mat_ks.wgsl");
const MUL_MAT_KS1: &str = wgsl!("ops/mul_mat_ks1.wgsl");
const MUL_MAT_KS1I: &str = wgsl!("ops/mul_mat_ks1i.wgsl");
const KS1_LANES: &str = wgsl!("common/ks1_lanes.wgsl");
/// The RoPE and cache append at the end of `mul_mat_ks1nr` (its region `rope`).
const KS1_ROPE: &str = wgsl!("common/ks1_rope.wgsl");
const X_CHUNK: &str = wgsl!("common/x_chunk.wgsl");
const X_NORM: &str = wgsl!("common/x_norm.wgsl");
const X_PLAIN: &str = wgsl!("common/x_plain.wgsl");

/// The builds of `mul_mat_ks1n` and `mul_mat_ks1un` whose single tokens end with RoPE
/// and the cache append: (name, the build each extends with [`ROPE_PARTS`]).
const ROPE_BUILDS: [(&str, &str); 2] = [
    ("mul_mat_ks1nr", "mul_mat_ks1n"),
    ("mul_mat_ks1unr", "mul_mat_ks1un"),
];

/// What a build of [`ROPE_BUILDS`] adds to the one it extends (WGSL declares in any
/// order).
const ROPE_PARTS: [&str; 2] = [ROPE_APPEND, KS1_ROPE];

/// The body parts of the weight-typed kernel `name` ([`QUANT_OPS`] or [`ROPE_BUILDS`]).
fn quant_parts(name: &str) -> Option<Vec<&'static str>> {
    let rope = ROPE_BUILDS.iter().find(|(n, _)| *n == name);
    let base = rope.map_or(name, |(_, b)| *b);
    let (_, parts) = QUANT_OPS.iter().find(|(n, _)| *n == base)?;
    let mut parts = parts.to_vec();
    if rope.is_some() {
        parts.extend(ROPE_PARTS);
    }
    Some(parts)
}

/// Every weight-typed kernel's name.
fn quant_names() -> impl Iterator<Item = &'static str> {
    let rope = ROPE_BUILDS.iter().map(|(n, _)| *n);
    QUANT_OPS.iter().map(|(n, _)| *n).chain(rope)
}

/// Kernels specialised by weight type: (name, body parts, joined in order).
/// `mul_mat_*` are the variants of `mul_mat` (see `ops::mul_mat::Variant`).
const QUANT_OPS: &[(&str, &[&str])] = &[
    (
        "mul_mat",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            wgsl!("ops/mul_mat.wgsl"),
        ],
    ),
    (
        "mul_mat_win",
        &[MUL_MAT_PARAMS, MUL_MAT_STORE, MUL_MAT_WIN, MUL_MAT_XS],
    ),
    (
        "mul_mat_winu",
        &[MUL_MAT_PARAMS, MUL_MAT_STORE, MUL_MAT_WIN, MUL_MAT_XU],
    ),
    (
        "mul_mat_wg",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            MUL_MAT_ROW,
            wgsl!("ops/mul_mat_wg.wgsl"),
        ],
    ),
    (
        "mul_mat_sg",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            MUL_MAT_ROW,
            wgsl!("ops/mul_mat_sg.wgsl"),
        ],
    ),
    (
        "mul_mat_mr",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            MUL_MAT_XS,
            X_CHUNK,
            ACT,
            wgsl!("ops/mul_mat_mr.wgsl"),
        ],
    ),
    (
        "mul_mat_mm",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            MUL_MAT_XS,
            wgsl!("ops/mul_mat_mm.wgsl"),
        ],
    ),
    (
        "mul_mat_ks",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            X_CHUNK,
            MUL_MAT_KS,
            MUL_MAT_XS,
        ],
    ),
    (
        "mul_mat_ksu",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            X_CHUNK,
            MUL_MAT_KS,
            MUL_MAT_XU,
        ],
    ),
    (
        "mul_mat_ks1",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            X_CHUNK,
            X_PLAIN,
            KS1_LANES,
            ACT,
            MUL_MAT_KS1,
            MUL_MAT_XS,
        ],
    ),
    (
        "mul_mat_ks1n",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            X_CHUNK,
            X_NORM,
            KS1_LANES,
            ACT,
            MUL_MAT_KS1,
            MUL_MAT_XS,
        ],
    ),
    (
        "mul_mat_ks1u",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            X_CHUNK,
            X_PLAIN,
            KS1_LANES,
            ACT,
            MUL_MAT_KS1,
            MUL_MAT_XU,
        ],
    ),
    (
        "mul_mat_ks1un",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            X_CHUNK,
            X_NORM,
            KS1_LANES,
            ACT,
            MUL_MAT_KS1,
            MUL_MAT_XU,
        ],
    ),
    (
        "mul_mat_ks1i",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            X_CHUNK,
            X_PLAIN,
            KS1_LANES,
            MUL_MAT_KS1I,
            MUL_MAT_XS,
        ],
    ),
    (
        "mul_mat_ks1in",
        &[
            W_STORAGE,
            MUL_MAT_PARAMS,
            MUL_MAT_STORE,
            X_CHUNK,
            X_NORM,
            KS1_LANES,
            MUL_MAT_KS1I,
            MUL_MAT_XS,
        ],
    ),
    ("get_rows", &[W_STORAGE, wgsl!("ops/get_rows.wgsl")]),
];

/// The `decode32` implementation for a weight type (with the helpers it shares with
/// other types), if the GPU supports it.
pub fn decoder(ty: GgmlType) -> Option<&'static [&'static str]> {
    use GgmlType::*;
    const K4_SCALES: &str = wgsl!("common/quant/k4_scales.wgsl");
    Some(match ty {
        F32 => &[wgsl!("common/quant/f32.wgsl")],
        F16 => &[wgsl!("common/quant/f16.wgsl")],
        BF16 => &[wgsl!("common/quant/bf16.wgsl")],
        Q4_0 => &[wgsl!("common/quant/q4_0.wgsl")],
        Q4_1 => &[wgsl!("common/quant/q4_1.wgsl")],
        Q5_0 => &[wgsl!("common/quant/q5_0.wgsl")],
        Q5_1 => &[wgsl!("common/quant/q5_1.wgsl")],
        Q8_0 => &[wgsl!("common/quant/q8_0.wgsl")],
        Q2_K => &[wgsl!("common/quant/q2_k.wgsl")],
        Q3_K => &[wgsl!("common/quant/q3_k.wgsl")],
        Q4_K => &[K4_SCALES, wgsl!("common/quant/q4_k.wgsl")],
        Q5_K => &[K4_SCALES, wgsl!("common/quant/q5_k.wgsl")],
        Q6_K => &[wgsl!("common/quant/q6_k.wgsl")],
        Q8_1 | Q8_K => return None,
    })
}

/// The `pair_chunk` of a weight type whose chunks `mul_mat_ks1i` dots two rows at a
/// time in integers (common/quant/pairs.wgsl), with the helpers it needs; `None` for
/// the other types.
pub fn pair_decoder(ty: GgmlType) -> Option<&'static [&'static str]> {
    use GgmlType::*;
    const PAIRS: &str = wgsl!("common/quant/pairs.wgsl");
    const SCALE: &str = wgsl!("common/quant/pair_scale.wgsl");
    Some(match ty {
        Q4_0 => &[PAIRS, SCALE, wgsl!("common/quant/q4_0_pairs.wgsl")],
        Q4_1 => &[PAIRS, SCALE, wgsl!("common/quant/q4_1_pairs.wgsl")],
        Q5_0 => &[PAIRS, SCALE, wgsl!("common/quant/q5_0_pairs.wgsl")],
        Q5_1 => &[PAIRS, SCALE, wgsl!("common/quant/q5_1_pairs.wgsl")],
        Q4_K => &[PAIRS, SCALE, wgsl!("common/quant/q4_k_pairs.wgsl")],
        Q5_K => &[PAIRS, SCALE, wgsl!("common/quant/q5_k_pairs.wgsl")],
        Q6_K => &[PAIRS, wgsl!("common/quant/q6_k_pairs.wgsl")],
        _ => return None,
    })
}

/// Whether `ty`'s pair decoder ([`pair_decoder`]) unpacks two neighbouring chunks
/// together (`pair_chunks`, for `mul_mat_ks1i`'s region `chunk_pairs`): the K-quants, whose two
/// chunks share bytes (Q4_K's and Q5_K's low and high nibbles of the same 32, Q6_K's
/// high bits and scales).
pub fn has_chunk_pairs(ty: GgmlType) -> bool {
    pair_decoder(ty).is_some_and(|d| d.iter().any(|part| part.contains("fn pair_chunks(")))
}

/// Whether `ty`'s decoder reads a lane's chunks' small fields once per row
/// (`run_fields` and `wdot32_run`, for `mul_mat_ks1`'s walk `fields`): the planar types
/// (Q4_0, Q4_1, Q5_0, Q5_1 on runs of chunks, Q8_0 on strided ones).
pub fn has_run_fields(ty: GgmlType) -> bool {
    decoder(ty).is_some_and(|d| d.iter().any(|part| part.contains("fn wdot32_run(")))
}

/// Whether `ty`'s decoder reads what a lane's chunk pairs share in a block once per row
/// (`k_block` and `wdot64_blk`, for `mul_mat_ks1`'s walk `kblock`): the K-quants that
/// `mul_mat_ks1` dots in pairs (Q4_K, Q5_K, Q6_K).
pub fn has_k_block(ty: GgmlType) -> bool {
    decoder(ty).is_some_and(|d| d.iter().any(|part| part.contains("fn wdot64_blk(")))
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

/// How a weight-type kernel is specialised beyond its type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Form {
    /// mul_mat stores to its one output only, for devices with too few storage bindings
    /// per stage for fused products' outputs.
    pub one_output: bool,
    /// The weights are read from a texture (`common/w_texture.wgsl`) instead of storage.
    pub texture: bool,
}

impl Form {
    /// The form of a kernel reading weights held in `memory`, storing to its one output
    /// only if `one_output`.
    pub fn new(one_output: bool, memory: WeightMemory) -> Form {
        Form {
            one_output,
            texture: memory == WeightMemory::Texture,
        }
    }

    /// What the form adds to a pipeline's label, so each form is cached apart.
    pub fn suffix(self) -> String {
        let one = if self.one_output { "_1out" } else { "" };
        let tex = if self.texture { "_tex" } else { "" };
        format!("{one}{tex}")
    }
}

/// Source of a kernel specialised for weight type `ty`.
pub fn quant_source(name: &str, ty: GgmlType) -> Result<String> {
    quant_source_as(name, ty, Form::new(false, WeightMemory::Buffer))
}

/// [`quant_source`] in `form`. Kernels that bind their weights themselves (the
/// windowed mul_mat walks) have no texture form.
pub fn quant_source_as(name: &str, ty: GgmlType, form: Form) -> Result<String> {
    let body = quant_parts(name).ok_or_else(|| Error::gpu(format!("no shader named {name}")))?;
    let dec = decoder(ty)
        .ok_or_else(|| Error::Unsupported(format!("{name} for {ty} weights on the GPU")))?;
    if form.texture && !body.contains(&W_STORAGE) {
        return Err(Error::Unsupported(format!(
            "{name} reading its weights from a texture"
        )));
    }
    let mut parts = vec![STEP, BYTES];
    parts.extend_from_slice(dec);
    let has = |f: &str| dec.iter().any(|d| d.contains(f));
    if !has("fn wdot32_pre(") {
        if !has("fn wdot32(") {
            parts.push(DOT32_GENERIC);
        }
        parts.push(DOT32_PRE_GENERIC);
    }
    if has("fn wdot64_blk(") {
        parts.push(DOT64_BLOCK);
    } else if !has("fn wdot64_pre(") {
        parts.push(DOT64_GENERIC);
    }
    if body.contains(&MUL_MAT_KS1I) {
        let pairs = pair_decoder(ty)
            .ok_or_else(|| Error::Unsupported(format!("{name} for {ty} weights")))?;
        parts.extend_from_slice(pairs);
    }
    parts.extend(body.iter().map(|&b| match b {
        MUL_MAT_STORE if form.one_output => MUL_MAT_STORE1,
        W_STORAGE if form.texture => W_TEXTURE,
        b => b,
    }));
    Ok(hoist_directives(&join(&parts)))
}

/// `src` without the lines of `mul_mat_ks1`'s slots `slots` and up (those ending in an
/// `@slot k` mark with k >= `slots`): the slots a kernel's `SLOTS` leaves unused, which
/// lavapipe would otherwise translate and optimise before dropping them (the
/// three-slot builds were 1.2-1.9x quicker to create without them, docs/perf.md).
pub fn keep_slots(src: &str, slots: u32) -> String {
    let unused = |line: &str| {
        let Some((_, mark)) = line.rsplit_once("// @slot ") else {
            return false;
        };
        mark.trim().parse::<u32>().is_ok_and(|k| k >= slots)
    };
    let mut out = String::with_capacity(src.len());
    for line in src.lines().filter(|l| !unused(l)) {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `src` without its regions named `name` (from a line holding `// @begin NAME` to one
/// holding `// @end NAME`) unless `keep`: the parts of a kernel that only some of its
/// builds run (`mul_mat_ks1i`'s tiles of four and of eight), so that lavapipe does not
/// translate and optimise the others' code before dropping it.
pub fn keep_regions(src: &str, name: &str, keep: bool) -> String {
    let (begin, end) = (format!("// @begin {name}"), format!("// @end {name}"));
    let mut out = String::with_capacity(src.len());
    let mut inside = false;
    for line in src.lines() {
        let mark = line.trim();
        if mark == begin {
            inside = true;
        }
        if keep || !inside {
            out.push_str(line);
            out.push('\n');
        }
        if mark == end {
            inside = false;
        }
    }
    out
}

/// Whether `name` is a build of `mul_mat_ks1` whose single tokens end with RoPE and the
/// cache append (its region `rope`, common/ks1_rope.wgsl): with the activations in
/// storage or in a uniform (`ops::mul_mat::Variant::KsU`).
pub fn is_rope_build(name: &str) -> bool {
    ROPE_BUILDS.iter().any(|(n, _)| *n == name)
}

/// WGSL requires `enable ...;` directives before any declaration; a kernel body that
/// needs one (subgroups) states it at its top, and it is moved to the front here.
fn hoist_directives(src: &str) -> String {
    let (dirs, rest): (Vec<&str>, Vec<&str>) = src
        .lines()
        .partition(|l| l.trim_start().starts_with("enable "));
    let mut out = String::with_capacity(src.len() + 1);
    for d in dirs {
        out.push_str(d);
        out.push('\n');
    }
    out.push_str(&rest.join("\n"));
    out
}

/// Every portable shader the engine can build, as (label, source), for offline
/// validation without optional features. Kernels that need subgroups are in
/// [`all_with_subgroups`].
pub fn all() -> Vec<(String, String)> {
    let mut out = Vec::new();
    out.extend(op_shaders(|name| !needs_subgroups(name)));
    out.extend(quant_shaders(|name| !needs_subgroups(name)));
    out
}

/// The shaders that need the SUBGROUP feature, as (label, source).
pub fn all_with_subgroups() -> Vec<(String, String)> {
    let mut out = op_shaders(needs_subgroups);
    out.extend(quant_shaders(needs_subgroups));
    out
}

/// Whether the kernel `name` uses subgroup operations.
pub fn needs_subgroups(name: &str) -> bool {
    let uses = |p: &&str| p.contains("subgroupAdd") || p.contains("subgroupMax");
    OPS.iter()
        .find(|(n, _, _)| *n == name)
        .is_some_and(|(_, helpers, body)| helpers.iter().any(uses) || uses(body))
        || quant_parts(name).is_some_and(|parts| parts.iter().any(uses))
}

fn op_shaders(keep: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    OPS.iter()
        .filter(|(n, _, _)| keep(n))
        .filter_map(|(name, _, _)| Some((name.to_string(), op_source(name).ok()?)))
        .collect()
}

fn quant_shaders(keep: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for name in quant_names().filter(|n| keep(n)) {
        for ty in GgmlType::ALL {
            let texture = Form::new(false, WeightMemory::Texture);
            let forms = [
                (format!("{name}_{ty}"), quant_source(name, ty)),
                (
                    format!("{name}_{ty}_tex"),
                    quant_source_as(name, ty, texture),
                ),
            ];
            for (label, src) in forms {
                let Ok(src) = src else { continue };
                // Only `mul_mat_ks1nr` keeps the RoPE at its end, with and without the
                // kept textures.
                let src = keep_regions(&src, "rope", is_rope_build(name));
                if is_rope_build(name) {
                    out.push((format!("{label}_kvtex"), row_walk(&src, "plain")));
                }
                let src = keep_regions(&src, "tex", false);
                // `chunk_pairs` is kept for the types whose pair decoder unpacks two
                // chunks together (`mul_mat_ks1i` on an even count of slots).
                let chunk_paired =
                    keep_regions(&keep_regions(&src, "chunks", false), "chunk_pairs", true);
                let src = keep_regions(&src, "chunk_pairs", false);
                if name.starts_with("mul_mat_ks1") {
                    out.extend(ks1_builds(name, &label, ty, &src, &chunk_paired));
                }
                out.push((label, row_walk(&src, "plain")));
            }
        }
    }
    out
}

/// The regions of `mul_mat_ks1`'s walks of a row, one kept per build ([`row_walk`]).
const ROW_WALKS: [&str; 4] = ["kblock", "pairs", "fields", "plain"];

/// `src` with one of `mul_mat_ks1`'s walks of a row (its regions `kblock`, `pairs`,
/// `fields` and `plain`, `ops::mul_mat::build::RowDot`) kept and the others left out;
/// the decoders' `kblock` and `fields` regions go with their walks.
pub(crate) fn row_walk(src: &str, keep: &str) -> String {
    ROW_WALKS.iter().fold(src.to_string(), |src, walk| {
        keep_regions(&src, walk, *walk == keep)
    })
}

/// `mul_mat_ks1` (`name`, one of its builds) of `ty` as it is built for each count of
/// slots: each walk of a row on the counts it runs on, the tiles and the single tokens
/// apart (regions `tile` and `token`), rows split or sliced or not, and `mul_mat_ks1i`'s
/// tiles of four and of eight (`chunk_paired` keeps its region `chunk_pairs`).
fn ks1_builds(
    name: &str,
    label: &str,
    ty: GgmlType,
    src: &str,
    chunk_paired: &str,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let plain = row_walk(src, "plain");
    let (pairs, kblock, fields) = (
        row_walk(src, "pairs"),
        row_walk(src, "kblock"),
        row_walk(src, "fields"),
    );
    for slots in 1..=8 {
        // Chunk pairs on even counts of slots, their blocks' parts once per row where a
        // lane's run lies in one block.
        if has_k_block(ty) && slots % 2 == 0 {
            out.push((
                format!("{label}_slots{slots}_pairs"),
                keep_slots(&pairs, slots),
            ));
            if 8 % slots == 0 {
                out.push((
                    format!("{label}_slots{slots}_kblock"),
                    keep_slots(&kblock, slots),
                ));
            }
        }
        if has_run_fields(ty) {
            out.push((
                format!("{label}_slots{slots}_fields"),
                keep_slots(&fields, slots),
            ));
        }
        let kept = keep_slots(&plain, slots);
        if name.starts_with("mul_mat_ks1i") {
            let paired = keep_slots(&row_walk(chunk_paired, "plain"), slots);
            let chunk_pairs = has_chunk_pairs(ty) && slots % 2 == 0;
            for (tile, other) in [("tile4", "tile8"), ("tile8", "tile4")] {
                let one = keep_regions(&kept, other, false);
                out.push((format!("{label}_slots{slots}_{tile}"), one));
                if chunk_pairs {
                    let one = keep_regions(&paired, other, false);
                    out.push((format!("{label}_slots{slots}_{tile}_pairs"), one));
                }
            }
        } else {
            let tile = keep_regions(&kept, "token", false);
            out.push((format!("{label}_slots{slots}_tile"), tile));
            let token = keep_regions(&kept, "tile", false);
            out.push((format!("{label}_slots{slots}_token"), token));
        }
        out.push((format!("{label}_slots{slots}"), kept));
    }
    if has_run_fields(ty) {
        out.push((format!("{label}_fields"), fields));
    }
    // The region `split` (rows over several subgroups) is kept above, and left out as
    // the builds of rows one subgroup holds leave it; so is `sliced` (single tokens of
    // such rows walked in slices).
    out.push((
        format!("{label}_unsplit"),
        keep_regions(&plain, "split", false),
    ));
    out.push((
        format!("{label}_unsliced"),
        keep_regions(&plain, "sliced", false),
    ));
    out
}
