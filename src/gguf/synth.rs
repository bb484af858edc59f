//! Synthetic models: valid GGUF files with random weights in real model shapes, for
//! benchmarks and load tests where a real checkpoint of that size is not at hand.
//!
//! Weights are not quantized from floats (far too slow at 8B parameters): each block is
//! drawn directly, random quants under small random scales, so the dequantized values
//! have a spread near 0.02 and mean near zero, like trained weights. Norm weights are
//! F32 near 1.0. With that a forward pass keeps finite activations over every layer.
//!
//! The tokenizer is byte-level BPE (`gpt2`, pre-tokenizer `llama-bpe`) over a made-up
//! vocabulary of the requested size: the 256 byte tokens, a few hundred merged letter
//! pairs, filler tokens, and control tokens at the end laid out like Llama 3's.
//!
//! Everything streams through [`GgufStream`]: only one chunk of one tensor is in memory.

use std::path::Path;

use half::f16;

use super::metadata::{Value, ValueType};
use super::reader::DEFAULT_ALIGNMENT;
use super::writer::{GgufStream, TensorDesc};
use crate::quant::kquant::pack_scale_min_k4;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// Dimensions of a llama-architecture model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlamaShape {
    pub n_embd: u64,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub n_ff: u64,
    pub n_vocab: u64,
    pub n_ctx: u64,
}

impl LlamaShape {
    /// Llama 3.2 1B's dimensions (with an untied output matrix).
    pub const LLAMA_1B: LlamaShape = LlamaShape {
        n_embd: 2048,
        n_layer: 16,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 8192,
        n_vocab: 128256,
        n_ctx: 8192,
    };

    /// Llama 3 8B's dimensions.
    pub const LLAMA_8B: LlamaShape = LlamaShape {
        n_embd: 4096,
        n_layer: 32,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 14336,
        n_vocab: 128256,
        n_ctx: 8192,
    };

    /// Small enough for a unit test, yet every dimension is whole K-quant blocks.
    pub const TINY: LlamaShape = LlamaShape {
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        n_vocab: 512,
        n_ctx: 256,
    };

    /// A size class by name: `tiny`, `1b`, `8b`.
    pub fn by_name(name: &str) -> Option<LlamaShape> {
        match name.to_ascii_lowercase().as_str() {
            "tiny" => Some(Self::TINY),
            "1b" => Some(Self::LLAMA_1B),
            "8b" => Some(Self::LLAMA_8B),
            _ => None,
        }
    }

    pub fn head_dim(&self) -> u64 {
        self.n_embd / self.n_head.max(1)
    }

    /// Parameters in the matrices and norms (what a model card counts).
    pub fn n_params(&self) -> u64 {
        plan_dims(self)
            .iter()
            .map(|(_, d, _)| d.iter().product::<u64>())
            .sum()
    }
}

/// The weight type scheme, named as llama.cpp's `llama-quantize` names its file types.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthQuant {
    F32,
    F16,
    /// Matrices Q4_0; `output.weight` Q6_K as llama.cpp does unless `pure`.
    Q4_0,
    /// Every matrix Q8_0.
    Q8_0,
    /// llama.cpp's Q4_K_M mix: Q4_K, with `attn_v` and `ffn_down` Q6_K on the first and
    /// last eighth of the layers and every third one between, `output.weight` Q6_K.
    Q4_K_M,
}

impl SynthQuant {
    pub const ALL: [SynthQuant; 5] = [
        SynthQuant::F32,
        SynthQuant::F16,
        SynthQuant::Q4_0,
        SynthQuant::Q8_0,
        SynthQuant::Q4_K_M,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SynthQuant::F32 => "F32",
            SynthQuant::F16 => "F16",
            SynthQuant::Q4_0 => "Q4_0",
            SynthQuant::Q8_0 => "Q8_0",
            SynthQuant::Q4_K_M => "Q4_K_M",
        }
    }

    /// Case-insensitive; `q4_k_m` and `q4km` both work.
    pub fn by_name(name: &str) -> Option<SynthQuant> {
        let n = name.to_ascii_uppercase().replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|q| q.name() == n || q.name().replace('_', "") == n.replace('_', ""))
    }

    /// llama.cpp's `general.file_type` (`enum llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            SynthQuant::F32 => 0,
            SynthQuant::F16 => 1,
            SynthQuant::Q4_0 => 2,
            SynthQuant::Q8_0 => 7,
            SynthQuant::Q4_K_M => 15,
        }
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub shape: LlamaShape,
    pub quant: SynthQuant,
    /// One type for every matrix (llama-quantize `--pure`): no Q6_K output or layers.
    pub pure: bool,
    pub seed: u64,
}

