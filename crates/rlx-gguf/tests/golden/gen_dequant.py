#!/usr/bin/env python3
"""Golden reference values for RLX's GGUF dequantization.

Writes ``dequant.json`` next to this file. For every supported ggml type the
file holds a few raw blocks and the float32 values the ``gguf`` Python package
(``gguf.quants.dequantize``) decodes them to; ``tests/dequant_golden.rs``
decodes the same bytes with ``rlx_gguf::dequant`` and compares.

Regenerate with (from the repository root):

    scripts/setup-llm-pyenv.sh
    .venv-llm/bin/python crates/rlx-gguf/tests/golden/gen_dequant.py

The output is deterministic (fixed seed, fixed case order).

Each case's ``reference`` names the decoder that produced its values: the
``gguf`` package's ``dequantize`` for every type except Q8_K, which gguf 0.19.0
does not implement; Q8_K values come from a direct numpy decode
(``y = d * qs[i]`` in f32, as ggml's ``dequantize_row_q8_K``).

Block contents (quantized types, ``BLOCKS`` = 6 blocks per type):

* blocks 0..3: random bytes everywhere except the float scale fields
  (f16 ``d`` / ``dmin`` / ``m``, the f32 ``d`` of Q8_K), which hold finite
  random values ``normal * 0.05`` (either sign). Block 3 uses a much smaller
  magnitude (``normal * 1e-4``), which lands in or near the f16 subnormal
  range, as real K-quant super-block scales often do.
* block 4: random quant bytes, all float scale fields exactly +0.0.
* block 5: every byte that is not a float scale field is 0xFF (quants,
  packed sub-block scales, high bits, Q8_K bsums), scales random.

Float types (F32, F16, BF16) are stored with one element per "block"; the case
holds ``FLOAT_ELEMS`` values: random normals of a few magnitudes plus +-0.0,
subnormals, the largest finite values and values near 1. Never Inf or NaN.

File format::

    {"generator": "gen_dequant.py", "gguf_version": "0.19.0",
     "cases": [{"type": "Q4_K", "blocks": 6, "reference": "gguf.quants.dequantize",
                "data_hex": "<raw bytes>",
                "values_bits": [<u32 bit pattern of each f32 output>, ...]},
               ...]}
"""

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

SEED = 20250207
BLOCKS = 6
FLOAT_ELEMS = 64
OUT_PATH = Path(__file__).resolve().parent / "dequant.json"

# type -> (elements per block, bytes per block, [(offset, "f16" | "f32"), ...] float scale fields)
LAYOUTS = {
    "Q4_0": (32, 18, [(0, "f16")]),                  # d, qs[16]
    "Q4_1": (32, 20, [(0, "f16"), (2, "f16")]),      # d, m, qs[16]
    "Q5_0": (32, 22, [(0, "f16")]),                  # d, qh[4], qs[16]
    "Q5_1": (32, 24, [(0, "f16"), (2, "f16")]),      # d, m, qh[4], qs[16]
    "Q8_0": (32, 34, [(0, "f16")]),                  # d, qs[32] i8
    "Q2_K": (256, 84, [(80, "f16"), (82, "f16")]),   # scales[16], qs[64], d, dmin
    "Q3_K": (256, 110, [(108, "f16")]),              # hmask[32], qs[64], scales[12], d
    "Q4_K": (256, 144, [(0, "f16"), (2, "f16")]),    # d, dmin, scales[12], qs[128]
    "Q5_K": (256, 176, [(0, "f16"), (2, "f16")]),    # d, dmin, scales[12], qh[32], qs[128]
    "Q6_K": (256, 210, [(208, "f16")]),              # ql[128], qh[64], scales[16] i8, d
    "Q8_K": (256, 292, [(0, "f32")]),                # d f32, qs[256] i8, bsums[16] i16
}
FLOAT_TYPES = ["F32", "F16", "BF16"]
ORDER = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]


def check_layouts():
    for name, (elems, size, fields) in LAYOUTS.items():
        got = gguf.GGML_QUANT_SIZES[T[name]]
        assert got == (elems, size), f"{name}: expected {(elems, size)}, gguf says {got}"
        for off, kind in fields:
            assert off + (2 if kind == "f16" else 4) <= size
    assert gguf.GGML_QUANT_SIZES[T.F32] == (1, 4)
    assert gguf.GGML_QUANT_SIZES[T.F16] == (1, 2)
    assert gguf.GGML_QUANT_SIZES[T.BF16] == (1, 2)


def scale_bytes(value, kind):
    if kind == "f16":
        v = np.array([value], dtype=np.float16)
    else:
        v = np.array([value], dtype=np.float32)
    assert np.all(np.isfinite(v))
    return v.view(np.uint8)


def quant_blocks(rng, name):
    elems, size, fields = LAYOUTS[name]
    out = []
    for b in range(BLOCKS):
        blk = rng.integers(0, 256, size=size, dtype=np.uint8)
        if b == 5:
            blk[:] = 0xFF
        for off, kind in fields:
            n = 2 if kind == "f16" else 4
            if b == 4:
                value = 0.0
            elif b == 3:
                value = rng.standard_normal() * 1e-4
            else:
                value = rng.standard_normal() * 0.05
            blk[off:off + n] = scale_bytes(value, kind)
        out.append(blk)
    return np.concatenate(out)


