#!/usr/bin/env python3
"""Generate quantization fixtures for tests/quant_fixtures.rs from an independent
implementation: the numpy code of the `gguf` Python package (gguf.quants).

    pip install gguf==0.19.0 numpy
    python3 tools/gen-quant-fixtures.py            # writes tests/fixtures/quant/

Fixture format (all little-endian, no headers; <type> is the lower-case GGML type name,
e.g. q4_0, q6_k, bf16):

  <type>.in.f32  f32 input values. Present only for types gguf can quantize
                 (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
  <type>.bin     raw blocks of <type>, exactly as they would sit in a GGUF tensor.
                 For quantizable types: gguf's quantization of <type>.in.f32.
                 For K-quants (gguf only dequantizes them): random block bytes with
                 finite, moderate f16 super-block scales, plus an all-zero block, a block
                 whose d is 0, and a block whose scale bytes are all 0xff.
  <type>.f32     gguf's dequantization of <type>.bin, one f32 per element.

The element count is len(<type>.f32) / 4; the block count follows from the GGML block
size. Data is deterministic (fixed seed) and includes awkward blocks: zeros, a constant,
all negative, large and tiny magnitudes, a single outlier, and +/- ties for the extreme.
"""

import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "quant")
SEED = 20240611

QUANTIZABLE = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
DEQUANT_ONLY = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]

# Byte offsets of the f16 super-block scales inside each K-quant block (ggml-common.h).
K_SCALE_OFFSETS = {
    T.Q2_K: [80, 82],  # d, dmin after scales[16] and qs[64]
    T.Q3_K: [108],  # d after hmask[32], qs[64], scales[12]
    T.Q4_K: [0, 2],  # d, dmin first
    T.Q5_K: [0, 2],
    T.Q6_K: [208],  # d after ql[128], qh[64], scales[16]
}
# Offsets of the sub-block scale bytes (for the all-0xff block).
K_SUBSCALE_RANGE = {
    T.Q2_K: (0, 16),
    T.Q3_K: (96, 108),
    T.Q4_K: (4, 16),
    T.Q5_K: (4, 16),
    T.Q6_K: (192, 208),
}


def awkward_blocks(rng: np.random.Generator, n_blocks: int, bs: int) -> np.ndarray:
    """n_blocks rows of bs values; the first rows are the awkward cases."""
    x = rng.standard_normal((n_blocks, bs)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-6, 4, size=(n_blocks, 1)).astype(np.float32)
    x[0] = 0.0  # all zero
    x[1] = 0.75  # constant
    x[2] = -np.abs(x[2]) - 0.1  # all negative
    x[3] *= 900.0  # large magnitude (scales stay finite in f16)
    x[4] *= 1e-3  # tiny
    x[5] = rng.standard_normal(bs).astype(np.float32) * 0.01
    x[5][bs // 3] = 7.5  # single outlier
    x[6][0], x[6][bs - 1] = -3.0, 3.0  # tie between +/- extremes: first one wins
    x[6] = np.clip(x[6], -3.0, 3.0)
    return x.astype(np.float32)


def float_specials(rng: np.random.Generator, qtype: T) -> np.ndarray:
    x = rng.standard_normal(256).astype(np.float32) * 10
    specials = [0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 70000.0, -1e6, 1e-8, 3e-6, -6e-5,
                np.inf, -np.inf, 3.4e38, 1.1754944e-38, 1.0 + 2.0 ** -11, 1.0 + 2.0 ** -8]
    x[: len(specials)] = np.array(specials, dtype=np.float32)
    if qtype == T.BF16:
        x[len(specials)] = np.float32("nan")
        # Exact rounding ties for bf16.
        x[len(specials) + 1] = np.array([0x3F808000], dtype=np.uint32).view(np.float32)[0]
        x[len(specials) + 2] = np.array([0x3F818000], dtype=np.uint32).view(np.float32)[0]
    return x


def random_k_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    signed = qtype in (T.Q3_K, T.Q6_K)
    for off in K_SCALE_OFFSETS[qtype]:
        mag = np.exp(rng.uniform(np.log(1e-4), np.log(5e-2), size=n_blocks))
        sign = rng.choice([-1.0, 1.0], size=n_blocks) if signed else 1.0
        d = (mag * sign).astype(np.float16)
        b[:, off : off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    b[0] = 0  # all-zero block
    for off in K_SCALE_OFFSETS[qtype][:1]:
        b[1, off : off + 2] = 0  # d == 0 (dmin, if any, stays)
    lo, hi = K_SUBSCALE_RANGE[qtype]
    b[2, lo:hi] = 0xFF  # largest sub-block scales
    return b


def write(name: str, suffix: str, arr: np.ndarray) -> int:
    path = os.path.join(OUT, f"{name}.{suffix}")
    data = np.ascontiguousarray(arr).tobytes()
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(SEED)
    total = 0
    for qtype in QUANTIZABLE:
        name = qtype.name.lower()
        if qtype in (T.F16, T.BF16):
            x = float_specials(rng, qtype)
        else:
            bs, _ = GGML_QUANT_SIZES[qtype]
            x = awkward_blocks(rng, 16, bs).reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            q = quants.quantize(x, qtype).view(np.uint8)
            y = quants.dequantize(q, qtype).astype(np.float32)
        total += write(name, "in.f32", x.astype("<f4"))
        total += write(name, "bin", q)
        total += write(name, "f32", y.astype("<f4"))
    for qtype in DEQUANT_ONLY:
        name = qtype.name.lower()
        b = random_k_blocks(rng, qtype, 8)
        y = quants.dequantize(b.reshape(-1), qtype).astype(np.float32)
        assert np.all(np.isfinite(y)), name
        total += write(name, "bin", b)
        total += write(name, "f32", y.astype("<f4"))
    print(f"wrote {total} bytes of fixtures to {os.path.normpath(OUT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