impl SynthSpec {
    pub fn new(shape: LlamaShape, quant: SynthQuant) -> SynthSpec {
        SynthSpec {
            shape,
            quant,
            pure: false,
            seed: 1,
        }
    }

    /// Checks the shape is one the engines can run and the types can hold.
    pub fn validate(&self) -> Result<()> {
        let s = &self.shape;
        let bad = |m: String| Err(Error::invalid(format!("synthetic model: {m}")));
        if s.n_embd == 0 || s.n_layer == 0 || s.n_head == 0 || s.n_head_kv == 0 || s.n_ff == 0 {
            return bad(format!("every dimension must be at least 1: {s:?}"));
        }
        if s.n_embd % s.n_head != 0 || s.n_head % s.n_head_kv != 0 {
            return bad(format!(
                "n_embd {} over {} heads over {} KV heads does not divide",
                s.n_embd, s.n_head, s.n_head_kv
            ));
        }
        if s.head_dim() % 2 != 0 {
            return bad(format!("head size {} must be even for RoPE", s.head_dim()));
        }
        if s.n_vocab < MIN_VOCAB {
            return bad(format!(
                "vocab {} is below {MIN_VOCAB} (the 256 byte tokens and two control tokens)",
                s.n_vocab
            ));
        }
        if s.n_vocab > u32::MAX as u64 || s.n_ctx > u32::MAX as u64 {
            return bad("vocab and context must fit in 32 bits".into());
        }
        for t in self.tensors() {
            t.n_bytes().map_err(|e| {
                Error::invalid(format!(
                    "synthetic model: {} does not fit {}: {e}",
                    self.quant.name(),
                    t.name
                ))
            })?;
        }
        Ok(())
    }

    /// The tensor table, in llama.cpp's order.
    pub fn tensors(&self) -> Vec<TensorDesc> {
        plan_dims(&self.shape)
            .into_iter()
            .map(|(name, dims, layer)| {
                let ty = self.type_of(&name, layer, dims.len());
                TensorDesc { name, dims, ty }
            })
            .collect()
    }

    fn type_of(&self, name: &str, layer: Option<u64>, n_dims: usize) -> GgmlType {
        if n_dims == 1 {
            return GgmlType::F32;
        }
        let base = match self.quant {
            SynthQuant::F32 => return GgmlType::F32,
            SynthQuant::F16 => return GgmlType::F16,
            SynthQuant::Q8_0 => return GgmlType::Q8_0,
            SynthQuant::Q4_0 => GgmlType::Q4_0,
            SynthQuant::Q4_K_M => GgmlType::Q4_K,
        };
        if self.pure {
            return base;
        }
        if name == "output.weight" {
            return GgmlType::Q6_K;
        }
        let more_bits = |i: u64, n: u64| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        match (self.quant, layer) {
            (SynthQuant::Q4_K_M, Some(il))
                if (name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight"))
                    && more_bits(il, self.shape.n_layer) =>
            {
                GgmlType::Q6_K
            }
            _ => base,
        }
    }

    /// Bytes of tensor data (without header and padding).
    pub fn data_bytes(&self) -> Result<u64> {
        self.tensors().iter().map(TensorDesc::n_bytes).sum()
    }

    /// The metadata: llama hyper-parameters and a synthetic tokenizer.
    pub fn metadata(&self) -> Vec<(String, Value)> {
        let s = &self.shape;
        let u = |v: u64| Value::U32(v as u32);
        let str_v = |v: &str| Value::String(v.to_string());
        let mut kv: Vec<(String, Value)> = vec![
            ("general.architecture".into(), str_v("llama")),
            ("general.type".into(), str_v("model")),
            (
                "general.name".into(),
                str_v(&format!(
                    "synthetic llama {} {}",
                    size_label(s.n_params()),
                    self.quant.name()
                )),
            ),
            (
                "general.file_type".into(),
                Value::U32(self.quant.file_type()),
            ),
            ("general.quantization_version".into(), Value::U32(2)),
            ("llama.vocab_size".into(), u(s.n_vocab)),
            ("llama.context_length".into(), u(s.n_ctx)),
            ("llama.embedding_length".into(), u(s.n_embd)),
            ("llama.block_count".into(), u(s.n_layer)),
            ("llama.feed_forward_length".into(), u(s.n_ff)),
            ("llama.attention.head_count".into(), u(s.n_head)),
            ("llama.attention.head_count_kv".into(), u(s.n_head_kv)),
            (
                "llama.attention.layer_norm_rms_epsilon".into(),
                Value::F32(1e-5),
            ),
            ("llama.rope.freq_base".into(), Value::F32(500_000.0)),
            ("llama.rope.dimension_count".into(), u(s.head_dim())),
        ];
        kv.extend(tokenizer_metadata(s.n_vocab));
        kv
    }

    /// Writes the model to `path`, calling `progress(done, total)` in data bytes after
    /// each chunk. A failed write (a full disk) removes the partial file: a truncated
    /// model left behind would only fail later, far from the cause.
    pub fn write(&self, path: &Path, progress: impl FnMut(u64, u64)) -> Result<()> {
        self.validate()?;
        let tensors = self.tensors();
        let out = GgufStream::create(path, &self.metadata(), &tensors, DEFAULT_ALIGNMENT)?;
        let r = self.write_data(out, &tensors, progress);
        // Only a regular file is ours to remove (not /dev/full or a pipe).
        if r.is_err() && std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            let _ = std::fs::remove_file(path);
        }
        r
    }