def float_values(rng, name):
    if name == "F32":
        dt = np.float32
        tiny = [np.float32(1e-45), np.float32(-3e-39), np.float32(1.1754942e-38)]  # subnormals
        big = [np.finfo(np.float32).max, -np.float32(1.5e38), np.float32(65504.0 * 1e30)]
    elif name == "F16":
        dt = np.float16
        tiny = [np.uint16(0x0001).view(np.float16), np.uint16(0x83FF).view(np.float16),
                np.uint16(0x0200).view(np.float16)]
        big = [np.finfo(np.float16).max, -np.float16(60000.0), np.float16(32768.0)]
    else:
        dt = None  # built from bit patterns below
    fixed = [0.0, -0.0, 1.0, -1.0, 0.5, 1.0009765625, 3.140625]
    if name == "BF16":
        vals = np.concatenate([
            np.array(fixed, dtype=np.float32),
            rng.standard_normal(FLOAT_ELEMS - len(fixed) - 6).astype(np.float32)
            * np.float32(10.0) ** rng.integers(-6, 7, FLOAT_ELEMS - len(fixed) - 6).astype(np.float32),
        ])
        bits = (vals.view(np.uint32) >> 16).astype(np.uint16)  # truncate: exact bf16 patterns
        extra = np.array([0x0001, 0x8040, 0x007F,   # subnormals
                          0x7F7F, 0xFF7F, 0x7F00],  # max finite, -max, 2^127
                         dtype=np.uint16)
        bits = np.concatenate([bits, extra])
        assert bits.size == FLOAT_ELEMS
        f = (bits.astype(np.uint32) << 16).view(np.float32)
        assert np.all(np.isfinite(f))
        return bits.view(np.uint8)
    n_rand = FLOAT_ELEMS - len(fixed) - len(tiny) - len(big)
    mags = np.float64(10.0) ** rng.integers(-4, 4 if dt is np.float16 else 20, n_rand)
    rand = rng.standard_normal(n_rand) * mags
    vals = np.concatenate([np.array(fixed, dtype=dt), np.array(tiny, dtype=dt),
                           np.array(big, dtype=dt), rand.astype(dt)])
    assert vals.size == FLOAT_ELEMS and np.all(np.isfinite(vals))
    return vals.view(np.uint8)


def q8k_dequantize(data):
    """Q8_K decoder for the case gguf lacks: y[i] = d * (float)qs[i], one f32 multiply."""
    blk = data.reshape(-1, 292)
    d = blk[:, 0:4].copy().view(np.float32)            # (n, 1)
    qs = blk[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * qs).astype(np.float32).reshape(-1)


def reference_dequantize(data, qtype):
    """(values, reference) - the gguf package's decoder wherever it has one."""
    try:
        values = dequantize(data.copy(), qtype)
        reference = "gguf.quants.dequantize"
    except NotImplementedError:
        # gguf 0.19.0 implements no Q8_K decoder (Q8_K is an intermediate
        # type for dot products, rarely stored in files). Its layout is trivial,
        # so fall back to a direct numpy decode, mirroring ggml's
        # dequantize_row_q8_K.
        assert qtype == T.Q8_K, qtype.name
        values = q8k_dequantize(data)
        reference = "numpy (gguf has no Q8_K dequantize)"
    return np.asarray(values, dtype=np.float32).reshape(-1), reference


def main():
    check_layouts()
    rng = np.random.default_rng(SEED)
    cases = []
    for name in ORDER:
        qtype = T[name]
        if name in FLOAT_TYPES:
            data = float_values(rng, name)
            blocks = FLOAT_ELEMS
        else:
            data = quant_blocks(rng, name)
            blocks = BLOCKS
        elems, size = gguf.GGML_QUANT_SIZES[qtype]
        assert data.dtype == np.uint8 and data.size == blocks * size
        values, reference = reference_dequantize(data, qtype)
        assert values.size == blocks * elems, (name, values.shape)
        assert np.all(np.isfinite(values)), name
        cases.append({
            "type": name,
            "blocks": blocks,
            "reference": reference,
            "data_hex": data.tobytes().hex(),
            "values_bits": [int(x) for x in values.view(np.uint32)],
        })

    header = {"generator": "gen_dequant.py",
              "gguf_version": importlib.metadata.version("gguf")}
    lines = ["{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in header.items())
             + ', "cases": [']
    for i, c in enumerate(cases):
        sep = "," if i + 1 < len(cases) else ""
        lines.append(json.dumps(c, separators=(", ", ": ")) + sep)
    lines.append("]}")
    text = "\n".join(lines) + "\n"
    json.loads(text)  # well-formed
    OUT_PATH.write_text(text)
    print(f"wrote {OUT_PATH} ({len(cases)} cases, {len(text)} bytes)")


if __name__ == "__main__":
    main()
