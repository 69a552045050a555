"""Golden values for mixed precision (crates/rlx/tests/precision.rs).

Regenerate with `scripts/regen-goldens.sh` (numpy and ml_dtypes pinned by
scripts/setup-pyenv.sh), or directly:

    .venv/bin/python crates/rlx/tests/golden/gen_precision.py

Writes precision.json beside this file:

* "casts": f32/bf16/f16 conversions as ml_dtypes performs them (round to
  nearest even, ties, subnormals, values that only one type holds), each
  {"from", "to", "input", "expected"} with exact float values.
* "mlp": an MLP forward, softmax(gelu(x @ w1 + b1) @ w2 + b2), with its inputs
  and the output each policy gives, emulated with ml_dtypes at the points the
  policy rounds:
  - f32: everything in f32 (f64 math rounded to f32 per op);
  - auto_mixed_bf16 / auto_mixed: operands of the two products rounded to
    bf16 / f16, each product summed exactly and rounded once to f32 and then
    to the low type, everything else in f32;
  - always_bf16 / always_f16: every op's result rounded to the low type (the
    inputs too), each op computed from its rounded operands.
"""

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np

OUT = Path(__file__).resolve().parent / "precision.json"
rng = np.random.default_rng(20261125)

BF16 = ml_dtypes.bfloat16
F16 = np.float16
TYPES = {"f32": np.float32, "bf16": BF16, "f16": F16}


def exact(a):
    """Exact values as float64 literals (every f32/bf16/f16 value is one)."""
    return [float(v) for v in np.asarray(a, dtype=np.float64).ravel()]


def cast(v, to):
    return np.asarray(v).astype(TYPES[to])


def casts():
    f32 = np.float32
    bf16_cases = np.array(
        [1.00390625, 1.01171875, 1.0 + 2.0**-9, -3.3, 1e20, 0.1, -0.0, 3.0e38,
         1e-39, 9.2e-41, 1.17549435e-38, 65504.0, 7.0e-6]
        + list(rng.normal(0.0, 50.0, 12)),
        dtype=f32,
    )
    f16_cases = np.array(
        [0.1, 1.0 / 3.0, 2049.0, 2051.0, 65504.0, -0.0, 1e-3, -7.25,
         6.0e-8, 2.0e-7, 3.0e-5, 6.1e-5, 1.0 + 2.0**-11]
        + list(rng.normal(0.0, 50.0, 12)),
        dtype=f32,
    )
    out = []
    out.append(("f32", "bf16", bf16_cases))
    out.append(("f32", "f16", f16_cases))
    out.append(("bf16", "f32", cast(bf16_cases, "bf16")))
    out.append(("f16", "f32", cast(f16_cases, "f16")))
    # Between the two halves: bf16's range and f16's precision differ.
    mixed = np.array([1.0 + 2.0**-8, 300.5, 65280.0, 1e-4, 6.0e-8, -2.75, 0.1, 4096.0 + 8.0],
                     dtype=f32)
    out.append(("bf16", "f16", cast(mixed, "bf16")))
    out.append(("f16", "bf16", cast(mixed, "f16")))
    return [
        {"from": a, "to": b, "input": exact(cast(v, a)), "expected": exact(cast(cast(v, a), b))}
        for a, b, v in out
    ]


def gelu(x):
    """Exact-erf GELU in f64."""
    return np.vectorize(lambda t: 0.5 * t * (1.0 + math.erf(t / math.sqrt(2.0))))(x)


def softmax(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def mlp():
    n, d, h, o = 24, 64, 96, 40
    x = rng.normal(0.0, 1.0, (n, d)).astype(np.float32)
    w1 = (rng.normal(0.0, 1.0, (d, h)) / math.sqrt(d)).astype(np.float32)
    b1 = rng.normal(0.0, 0.1, h).astype(np.float32)
    w2 = (rng.normal(0.0, 1.0, (h, o)) / math.sqrt(h)).astype(np.float32)
    b2 = rng.normal(0.0, 0.1, o).astype(np.float32)
    f64 = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    r32 = lambda v: f64(v).astype(np.float32)  # noqa: E731

    def full():
        y = r32(f64(x) @ f64(w1))
        y = r32(f64(y) + f64(b1))
        y = r32(gelu(f64(y)))
        y = r32(f64(y) @ f64(w2))
        y = r32(f64(y) + f64(b2))
        return r32(softmax(f64(y)))

    def mixed(low):
        lo = lambda v: cast(v, low)  # noqa: E731
        y = lo(r32(f64(lo(x)) @ f64(lo(w1))))
        y = r32(f64(y) + f64(b1))
        y = r32(gelu(f64(y)))
        y = lo(r32(f64(lo(y)) @ f64(lo(w2))))
        y = r32(f64(y) + f64(b2))
        return r32(softmax(f64(y)))

    def always(low):
        # Each op computes in f32 from its rounded operands and rounds its result once.
        lo = lambda v: cast(r32(v), low)  # noqa: E731
        y = lo(f64(lo(x)) @ f64(lo(w1)))
        y = lo(f64(y) + f64(lo(b1)))
        y = lo(gelu(f64(y)))
        y = lo(f64(y) @ f64(lo(w2)))
        y = lo(f64(y) + f64(lo(b2)))
        return r32(f64(lo(softmax(f64(y)))))

    return {
        "x": {"shape": list(x.shape), "data": exact(x)},
        "w1": {"shape": list(w1.shape), "data": exact(w1)},
        "b1": {"shape": list(b1.shape), "data": exact(b1)},
        "w2": {"shape": list(w2.shape), "data": exact(w2)},
        "b2": {"shape": list(b2.shape), "data": exact(b2)},
        "expected": {
            "always_f32": exact(full()),
            "auto_mixed_bf16": exact(mixed("bf16")),
            "auto_mixed": exact(mixed("f16")),
            "always_bf16": exact(always("bf16")),
            "always_f16": exact(always("f16")),
        },
    }


def main():
    doc = {
        "generator": "gen_precision.py",
        "numpy": np.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "casts": casts(),
        "mlp": mlp(),
    }
    OUT.write_text(json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