    fn write_data<W: std::io::Write>(
        &self,
        mut out: GgufStream<W>,
        tensors: &[TensorDesc],
        mut progress: impl FnMut(u64, u64),
    ) -> Result<()> {
        let total = self.data_bytes()?;
        let mut buf = Vec::new();
        let mut done = 0u64;
        for (i, t) in tensors.iter().enumerate() {
            // Seeded per tensor, so a tensor's values do not depend on the ones before.
            let mut rng = Rng::new(self.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let block = t.ty.type_size() as u64;
            // About 4 MiB per chunk, in whole blocks.
            let per_chunk = ((4u64 << 20) / block).max(1) * block;
            let mut left = t.n_bytes()?;
            while left > 0 {
                let n = left.min(per_chunk) as usize;
                buf.resize(n, 0);
                fill_random(t.ty, t.dims.len() == 1, &mut rng, &mut buf)?;
                out.write_data(&buf)?;
                left -= n as u64;
                done += n as u64;
                progress(done, total);
            }
        }
        out.finish()?;
        Ok(())
    }
}

/// 256 byte tokens and Llama 3's first ten control tokens (BOS, EOS, turn markers).
const MIN_VOCAB: u64 = 266;

/// Target spread of a weight: about what trained llama matrices have.
const SIGMA: f32 = 0.02;

/// Name, dims and layer of each tensor, in the order llama.cpp writes them.
fn plan_dims(s: &LlamaShape) -> Vec<(String, Vec<u64>, Option<u64>)> {
    let (e, ff, v) = (s.n_embd, s.n_ff, s.n_vocab);
    let kvd = s.head_dim() * s.n_head_kv;
    let mut t = vec![
        ("token_embd.weight".to_string(), vec![e, v], None),
        ("output_norm.weight".to_string(), vec![e], None),
        ("output.weight".to_string(), vec![e, v], None),
    ];
    for il in 0..s.n_layer {
        for (n, dims) in [
            ("attn_norm", vec![e]),
            ("attn_q", vec![e, e]),
            ("attn_k", vec![e, kvd]),
            ("attn_v", vec![e, kvd]),
            ("attn_output", vec![e, e]),
            ("ffn_norm", vec![e]),
            ("ffn_gate", vec![e, ff]),
            ("ffn_up", vec![e, ff]),
            ("ffn_down", vec![ff, e]),
        ] {
            t.push((format!("blk.{il}.{n}.weight"), dims, Some(il)));
        }
    }
    t
}

/// "1.2B", "8.0B", "34M".
fn size_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", n.div_ceil(1_000_000))
    }
}

// ---------------------------------------------------------------- tokenizer

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the others
/// (space, controls, some Latin-1) move to U+0100 and up, so every byte is one char.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// Control tokens: Llama 3 has 256 after 128000 regular ones; smaller vocabs get fewer,
/// but always the ten that hold BOS, EOS and the chat template's markers.
fn n_control(n_vocab: u64) -> u64 {
    (n_vocab / 500).clamp(10, 256)
}

/// Llama 3's control tokens at the start of the block that have a name of their own.
const LLAMA3_CONTROL: [(u64, &str); 7] = [
    (0, "<|begin_of_text|>"),
    (1, "<|end_of_text|>"),
    (4, "<|finetune_right_pad_id|>"),
    (6, "<|start_header_id|>"),
    (7, "<|end_header_id|>"),
    (8, "<|eom_id|>"),
    (9, "<|eot_id|>"),
];

const LLAMA3_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

fn tokenizer_metadata(n_vocab: u64) -> Vec<(String, Value)> {
    let n_ctl = n_control(n_vocab);
    let n_regular = n_vocab - n_ctl;
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut merges: Vec<String> = Vec::new();
    // Merged tokens: "Ġa" (space + letter) and letter pairs, each one merge.
    let space = byte_char(b' ');
    let letters: Vec<char> = ('a'..='z').collect();
    let pairs = letters.iter().map(|&l| (space, l)).chain(
        letters
            .iter()
            .flat_map(|&a| letters.iter().map(move |&b| (a, b))),
    );
    for (a, b) in pairs {
        if tokens.len() as u64 >= n_regular {
            break;
        }
        tokens.push(format!("{a}{b}"));
        merges.push(format!("{a} {b}"));
    }
    // Fillers up to the regular size; merges never produce them, so they are unused.
    let mut i = 0u64;
    while (tokens.len() as u64) < n_regular {
        tokens.push(format!("<filler_{i}>"));
        i += 1;
    }
    let mut types = vec![Value::I32(1); tokens.len()];
    // Reserved tokens are numbered as in Llama 3: the named ones take no number.
    let mut reserved = 0;
    for k in 0..n_ctl {
        match LLAMA3_CONTROL.iter().find(|(o, _)| *o == k) {
            Some((_, n)) => tokens.push(n.to_string()),
            None => {
                tokens.push(format!("<|reserved_special_token_{reserved}|>"));
                reserved += 1;
            }
        }
        types.push(Value::I32(3));
    }
    let strings = |v: Vec<String>| {
        Value::Array(
            ValueType::String,
            v.into_iter().map(Value::String).collect(),
        )
    };
    let id = |k: u64| Value::U32((n_regular + k) as u32);
    vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".into(),
            Value::String("llama-bpe".into()),
        ),
        ("tokenizer.ggml.tokens".into(), strings(tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(ValueType::I32, types),
        ),
        ("tokenizer.ggml.merges".into(), strings(merges)),
        ("tokenizer.ggml.bos_token_id".into(), id(0)),
        ("tokenizer.ggml.eos_token_id".into(), id(1)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(true)),
        ("tokenizer.ggml.eot_token_id".into(), id(9)),
        (
            "tokenizer.chat_template".into(),
            Value::String(LLAMA3_TEMPLATE.into()),
        ),
    ]
}

// ---------------------------------------------------------------- random blocks

/// wyrand: fast, and good enough for weights nobody trains.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (self.0 as u128) * ((self.0 ^ 0xe703_7ed1_a0b4_28db) as u128);
        ((t >> 64) ^ t) as u64
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [lo, hi] (integers).
    fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next_u64() % u64::from(hi - lo + 1)) as u32
    }
    fn sign(&mut self) -> f32 {
        if self.next_u64() & 1 == 0 {
            1.0
        } else {
            -1.0
        }
    }
    fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&last[..n]);
    }
}

/// Fills `buf` (whole blocks of `ty`) with random valid blocks; `norm` tensors get
/// values near 1.0 instead of near zero.
fn fill_random(ty: GgmlType, norm: bool, rng: &mut Rng, buf: &mut [u8]) -> Result<()> {
    // Uniform in [-a, a] has spread a / sqrt(3).
    let a = SIGMA * 3f32.sqrt();
    let value = |rng: &mut Rng| {
        if norm {
            1.0 + (rng.unit() - 0.5) * 0.1
        } else {
            (rng.unit() * 2.0 - 1.0) * a
        }
    };
    let put_f16 = |dst: &mut [u8], v: f32| dst.copy_from_slice(&f16::from_f32(v).to_le_bytes());
    match ty {
        GgmlType::F32 => {
            for c in buf.chunks_exact_mut(4) {
                c.copy_from_slice(&value(rng).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in buf.chunks_exact_mut(2) {
                put_f16(c, value(rng));
            }
        }
        GgmlType::Q4_0 => {
            // value = d * (q - 8), q uniform 0..=15: spread about 4.6 d. The mean
            // -0.5 d cancels over blocks through d's random sign.
            rng.fill(buf);
            for b in buf.chunks_exact_mut(18) {
                let d = rng.sign() * SIGMA / 4.6 * (0.5 + rng.unit());
                put_f16(&mut b[0..2], d);
            }
        }
        GgmlType::Q8_0 => {
            // value = d * q, q uniform over i8: spread about 74 d.
            rng.fill(buf);
            for b in buf.chunks_exact_mut(34) {
                let d = SIGMA / 74.0 * (0.5 + rng.unit());
                put_f16(&mut b[0..2], d);
            }
        }
        GgmlType::Q4_K => {
            // value = d * sc * q - dmin * m with dmin = d and m = 7.5 sc centres each
            // sub-block: d * sc * (q - 7.5), spread about 4.6 d sc, sc in 4..=8.
            rng.fill(buf);
            for b in buf.chunks_exact_mut(144) {
                let d = SIGMA / (4.6 * 6.0) * (0.5 + rng.unit());
                put_f16(&mut b[0..2], d);
                put_f16(&mut b[2..4], d);
                let sc: [u8; 8] = std::array::from_fn(|_| rng.range(4, 8) as u8);
                let m: [u8; 8] = std::array::from_fn(|j| (sc[j] as f32 * 7.5).round() as u8);
                b[4..16].copy_from_slice(&pack_scale_min_k4(&sc, &m));
            }
        }
        GgmlType::Q6_K => {
            // value = d * scale * (q - 32), q uniform 0..=63, |scale| in 4..=16 with a
            // random sign: spread about 18.5 d |scale|.
            rng.fill(buf);
            for b in buf.chunks_exact_mut(210) {
                let d = SIGMA / (18.5 * 10.0) * (0.5 + rng.unit());
                for s in &mut b[192..208] {
                    let mag = rng.range(4, 16) as i8;
                    *s = (if rng.next_u64() & 1 == 0 { mag } else { -mag }) as u8;
                }
                put_f16(&mut b[208..210], d);
            }
        }
        other => {
            return Err(Error::Unsupported(format!(
                "synthetic weights of type {other}"
            )))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_are_distinct_and_match_gpt2() {
        let all: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(all.len(), 256);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'a'), 'a');
    }

    #[test]
    fn q4_k_m_mix_matches_llama_cpp() {
        let s = SynthSpec::new(LlamaShape::LLAMA_8B, SynthQuant::Q4_K_M);
        let t = s.tensors();
        let ty = |n: &str| t.iter().find(|d| d.name == n).map(|d| d.ty);
        assert_eq!(ty("output.weight"), Some(GgmlType::Q6_K));
        assert_eq!(ty("token_embd.weight"), Some(GgmlType::Q4_K));
        assert_eq!(ty("blk.0.attn_v.weight"), Some(GgmlType::Q6_K));
        assert_eq!(ty("blk.4.attn_v.weight"), Some(GgmlType::Q4_K));
        assert_eq!(ty("blk.6.ffn_down.weight"), Some(GgmlType::Q6_K));
        assert_eq!(ty("blk.31.ffn_down.weight"), Some(GgmlType::Q6_K));
        assert_eq!(ty("blk.5.attn_norm.weight"), Some(GgmlType::F32));
        // 8B parameters (8.03B with the untied output, as Llama 3 8B).
        assert_eq!(s.shape.n_params() / 10_000_000, 803);
    }

    #[test]
    fn vocab_has_the_requested_size() {
        for n in [MIN_VOCAB, 512, 128256] {
            let kv = tokenizer_metadata(n);
            let Some((_, Value::Array(_, toks))) =
                kv.iter().find(|(k, _)| k == "tokenizer.ggml.tokens")
            else {
                panic!("no tokens");
            };
            assert_eq!(toks.len() as u64, n);
        }
    }
}
