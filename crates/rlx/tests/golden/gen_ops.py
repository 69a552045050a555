#!/usr/bin/env python3
"""Golden reference values for RLX op tests.

This script writes ``ops.json`` next to itself: a table of small test cases,
one per (op, shapes, dtype, attrs) combination, each with concrete inputs and
the expected output computed with numpy (float64) or JAX (with x64 enabled).
The Rust test harness in ``crates/rlx/tests`` builds a one-op graph per case,
runs it, and compares the result against ``expected`` with the case's
``rtol`` / ``atol`` (``|got - want| <= atol + rtol * |want|``).

Regenerate with (from the repository root):

    scripts/regen-goldens.sh

which sets up the pinned Python environment in ``.venv`` (numpy, jax[cpu];
ai-edge-litert, whose TFLite interpreter gives the int8 integer ops' values)
and runs this script. The output is deterministic (fixed seed, fixed case
order), so regenerating without changing this file gives the same ops.json.

File format (see also the Rust harness)::

    {"generator": "gen_ops.py", "numpy": "<version>", "jax": "<version>",
     "cases": [{"name": ..., "op": ..., "attrs": {...},
                "inputs": [{"shape": [...], "dtype": "f32", "data": [...],
                            "perm": [...]  # optional
                           }, ...],
                "expected": {"shape": [...], "dtype": ..., "data": [...]},
                "rtol": ..., "atol": ...}, ...]}

* ``data`` is the flat row-major contents of the tensor. Floats are emitted
  with full precision (the exact value of the f32/f16/bf16 number, printed as
  a float64 literal), integers as ints, bools as 0/1.
* An input with ``perm`` is stored as ``shape``/``data``; the harness inserts
  ``transpose(perm)`` before the op, so the op sees a non-contiguous operand
  ``np.transpose(data.reshape(shape), perm)``.
* f16/bf16 semantics: compute in float32 from the (already rounded) inputs,
  round the result once to f16/bf16. We compute in float64, round to float32
  and then to the half type; the tolerances absorb the difference.
* No NaN or Inf ever appears: inputs are chosen so every result is finite.
"""

import collections
import itertools
import json
import math
from pathlib import Path

import flatbuffers
import ml_dtypes
import numpy as np
from ai_edge_litert import schema_py_generated as tfl
from ai_edge_litert.interpreter import Interpreter, OpResolverType

import jax

jax.config.update("jax_enable_x64", True)  # f64 references for dot_general/conv
jax.config.update("jax_platforms", "cpu")
from jax import lax  # noqa: E402  (must come after the config update)

SEED = 20240607
OUT_PATH = Path(__file__).resolve().parent / "ops.json"

rng = np.random.default_rng(SEED)

# ---------------------------------------------------------------------------
# Dtypes, rounding and tolerances
# ---------------------------------------------------------------------------

NP_DTYPE = {
    "f32": np.float32,
    "f64": np.float64,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "i8": np.int8,
    "bool": np.bool_,
    "c64": np.complex64,
}
FLOATS = ("f32", "f64", "f16", "bf16")
INTS = ("i32", "i64", "u8")

# (rtol, atol) per tolerance class and float dtype. Integer and bool results
# are always compared exactly.
TOLERANCES = {
    # simple elementwise arithmetic, compares, data movement
    "elementwise": {"f32": (1e-5, 1e-6), "f64": (1e-10, 1e-12),
                    "f16": (2e-3, 1e-3), "bf16": (1.6e-2, 1e-2)},
    # exp/log/erf/tanh/... where libm implementations differ by a few ulp
    "transcendental": {"f32": (2e-5, 1e-6), "f64": (1e-10, 1e-12),
                       "f16": (2e-3, 1e-3), "bf16": (1.6e-2, 1e-2)},
    # anything that accumulates: matmul, reductions, norms, attention, conv
    "accumulate": {"f32": (1e-4, 1e-5), "f64": (1e-10, 1e-12),
                   "f16": (4e-3, 2e-3), "bf16": (3.2e-2, 2e-2)},
    # casts are fully specified (round to nearest even / truncate): exact
    "exact": {"f32": (0.0, 0.0), "f64": (0.0, 0.0),
              "f16": (0.0, 0.0), "bf16": (0.0, 0.0)},
}


def tolerance(kind, dtype):
    """(rtol, atol) for a result of `dtype` in tolerance class `kind`."""
    if dtype == "c64":  # each part is an f32
        dtype = "f32"
    if dtype not in FLOATS:
        return 0.0, 0.0
    return TOLERANCES[kind][dtype]


def quantize(x, dtype):
    """Convert `x` to `dtype` the way the op semantics do.

    Half types go through float32 first (compute in f32, round once). Float
    to int truncates toward zero (numpy astype); anything to bool is x != 0.
    """
    x = np.asarray(x)
    if dtype == "bool":
        return x != 0
    if dtype in ("f16", "bf16"):
        return x.astype(np.float32).astype(NP_DTYPE[dtype])
    return x.astype(NP_DTYPE[dtype])


def wide(x):
    """Value used for reference computation: float64 for floats/bools,
    int64 for integers (so small-int arithmetic never overflows)."""
    x = np.asarray(x)
    if x.dtype.kind in "iu":
        return x.astype(np.int64)
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    return x.astype(np.float64)


# ---------------------------------------------------------------------------
# Random inputs (all draws come from the single seeded `rng`)
# ---------------------------------------------------------------------------


def normal(shape, scale=1.0, dtype="f32"):
    return quantize(rng.standard_normal(shape) * scale, dtype)


def uniform(shape, lo, hi, dtype="f32"):
    return quantize(rng.uniform(lo, hi, size=shape), dtype)


def integers(shape, lo, hi, dtype="i32"):
    """Integers in [lo, hi) (as `dtype`; may be a float dtype)."""
    return quantize(rng.integers(lo, hi, size=shape), dtype)


def away_from_zero(shape, lo, hi, dtype="f32"):
    """Values with lo <= |x| < hi and random sign (for divisors)."""
    sign = rng.choice([-1.0, 1.0], size=shape)
    return quantize(sign * rng.uniform(lo, hi, size=shape), dtype)


def nonzero_ints(shape, hi, dtype="i32"):
    """Integers in [-hi, -1] U [1, hi] (for integer divisors)."""
    sign = rng.choice([-1, 1], size=shape)
    return quantize(sign * rng.integers(1, hi + 1, size=shape), dtype)


def distinct(shape, dtype="f32"):
    """Floats with no ties anywhere (for top-k indices)."""
    n = int(np.prod(shape))
    vals = (rng.permutation(n) - n / 2) * 0.25 + rng.uniform(-0.1, 0.1, n)
    return quantize(vals.reshape(shape), dtype)


# ---------------------------------------------------------------------------
# Case table
# ---------------------------------------------------------------------------

Arg = collections.namedtuple("Arg", "value dtype perm")


def arg(value, dtype, perm=None):
    """An op operand. `value` is what the op sees; with `perm` the stored
    graph input is the inverse transpose of it, so that the harness's
    transpose(perm) reconstructs `value` as a non-contiguous tensor."""
    value = np.asarray(value)
    assert value.dtype == NP_DTYPE[dtype], (value.dtype, dtype)
    return Arg(value, dtype, None if perm is None else list(perm))


def to_py(obj):
    """Recursively convert numpy scalars/tuples in attrs to JSON natives."""
    if isinstance(obj, dict):
        return {k: to_py(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_py(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj)
    return obj


def tensor_json(value, dtype, perm=None):
    stored = np.asarray(value)
    if perm is not None:
        stored = np.transpose(stored, np.argsort(perm))
    flat = np.ascontiguousarray(stored).reshape(-1)
    if dtype == "c64":
        # Each element as its real then imaginary part (the bytes' order).
        flat = np.ascontiguousarray(flat.astype(np.complex64)).view(np.float32).astype(np.float64)
        assert np.all(np.isfinite(flat)), "non-finite value in a golden"
        data = [float(v) for v in flat]
    elif dtype in FLOATS:
        flat = flat.astype(np.float64)
        assert np.all(np.isfinite(flat)), "non-finite value in a golden"
        data = [float(v) for v in flat]
    else:
        data = [int(v) for v in flat.astype(np.int64)]
    out = {"shape": [int(d) for d in stored.shape], "dtype": dtype, "data": data}
    if perm is not None:
        out["perm"] = [int(p) for p in perm]
    return out


class CaseTable:
    def __init__(self):
        self.cases = []
        self.per_op = collections.Counter()

    def add(self, op, tag, attrs, args, expected, out_dtype, tol_kind):
        """Record one case. `expected` is the reference result (any dtype);
        it is converted to `out_dtype` here."""
        expected = quantize(expected, out_dtype)
        rtol, atol = tolerance(tol_kind, out_dtype)
        index = self.per_op[op]
        self.per_op[op] += 1
        # Name by the first non-bool operand's dtype (`where` leads with a
        # bool condition); the per-op index makes every name unique.
        label = next((a.dtype for a in args if a.dtype != "bool"), args[0].dtype)
        self.cases.append({
            "name": f"{op}_{tag}_{label}_{index}",
            "op": op,
            "attrs": to_py(attrs),
            "inputs": [tensor_json(a.value, a.dtype, a.perm) for a in args],
            "expected": tensor_json(expected, out_dtype),
            "rtol": rtol,
            "atol": atol,
        })


# ---------------------------------------------------------------------------
# Elementwise binary ops
# ---------------------------------------------------------------------------

# (lhs shape, lhs perm, rhs shape, rhs perm, tag). Shapes are the logical
# shapes the op sees (after the optional transpose).
BINARY_LAYOUTS = [
    ([2, 3], None, [2, 3], None, "same"),
    ([7, 13], None, [7, 13], None, "same"),
    ([3, 1], None, [1, 4], None, "bcast"),
    ([], None, [2, 3], None, "scalar_lhs"),
    ([2, 3], None, [], None, "scalar_rhs"),
    ([2, 1, 4], None, [3, 1], None, "bcast3d"),
    ([5], None, [2, 3, 5], None, "bcast_rank"),
    ([1, 1], None, [1, 1], None, "ones"),
    ([3, 4], [1, 0], [3, 4], None, "perm_lhs"),
    ([2, 3, 4], [2, 0, 1], [3, 4], None, "perm_bcast"),
    ([2, 3, 4], [1, 2, 0], [2, 3, 4], [2, 1, 0], "perm_both"),
    ([0, 3], None, [1, 3], None, "empty"),
    ([2, 0], None, [2, 1], None, "empty_bcast"),
]


def binary_operands(op, shape, dtype):
    """(lhs, rhs) generators appropriate for `op` (finite results)."""
    is_int = dtype in INTS
    if op == "div":
        if is_int:
            return integers(shape[0], -50, 51, dtype), nonzero_ints(shape[1], 9, dtype)
        return normal(shape[0], 3.0, dtype), away_from_zero(shape[1], 0.5, 3.0, dtype)
    if op == "pow":
        return uniform(shape[0], 0.5, 3.0, dtype), uniform(shape[1], -2.0, 2.0, dtype)
    if op in ("max", "min"):
        # Half-integers so that ties occur.
        if is_int:
            return integers(shape[0], -5, 6, dtype), integers(shape[1], -5, 6, dtype)
        return (quantize(np.round(rng.standard_normal(shape[0]) * 4) / 2, dtype),
                quantize(np.round(rng.standard_normal(shape[1]) * 4) / 2, dtype))
    if is_int:
        return integers(shape[0], -20, 21, dtype), integers(shape[1], -20, 21, dtype)
    return normal(shape[0], 2.0, dtype), normal(shape[1], 2.0, dtype)


def trunc_div(a, b):
    """Integer division rounding toward zero (C / Rust / jax.lax.div)."""
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def binary_ref(op, a, b):
    a, b = wide(a), wide(b)
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return trunc_div(a, b) if a.dtype.kind == "i" else a / b
    if op == "max":
        return np.maximum(a, b)
    if op == "min":
        return np.minimum(a, b)
    if op == "pow":
        return np.power(a, b)
    raise ValueError(op)


def gen_binary(table):
    ops = ["add", "sub", "mul", "div", "max", "min", "pow"]
    # Extra dtypes run on a few representative layouts.
    extra = [("f64", 2), ("f16", 3), ("bf16", 9)]          # (dtype, layout index)
    int_extra = [("i32", 0), ("i32", 2), ("i32", 3), ("i64", 5)]
    for op in ops:
        plan = [("f32", i) for i in range(len(BINARY_LAYOUTS))] + extra
        if op != "pow":
            plan += int_extra
        for dtype, li in plan:
            ls, lp, rs, rp, tag = BINARY_LAYOUTS[li]
            a, b = binary_operands(op, (ls, rs), dtype)
            kind = "transcendental" if op == "pow" else "elementwise"
            table.add(op, tag, {}, [arg(a, dtype, lp), arg(b, dtype, rp)],
                      binary_ref(op, a, b), dtype, kind)


# ---------------------------------------------------------------------------
# Comparisons and select
# ---------------------------------------------------------------------------

COMPARE_REF = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}


def gen_compare(table):
    layouts = [  # (lhs, lhs perm, rhs, rhs perm, tag, dtype)
        ([3, 4], None, [3, 4], None, "same", "f32"),
        ([3, 1], None, [1, 4], None, "bcast", "f32"),
        ([], None, [2, 3], None, "scalar", "f32"),
        ([4, 3], [1, 0], [4, 3], None, "perm", "f32"),
        ([2, 1, 4], None, [3, 1], None, "bcast3d", "i32"),
        ([2, 5], None, [2, 5], None, "same", "f16"),
    ]
    for op, ref in COMPARE_REF.items():
        for ls, lp, rs, rp, tag, dtype in layouts:
            # Small integers (as floats for float dtypes) so equality happens.
            a = integers(ls, -3, 4, dtype)
            b = integers(rs, -3, 4, dtype)
            table.add(op, tag, {}, [arg(a, dtype, lp), arg(b, dtype, rp)],
                      ref(wide(a), wide(b)), "bool", "exact")


def gen_where(table):
    layouts = [  # (cond, a, b, dtype, perm for cond, tag)
        ([3, 4], [3, 4], [3, 4], "f32", None, "same"),
        ([3, 1], [1, 4], [], "f32", None, "bcast"),
        ([2, 1, 4], [3, 1], [2, 3, 4], "f32", None, "bcast3d"),
        ([4, 3], [4, 3], [4, 3], "f32", [1, 0], "perm"),
        ([2, 3], [2, 3], [2, 3], "i32", None, "same"),
        ([0, 3], [1, 3], [0, 3], "f32", None, "empty"),
        ([2, 5], [2, 5], [1, 5], "bf16", None, "bcast"),
    ]
    for cs, as_, bs, dtype, cperm, tag in layouts:
        cond = rng.random(cs) < 0.5
        if dtype in INTS:
            a, b = integers(as_, -9, 10, dtype), integers(bs, -9, 10, dtype)
        else:
            a, b = normal(as_, 1.0, dtype), normal(bs, 1.0, dtype)
        table.add("where", tag, {},
                  [arg(cond, "bool", cperm), arg(a, dtype), arg(b, dtype)],
                  np.where(cond, wide(a), wide(b)), dtype, "exact")


# ---------------------------------------------------------------------------
# Elementwise unary ops
# ---------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu_exact(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def round_inputs(shape, dtype):
    """Mix of exact halves (ties, incl. -0.5 and 2.5) and arbitrary values."""
    halves = rng.integers(-10, 11, size=shape) / 2.0
    other = rng.uniform(-5, 5, size=shape)
    return quantize(np.where(rng.random(shape) < 0.5, halves, other), dtype)


# op -> (reference fn on float64, input generator(shape, dtype), tolerance class)
UNARY = {
    "gelu": (gelu_exact, lambda s, d: normal(s, 3.0, d), "transcendental"),
    "gelu_approx": (gelu_tanh, lambda s, d: normal(s, 3.0, d), "transcendental"),
    "silu": (lambda x: x * sigmoid(x), lambda s, d: normal(s, 3.0, d), "transcendental"),
    "relu": (lambda x: np.maximum(x, 0), lambda s, d: normal(s, 2.0, d), "elementwise"),
    "sigmoid": (sigmoid, lambda s, d: normal(s, 4.0, d), "transcendental"),
    "tanh": (np.tanh, lambda s, d: normal(s, 2.0, d), "transcendental"),
    "exp": (np.exp, lambda s, d: uniform(s, -5.0, 5.0, d), "transcendental"),
    "log": (np.log, lambda s, d: uniform(s, 0.05, 10.0, d), "transcendental"),
    "sqrt": (np.sqrt, lambda s, d: uniform(s, 0.0, 10.0, d), "transcendental"),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), lambda s, d: uniform(s, 0.05, 10.0, d),
              "transcendental"),
    "neg": (np.negative, lambda s, d: normal(s, 2.0, d), "elementwise"),
    "abs": (np.abs, lambda s, d: normal(s, 2.0, d), "elementwise"),
    "sin": (np.sin, lambda s, d: uniform(s, -6.0, 6.0, d), "transcendental"),
    "cos": (np.cos, lambda s, d: uniform(s, -6.0, 6.0, d), "transcendental"),
    "tan": (np.tan, lambda s, d: uniform(s, -1.2, 1.2, d), "transcendental"),
    "atan": (np.arctan, lambda s, d: normal(s, 4.0, d), "transcendental"),
    "round": (np.round, round_inputs, "elementwise"),  # half to even
    "erf": (lambda x: _erf(x), lambda s, d: normal(s, 1.5, d), "transcendental"),
}

UNARY_LAYOUTS = [  # (shape the op sees, perm, tag, dtype)
    ([4, 5], None, "basic", "f32"),
    ([1, 37], None, "row", "f32"),
    ([3, 2, 4], [2, 0, 1], "perm", "f32"),
    ([], None, "scalar", "f32"),
    ([2, 0, 3], None, "empty", "f32"),
    ([6], None, "basic", "f64"),
    ([3, 8], None, "basic", "f16"),
    ([3, 8], None, "basic", "bf16"),
]


def gen_unary(table):
    for op, (ref, make, kind) in UNARY.items():
        for shape, perm, tag, dtype in UNARY_LAYOUTS:
            x = make(shape, dtype)
            table.add(op, tag, {}, [arg(x, dtype, perm)], ref(wide(x)), dtype, kind)
    # Integer variants of the ops that make sense on ints.
    int_refs = {"neg": np.negative, "abs": np.abs, "relu": lambda x: np.maximum(x, 0)}
    for op, ref in int_refs.items():
        for shape, perm, dtype in [([3, 5], None, "i32"), ([4, 3], [1, 0], "i32"),
                                   ([7], None, "i64")]:
            x = integers(shape, -1000, 1001, dtype)
            table.add(op, "int", {}, [arg(x, dtype, perm)], ref(wide(x)), dtype, "exact")


# ---------------------------------------------------------------------------
# Casts
# ---------------------------------------------------------------------------


def gen_cast(table):
    f32 = lambda v: np.asarray(v, dtype=np.float32)  # noqa: E731
    specials_f16 = [0.1, 1.0 / 3.0, 2049.0, 2051.0, 65504.0, -0.0, 1e-3, -7.25]
    # 1 + 2^-8 and 1 + 3*2^-8 are exact ties for bf16 (round to even).
    specials_bf16 = [1.00390625, 1.01171875, -3.3, 1e20, 0.1, -0.0]
    cases = [  # (tag, from, to, value, perm)
        ("f32_to_f16", "f32", "f16",
         np.concatenate([f32(specials_f16), normal([16], 100.0)]), None),
        ("f32_to_f16_perm", "f32", "f16", normal([3, 4], 10.0), [1, 0]),
        ("f16_to_f32", "f16", "f32", normal([12], 50.0, "f16"), None),
        ("f32_to_bf16", "f32", "bf16",
         np.concatenate([f32(specials_bf16), normal([16], 100.0)]), None),
        ("bf16_to_f32", "bf16", "f32", normal([12], 50.0, "bf16"), None),
        ("f32_to_f64", "f32", "f64", normal([10], 10.0), None),
        ("f64_to_f32", "f64", "f32", normal([10], 10.0, "f64"), None),
        ("f32_to_i32", "f32", "i32",
         np.concatenate([f32([-2.7, -0.5, -0.0, 0.9, 2.5, -3.0]),
                         uniform([12], -100.0, 100.0)]), None),
        ("f32_to_i64", "f32", "i64", uniform([8], -1e6, 1e6), None),
        ("i32_to_f32", "i32", "f32",
         np.concatenate([np.asarray([16777217, -16777219, 2**30 + 1, 2**31 - 1, -2**31],
                                    np.int32), integers([8], -1000, 1000)]), None),
        ("i64_to_f32", "i64", "f32",
         np.asarray([2**40 + 1, -(2**45 + 3), 123456789, -5, 0, 2**52 + 1], np.int64),
         None),
        ("f32_to_bool", "f32", "bool",
         f32([0.0, -0.0, 1e-30, -2.5, 1.0, 0.0, 3.0, -1e-5]), None),
        ("bool_to_f32", "bool", "f32", rng.random([2, 5]) < 0.5, None),
        ("bool_to_i32", "bool", "i32", rng.random([6]) < 0.5, None),
        ("i32_to_bool", "i32", "bool", integers([8], -2, 3), None),
        ("u8_to_f32", "u8", "f32",
         np.concatenate([np.asarray([0, 1, 127, 128, 255], np.uint8),
                         integers([7], 0, 256, "u8")]), None),
        ("u8_to_i32", "u8", "i32", integers([6], 0, 256, "u8"), None),
        ("i32_to_i64", "i32", "i64",
         np.concatenate([np.asarray([-2**31, 2**31 - 1, -1], np.int32),
                         integers([5], -100, 100)]), None),
        ("i32_to_f32_perm", "i32", "f32", integers([2, 3, 2], -50, 50), [2, 1, 0]),
    ]
    for tag, src, dst, value, perm in cases:
        value = np.asarray(value).astype(NP_DTYPE[src])
        table.add("cast", tag, {"to": dst}, [arg(value, src, perm)],
                  quantize(value, dst), dst, "exact")


# ---------------------------------------------------------------------------
# Matmul and dot_general
# ---------------------------------------------------------------------------


def matmul_operand(shape, dtype):
    if dtype in INTS:
        return integers(shape, -4, 5, dtype)
    return normal(shape, 1.0, dtype)


def gen_matmul(table):
    cases = [  # (lhs shape seen, lhs perm, rhs shape seen, rhs perm, tag, dtype)
        ([2, 3], None, [3, 4], None, "small", "f32"),
        ([1, 1], None, [1, 1], None, "1x1", "f32"),
        ([17, 33], None, [33, 19], None, "odd", "f32"),
        ([37, 65], None, [65, 29], None, "large", "f32"),
        ([1, 40], None, [40, 9], None, "row", "f32"),
        ([9, 40], None, [40, 1], None, "col", "f32"),
        ([1, 23], None, [23, 1], None, "dot", "f32"),
        ([3, 0], None, [0, 4], None, "k0", "f32"),
        ([0, 5], None, [5, 3], None, "m0", "f32"),
        ([4, 5], None, [5, 0], None, "n0", "f32"),
        ([2, 3, 4], None, [2, 4, 5], None, "batch", "f32"),
        ([2, 1, 3, 4], None, [3, 4, 5], None, "bcast_batch", "f32"),
        ([4, 3, 5], None, [5, 2], None, "batch_lhs", "f32"),
        ([3, 4], None, [2, 4, 5], None, "batch_rhs", "f32"),
        ([1, 6, 7], None, [3, 7, 2], None, "bcast1", "f32"),
        ([6, 11], [1, 0], [11, 5], None, "lhs_t", "f32"),
        ([6, 11], None, [11, 5], [1, 0], "rhs_t", "f32"),
        ([13, 9], [1, 0], [9, 7], [1, 0], "both_t", "f32"),
        ([2, 3, 4], [0, 2, 1], [2, 4, 5], [0, 2, 1], "batch_t", "f32"),
        ([3, 4, 6], [1, 0, 2], [3, 6, 2], None, "batch_perm", "f32"),
        ([5, 7], None, [7, 3], None, "small", "f64"),
        ([17, 33], None, [33, 19], None, "odd", "f64"),
        ([2, 6, 8], None, [8, 5], None, "batch_lhs", "f64"),
        ([8, 16], None, [16, 12], None, "basic", "f16"),
        ([9, 31], [1, 0], [31, 6], None, "lhs_t", "f16"),
        ([8, 16], None, [16, 12], None, "basic", "bf16"),
        ([2, 5, 24], None, [2, 24, 3], None, "batch", "bf16"),
        ([4, 6], None, [6, 3], None, "basic", "i32"),
        ([2, 3, 5], None, [5, 4], [1, 0], "rhs_t", "i32"),
    ]
    for ls, lp, rs, rp, tag, dtype in cases:
        a, b = matmul_operand(ls, dtype), matmul_operand(rs, dtype)
        table.add("matmul", tag, {}, [arg(a, dtype, lp), arg(b, dtype, rp)],
                  np.matmul(wide(a), wide(b)), dtype, "accumulate")


def gen_dot_general(table):
    cases = [  # (lhs shape, rhs shape, lc, rc, lb, rb, tag, dtype, lhs perm)
        ([3, 4], [4, 5], [1], [0], [], [], "matmul", "f32", None),
        ([4, 3], [4, 5], [0], [0], [], [], "lhs_contract0", "f32", None),
        ([3, 4], [5, 4], [1], [1], [], [], "rhs_contract1", "f32", None),
        ([3, 2, 4], [4, 2, 5], [2], [0], [1], [1], "batch_middle", "f32", None),
        ([4, 3, 2], [2, 5, 4], [0], [2], [2], [0], "batch_last", "f32", None),
        ([2, 3, 4], [3, 4, 5], [1, 2], [0, 1], [], [], "two_contract", "f32", None),
        ([2, 3, 4], [4, 3, 5], [2, 1], [0, 1], [], [], "two_contract_swapped", "f32",
         None),
        ([2, 3, 4, 5], [2, 4, 5, 6], [2, 3], [1, 2], [0], [0], "batch_two_contract",
         "f32", None),
        ([2, 3, 5, 4], [3, 2, 4, 6], [3], [2], [0, 1], [1, 0], "two_batch_swapped",
         "f32", None),
        ([3], [4], [], [], [], [], "outer", "f32", None),
        ([6, 5], [6, 7], [0], [0], [], [], "lhs_contract0_perm", "f32", [1, 0]),
        ([5, 9], [9, 4], [1], [0], [], [], "matmul", "f64", None),
        ([4, 8], [3, 8], [1], [1], [], [], "rhs_contract1", "f16", None),
        ([2, 4, 8], [8, 2, 3], [2], [0], [0], [1], "batch", "bf16", None),
        ([3, 4], [4, 2], [1], [0], [], [], "matmul", "i32", None),
    ]
    for ls, rs, lc, rc, lb, rb, tag, dtype, lperm in cases:
        a, b = matmul_operand(ls, dtype), matmul_operand(rs, dtype)
        out = lax.dot_general(wide(a), wide(b), ((tuple(lc), tuple(rc)), (tuple(lb), tuple(rb))))
        attrs = {"lhs_contract": lc, "rhs_contract": rc, "lhs_batch": lb, "rhs_batch": rb}
        table.add("dot_general", tag, attrs, [arg(a, dtype, lperm), arg(b, dtype)],
                  np.asarray(out), dtype, "accumulate")


# ---------------------------------------------------------------------------
# Reductions, softmax, norms, cumsum, top-k
# ---------------------------------------------------------------------------

REDUCE_REF = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}


def reduce_operand(kind, shape, dtype):
    if dtype in INTS:
        lim = 3 if kind == "prod" else 50
        return integers(shape, -lim, lim + 1, dtype)
    if kind == "prod":  # magnitudes near 1 so products stay tame
        return away_from_zero(shape, 0.7, 1.3, dtype)
    return normal(shape, 2.0, dtype)


def gen_reduce(table):
    layouts = [  # (shape seen, perm, axes, keepdims, tag)
        ([3, 4], None, [1], False, "last"),
        ([3, 4], None, [0], True, "first_keep"),
        ([2, 3, 4], None, [0, 2], False, "multi"),
        ([2, 3, 4], None, [0, 1, 2], False, "all"),
        ([2, 3, 4], None, [1, 2], True, "multi_keep"),
        ([4, 1, 3], None, [1], False, "size1"),
        ([5, 3], [1, 0], [0], False, "perm"),
        ([3, 4, 5], [2, 0, 1], [1, 2], False, "perm_multi"),
        ([1], None, [0], True, "single"),
    ]
    for kind in REDUCE_REF:
        for shape, perm, axes, keep, tag in layouts:
            x = reduce_operand(kind, shape, "f32")
            table.add("reduce", f"{kind}_{tag}", {"kind": kind, "axes": axes, "keepdims": keep},
                      [arg(x, "f32", perm)],
                      REDUCE_REF[kind](wide(x), axis=tuple(axes), keepdims=keep),
                      "f32", "accumulate")
    # Reductions over an empty dimension: sum -> 0, prod -> 1. Plus a
    # reduction whose output is itself empty.
    empty = [
        ("sum", [2, 0, 3], [1], False), ("prod", [2, 0, 3], [1], False),
        ("sum", [0, 4], [0], True), ("sum", [0, 3], [1], False),
        ("sum", [2, 0], [0, 1], False),
    ]
    for kind, shape, axes, keep in empty:
        x = reduce_operand(kind, shape, "f32")
        table.add("reduce", f"{kind}_empty", {"kind": kind, "axes": axes, "keepdims": keep},
                  [arg(x, "f32")],
                  REDUCE_REF[kind](wide(x), axis=tuple(axes), keepdims=keep),
                  "f32", "accumulate")
    others = [  # (kind, dtype, shape, axes, keepdims)
        ("sum", "f64", [4, 6], [1], False), ("mean", "f64", [2, 3, 4], [0, 2], True),
        ("max", "f64", [5, 3], [0], False),
        ("sum", "f16", [4, 16], [1], False), ("mean", "f16", [3, 5, 4], [0, 1, 2], False),
        ("max", "f16", [6, 5], [0], True),
        ("sum", "bf16", [4, 16], [1], False), ("mean", "bf16", [8, 3], [0], False),
        ("min", "bf16", [3, 7], [1], False),
        ("sum", "i32", [3, 5], [1], False), ("sum", "i32", [2, 3, 4], [0, 1, 2], False),
        ("max", "i32", [4, 5], [0], True), ("min", "i32", [2, 3, 4], [0, 2], False),
        ("prod", "i32", [3, 4], [1], False),
    ]
    for kind, dtype, shape, axes, keep in others:
        x = reduce_operand(kind, shape, dtype)
        table.add("reduce", kind, {"kind": kind, "axes": axes, "keepdims": keep},
                  [arg(x, dtype)],
                  REDUCE_REF[kind](wide(x), axis=tuple(axes), keepdims=keep),
                  dtype, "accumulate")


def softmax_ref(x, axis):
    z = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return z / np.sum(z, axis=axis, keepdims=True)


def gen_softmax(table):
    cases = [  # (shape seen, perm, axis, tag, dtype, input scale)
        ([3, 5], None, 1, "last", "f32", 2.0),
        ([3, 5], None, 0, "first", "f32", 2.0),
        ([2, 3, 4], None, 1, "middle", "f32", 2.0),
        ([4, 6], None, 1, "large", "f32", 50.0),
        ([2, 3, 7], None, 2, "large", "f32", 50.0),
        ([4, 5], [1, 0], 1, "perm", "f32", 2.0),
        ([2, 3, 4], [2, 0, 1], 2, "perm3d", "f32", 3.0),
        ([1, 9], None, 1, "row", "f32", 1.0),
        ([5, 1], None, 1, "singleton", "f32", 1.0),
        ([3, 8], None, 1, "last", "f16", 3.0),
        ([2, 6], None, 1, "large", "f16", 50.0),
        ([3, 6], None, 0, "first", "f64", 5.0),
    ]
    for shape, perm, axis, tag, dtype, scale in cases:
        if scale >= 50:
            x = uniform(shape, -scale, scale, dtype)
        else:
            x = normal(shape, scale, dtype)
        table.add("softmax", tag, {"axis": axis}, [arg(x, dtype, perm)],
                  softmax_ref(wide(x), axis), dtype, "accumulate")


def gen_norms(table):
    cases = [  # (x shape, dtype, mean offset, tag)
        ([2, 8], "f32", 0.0, "basic"),
        ([3, 4, 16], "f32", 0.0, "rank3"),
        ([1, 5], "f32", 0.0, "row"),
        ([4, 32], "f32", 10.0, "offset"),
        ([6], "f32", 0.0, "rank1"),
        ([3, 24], "f64", 0.0, "basic"),
        ([3, 16], "f16", 0.0, "basic"),
        ([3, 16], "bf16", 0.0, "basic"),
    ]
    for shape, dtype, offset, tag in cases:
        d = shape[-1]
        x = quantize(rng.standard_normal(shape) * 2.0 + offset, dtype)
        gamma = uniform([d], 0.5, 1.5, dtype)
        beta = normal([d], 0.5, dtype)
        xw, gw, bw = wide(x), wide(gamma), wide(beta)

        eps = 1e-5
        mean = xw.mean(axis=-1, keepdims=True)
        var = ((xw - mean) ** 2).mean(axis=-1, keepdims=True)
        ln = (xw - mean) / np.sqrt(var + eps) * gw + bw
        table.add("layer_norm", tag, {"eps": eps},
                  [arg(x, dtype), arg(gamma, dtype), arg(beta, dtype)], ln, dtype,
                  "accumulate")

        eps = 1e-6
        rms = xw / np.sqrt((xw**2).mean(axis=-1, keepdims=True) + eps) * gw
        table.add("rms_norm", tag, {"eps": eps}, [arg(x, dtype), arg(gamma, dtype)],
                  rms, dtype, "accumulate")


def gen_cumsum(table):
    cases = [  # (shape seen, perm, axis, dtype)
        ([6], None, 0, "f32"),
        ([3, 4], None, 1, "f32"),
        ([3, 4], None, 0, "f32"),
        ([2, 3, 4], None, 1, "f32"),
        ([4, 5], [1, 0], 1, "f32"),
        ([1, 0], None, 1, "f32"),
        ([5, 3], None, 0, "i32"),
        ([2, 7], None, 1, "i32"),
    ]
    for shape, perm, axis, dtype in cases:
        x = integers(shape, -20, 21, dtype) if dtype in INTS else normal(shape, 1.0, dtype)
        table.add("cumsum", f"axis{axis}", {"axis": axis}, [arg(x, dtype, perm)],
                  np.cumsum(wide(x), axis=axis), dtype, "accumulate")


def gen_topk(table):
    cases = [  # (shape, k, dtype, ties allowed)
        ([3, 10], 3, "f32", False),
        ([8], 1, "f32", False),
        ([2, 3, 6], 6, "f32", False),
        ([4, 16], 5, "f32", False),
        ([1, 5], 2, "f32", False),
        ([2, 9], 4, "i32", False),
        ([3, 8], 3, "f32", True),   # values only: ties are fine there
    ]
    for shape, k, dtype, ties in cases:
        if ties:
            x = integers(shape, -3, 4, dtype)
        elif dtype in INTS:
            n = int(np.prod(shape))
            x = quantize((rng.permutation(n) - n // 2).reshape(shape), dtype)
        else:
            x = distinct(shape, dtype)
        values, indices = lax.top_k(x, k)
        table.add("topk_values", f"k{k}", {"k": k}, [arg(x, dtype)],
                  np.asarray(values), dtype, "exact")
        if not ties:
            table.add("topk_indices", f"k{k}", {"k": k}, [arg(x, dtype)],
                      np.asarray(indices), "i32", "exact")


# ---------------------------------------------------------------------------
# Data movement: reshape, transpose, narrow, concat, expand, gather, scatter
# ---------------------------------------------------------------------------


def any_values(shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in INTS:
        return integers(shape, -100, 101, dtype)
    return normal(shape, 1.0, dtype)


def gen_reshape(table):
    cases = [  # (shape seen, perm, new shape, dtype)
        ([2, 3, 4], None, [6, 4], "f32"),
        ([6], None, [2, 3], "f32"),
        ([2, 3], None, [3, 2], "f32"),
        ([12], None, [1, 12, 1], "f32"),
        ([1, 1], None, [], "f32"),
        ([], None, [1, 1, 1], "f32"),
        ([3, 4], [1, 0], [12], "f32"),          # non-contiguous input: needs a copy
        ([2, 3, 4], [2, 1, 0], [4, 6], "f32"),
        ([0, 3], None, [3, 0], "f32"),
        ([2, 6], None, [3, 4], "i32"),
        ([4, 2], None, [8], "bool"),
        ([2, 2, 2], None, [4, 2], "f16"),
    ]
    for shape, perm, new_shape, dtype in cases:
        x = any_values(shape, dtype)
        table.add("reshape", "r", {"shape": new_shape}, [arg(x, dtype, perm)],
                  np.reshape(x, new_shape), dtype, "exact")


def gen_transpose(table):
    cases = [
        ([2, 3], [1, 0], "f32"),
        ([2, 3, 4], [2, 0, 1], "f32"),
        ([2, 3, 4], [0, 2, 1], "f32"),
        ([2, 3, 4], [0, 1, 2], "f32"),
        ([2, 3, 4, 5], [0, 2, 1, 3], "f32"),
        ([2, 3, 4, 5], [3, 1, 2, 0], "f32"),
        ([1, 4, 1, 3], [2, 3, 0, 1], "f32"),
        ([3, 0, 2], [2, 1, 0], "f32"),
        ([3, 5], [1, 0], "i64"),
        ([2, 3, 4], [1, 2, 0], "f16"),
        ([2, 2, 3], [2, 1, 0], "bool"),
    ]
    for shape, perm, dtype in cases:
        x = any_values(shape, dtype)
        table.add("transpose", f"rank{len(shape)}", {"perm": perm}, [arg(x, dtype)],
                  np.transpose(x, perm), dtype, "exact")


def gen_narrow(table):
    cases = [  # (shape seen, perm, axis, start, len, dtype)
        ([5, 4], None, 0, 1, 3, "f32"),
        ([5, 4], None, 1, 2, 2, "f32"),
        ([5, 4], None, 0, 2, 0, "f32"),
        ([2, 6, 3], None, 1, 4, 2, "f32"),
        ([2, 6, 3], None, 2, 0, 3, "f32"),
        ([4, 6], [1, 0], 1, 1, 2, "f32"),
        ([7], None, 0, 6, 1, "i32"),
        ([3, 8], None, 1, 3, 4, "bf16"),
    ]
    for shape, perm, axis, start, length, dtype in cases:
        x = any_values(shape, dtype)
        index = [slice(None)] * len(shape)
        index[axis] = slice(start, start + length)
        table.add("narrow", f"axis{axis}", {"axis": axis, "start": start, "len": length},
                  [arg(x, dtype, perm)], x[tuple(index)], dtype, "exact")


def gen_concat(table):
    cases = [  # (list of (shape seen, perm), axis, dtype)
        ([([2, 3], None), ([4, 3], None)], 0, "f32"),
        ([([2, 3], None), ([2, 1], None), ([2, 5], None)], 1, "f32"),
        ([([2, 3, 2], None), ([2, 3, 4], None)], 2, "f32"),
        ([([2, 3, 4], None), ([2, 1, 4], None), ([2, 2, 4], None)], 1, "f32"),
        ([([0, 3], None), ([2, 3], None)], 0, "f32"),
        ([([3, 4], [1, 0]), ([3, 2], None)], 1, "f32"),
        ([([4, 3], [1, 0]), ([4, 3], [1, 0])], 0, "f32"),
        ([([5], None), ([3], None)], 0, "i32"),
        ([([2, 2], None), ([2, 3], None)], 1, "bool"),
        ([([1, 8], None), ([2, 8], None)], 0, "f16"),
    ]
    for parts, axis, dtype in cases:
        values = [any_values(s, dtype) for s, _ in parts]
        args = [arg(v, dtype, p) for v, (_, p) in zip(values, parts)]
        table.add("concat", f"axis{axis}", {"axis": axis}, args,
                  np.concatenate(values, axis=axis), dtype, "exact")


def gen_expand(table):
    cases = [  # (shape, target shape, dtype)
        ([3, 1], [3, 4], "f32"),
        ([4], [2, 3, 4], "f32"),
        ([], [2, 2], "f32"),
        ([1, 1], [5, 6], "f32"),
        ([2, 1, 3], [2, 4, 3], "f32"),
        ([1, 3], [2, 1, 3], "f32"),
        ([2, 3], [2, 3], "f32"),
        ([1, 3], [0, 3], "f32"),
        ([3, 1], [3, 5], "i32"),
        ([1, 4], [3, 4], "bool"),
    ]
    for shape, target, dtype in cases:
        x = any_values(shape, dtype)
        table.add("expand", "e", {"shape": target}, [arg(x, dtype)],
                  np.broadcast_to(x, target), dtype, "exact")


def gen_gather(table):
    cases = [  # (x shape, axis, index shape, index dtype, x dtype)
        ([5, 3], 0, [4], "i32", "f32"),
        ([3, 6], 1, [5], "i32", "f32"),
        ([5, 3], 0, [], "i32", "f32"),
        ([5, 3], 0, [2, 3], "i64", "f32"),
        ([2, 4, 3], 1, [2, 2], "i64", "f32"),
        ([2, 4, 3], 2, [4], "i32", "f32"),
        ([6], 0, [8], "i32", "f32"),
        ([4, 2], 0, [0], "i32", "f32"),
        ([10, 4], 0, [3, 2], "i32", "i32"),
        ([7, 5], 0, [3], "i64", "bf16"),
    ]
    for shape, axis, idx_shape, idx_dtype, dtype in cases:
        x = any_values(shape, dtype)
        idx = integers(idx_shape, 0, shape[axis], idx_dtype)
        if idx.size >= 3:  # make sure there is at least one repeated index
            idx.reshape(-1)[-1] = idx.reshape(-1)[0]
        table.add("gather", f"axis{axis}", {"axis": axis}, [arg(x, dtype), arg(idx, idx_dtype)],
                  np.take(x, idx, axis=axis), dtype, "exact")


def gen_scatter_add(table):
    cases = [  # (x shape, axis, M, dtype)
        ([5, 3], 0, 4, "f32"),
        ([3, 6], 1, 5, "f32"),
        ([2, 4, 3], 1, 6, "f32"),
        ([6], 0, 8, "f32"),
        ([4, 2], 0, 0, "f32"),
        ([5, 3], 0, 7, "i32"),
    ]
    for shape, axis, m, dtype in cases:
        x = any_values(shape, dtype)
        idx = integers([m], 0, shape[axis], "i32")
        if m >= 2:  # guarantee duplicates
            idx[-1] = idx[0]
        upd_shape = list(shape)
        upd_shape[axis] = m
        updates = any_values(upd_shape, dtype)
        out = wide(x).copy()
        np.add.at(np.moveaxis(out, axis, 0), idx, np.moveaxis(wide(updates), axis, 0))
        table.add("scatter_add", f"axis{axis}", {"axis": axis},
                  [arg(x, dtype), arg(idx, "i32"), arg(updates, dtype)], out, dtype,
                  "accumulate")


# ---------------------------------------------------------------------------
# Attention and rotary embeddings
# ---------------------------------------------------------------------------


def attention_ref(q, k, v, mask, window, scale, custom_mask):
    """softmax(q k^T * scale + mask) v with grouped-query head mapping."""
    _, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    k = np.repeat(k, group, axis=1)  # query head h reads kv head h // group
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    i = np.arange(sq)[:, None] + (sk - sq)  # absolute position of each query
    j = np.arange(sk)[None, :]
    if mask == "none":
        allowed = np.ones((sq, sk), bool)
    elif mask == "causal":
        allowed = j <= i
    elif mask == "sliding_window":
        allowed = (j <= i) & (j > i - window)
    elif mask == "custom":
        allowed = np.ones((sq, sk), bool)
        scores = scores + custom_mask
    else:
        raise ValueError(mask)
    assert allowed.any(axis=1).all()
    scores = np.where(allowed, scores, -np.inf)
    return np.einsum("bhqk,bhkd->bhqd", softmax_ref(scores, -1), v)


def gen_attention(table):
    cases = [  # (B, Hq, Hkv, Sq, Sk, D, Dv, mask, window, scale, dtype)
        (1, 2, 2, 4, 4, 8, 8, "none", None, None, "f32"),
        (1, 2, 2, 5, 5, 8, 8, "causal", None, None, "f32"),
        (1, 2, 2, 1, 7, 8, 8, "causal", None, None, "f32"),
        (1, 2, 2, 1, 7, 8, 8, "none", None, None, "f32"),
        (2, 4, 2, 3, 6, 8, 8, "causal", None, None, "f32"),
        (1, 4, 1, 4, 4, 16, 16, "none", None, None, "f32"),
        (1, 4, 1, 1, 7, 16, 16, "causal", None, None, "f32"),
        (1, 2, 2, 4, 6, 8, 4, "causal", None, None, "f32"),
        (2, 2, 1, 5, 5, 4, 6, "none", None, 0.5, "f32"),
        (1, 2, 2, 6, 6, 8, 8, "sliding_window", 3, None, "f32"),
        (1, 4, 2, 2, 7, 8, 8, "sliding_window", 4, None, "f32"),
        (1, 2, 2, 4, 5, 8, 8, "custom", None, None, "f32"),
        (1, 4, 2, 3, 3, 8, 8, "custom", None, None, "f32"),
        (1, 2, 1, 5, 5, 16, 16, "causal", None, None, "f16"),
        (1, 2, 2, 3, 3, 8, 8, "none", None, None, "bf16"),
    ]
    for b, hq, hkv, sq, sk, d, dv, mask, window, scale, dtype in cases:
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        q = normal([b, hq, sq, d], 1.0, dtype)
        k = normal([b, hkv, sk, d], 1.0, dtype)
        v = normal([b, hkv, sk, dv], 1.0, dtype)
        args = [arg(q, dtype), arg(k, dtype), arg(v, dtype)]
        attrs = {"mask": mask}
        if mask == "sliding_window":
            attrs["window"] = window
        attrs["scale"] = scale
        custom = None
        if mask == "custom":
            blocked = rng.random((sq, sk)) < 0.4
            blocked[np.arange(sq), rng.integers(0, sk, sq)] = False  # >=1 open per row
            custom = np.where(blocked, -1e9, 0.0).astype(np.float32)
            args.append(arg(custom, "f32"))
        ref = attention_ref(wide(q), wide(k), wide(v), mask, window, scale,
                            None if custom is None else wide(custom))
        table.add("attention", mask, attrs, args, ref, dtype, "accumulate")


def rope_ref(x, positions, theta, interleaved):
    d = x.shape[-1]
    half = d // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / d)
    angle = positions[:, None] * inv_freq[None, :]  # [S, half]
    cos, sin = np.cos(angle), np.sin(angle)
    out = np.empty_like(x)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
    else:
        a, b = x[..., :half], x[..., half:]
        out[..., :half] = a * cos - b * sin
        out[..., half:] = a * sin + b * cos
    return out


def gen_rope(table):
    cases = [  # (x shape [B,H,S,D], positions, theta, interleaved, dtype)
        ([1, 2, 3, 4], [5, 6, 7], 10000.0, False, "f32"),
        ([1, 2, 3, 4], [5, 6, 7], 10000.0, True, "f32"),
        ([2, 1, 3, 8], [0, 3, 9], 10000.0, False, "f32"),
        ([2, 1, 3, 8], [0, 3, 9], 10000.0, True, "f32"),
        ([1, 3, 4, 16], [0, 1, 2, 3], 10000.0, False, "f32"),
        ([1, 2, 1, 8], [17], 10000.0, True, "f32"),
        ([1, 2, 5, 8], [2, 4, 6, 8, 10], 500000.0, False, "f32"),
        ([1, 2, 3, 8], [1, 2, 3], 10000.0, False, "f16"),
        ([1, 2, 3, 8], [4, 0, 2], 10000.0, True, "bf16"),
    ]
    for shape, positions, theta, interleaved, dtype in cases:
        x = normal(shape, 1.0, dtype)
        pos = np.asarray(positions, np.int32)
        table.add("rope", "interleaved" if interleaved else "half",
                  {"theta": theta, "interleaved": interleaved},
                  [arg(x, dtype), arg(pos, "i32")],
                  rope_ref(wide(x), wide(pos), theta, interleaved), dtype, "accumulate")


# ---------------------------------------------------------------------------
# Convolution and pooling
# ---------------------------------------------------------------------------


def gen_conv(table):
    cases = [  # (x shape, w shape, stride, padding, dilation, groups, tag, dtype)
        ([1, 2, 8], [3, 2, 3], [1], [[0, 0]], [1], 1, "1d", "f32"),
        ([2, 3, 9], [4, 3, 3], [2], [[1, 1]], [1], 1, "1d_stride2", "f32"),
        ([1, 2, 10], [2, 2, 3], [1], [[2, 1]], [2], 1, "1d_dilation_asym", "f32"),
        ([2, 4, 9], [6, 2, 3], [1], [[1, 1]], [1], 2, "1d_groups2", "f32"),
        ([1, 3, 12], [3, 1, 5], [1], [[2, 2]], [1], 3, "1d_depthwise", "f32"),
        ([1, 3, 6, 6], [4, 3, 3, 3], [1, 1], [[1, 1], [1, 1]], [1, 1], 1, "2d", "f32"),
        ([2, 2, 7, 6], [3, 2, 3, 3], [2, 2], [[0, 1], [1, 0]], [1, 1], 1,
         "2d_stride2_asym", "f32"),
        ([1, 2, 8, 8], [2, 2, 3, 3], [1, 1], [[2, 2], [1, 1]], [2, 2], 1, "2d_dilation2",
         "f32"),
        ([1, 4, 5, 5], [4, 2, 3, 3], [1, 1], [[1, 1], [1, 1]], [1, 1], 2, "2d_groups2",
         "f32"),
        ([2, 3, 6, 6], [3, 1, 3, 3], [1, 1], [[1, 1], [1, 1]], [1, 1], 3, "2d_depthwise",
         "f32"),
        ([1, 3, 5, 5], [6, 1, 3, 3], [2, 1], [[1, 1], [0, 0]], [1, 1], 3,
         "2d_depthwise_mult2", "f32"),
        ([1, 4, 5, 7], [3, 4, 1, 1], [1, 2], [[0, 0], [0, 0]], [1, 1], 1, "2d_pointwise",
         "f32"),
        ([1, 2, 5, 5], [2, 2, 3, 3], [1, 1], [[1, 1], [1, 1]], [1, 1], 1, "2d", "f64"),
        ([1, 2, 6, 6], [4, 2, 3, 3], [1, 1], [[1, 1], [1, 1]], [1, 1], 1, "2d", "f16"),
    ]
    for xs, ws, stride, padding, dilation, groups, tag, dtype in cases:
        x, w = normal(xs, 1.0, dtype), normal(ws, 0.5, dtype)
        out = lax.conv_general_dilated(
            wide(x), wide(w), window_strides=tuple(stride),
            padding=[tuple(p) for p in padding], rhs_dilation=tuple(dilation),
            feature_group_count=groups)
        attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
        table.add("conv", tag, attrs, [arg(x, dtype), arg(w, dtype)], np.asarray(out),
                  dtype, "accumulate")


def pool_ref(x, kind, kernel, stride, padding):
    """N-d pooling over the trailing dims of an [N, C, ...] array. Padding is
    ignored by both kinds (max never picks it, mean divides by the number of
    real elements in the window)."""
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    padded = np.pad(x, [(0, 0), (0, 0)] + [tuple(p) for p in padding],
                    constant_values=np.nan)
    out_sizes = [(size + lo + hi - k) // s + 1
                 for size, (lo, hi), k, s in zip(spatial, padding, kernel, stride)]
    out = np.empty([n, c] + out_sizes)
    for pos in itertools.product(*[range(o) for o in out_sizes]):
        window = padded[(Ellipsis,) + tuple(
            slice(p * s, p * s + k) for p, s, k in zip(pos, stride, kernel))]
        window = window.reshape(n, c, -1)
        assert not np.isnan(window).all(axis=-1).any(), "window with only padding"
        reduce = np.nanmax if kind == "max" else np.nanmean
        out[(Ellipsis,) + pos] = reduce(window, axis=-1)
    return out


def gen_pool(table):
    cases = [  # (x shape, kind, kernel, stride, padding, dtype)
        ([1, 2, 8], "max", [3], [1], [[0, 0]], "f32"),
        ([2, 3, 8], "mean", [2], [2], [[0, 0]], "f32"),
        ([1, 2, 9], "max", [3], [2], [[1, 1]], "f32"),
        ([1, 2, 7], "mean", [3], [2], [[1, 2]], "f32"),
        ([1, 2, 6, 6], "max", [2, 2], [2, 2], [[0, 0], [0, 0]], "f32"),
        ([2, 2, 5, 5], "mean", [3, 3], [1, 1], [[1, 1], [1, 1]], "f32"),
        ([1, 3, 7, 6], "mean", [3, 3], [2, 2], [[1, 0], [0, 1]], "f32"),
        ([1, 2, 6, 7], "max", [2, 3], [1, 2], [[1, 0], [0, 2]], "f32"),
        ([1, 2, 5, 5], "max", [3, 3], [2, 2], [[1, 1], [1, 1]], "f16"),
        ([1, 1, 4, 6], "mean", [2, 2], [2, 2], [[0, 0], [1, 1]], "f64"),
    ]
    for shape, kind, kernel, stride, padding, dtype in cases:
        for (lo, hi), k in zip(padding, kernel):
            assert lo < k and hi < k, "every window must hold a real element"
        x = normal(shape, 1.0, dtype)
        attrs = {"kind": kind, "kernel": kernel, "stride": stride, "padding": padding}
        table.add("pool", f"{kind}{len(kernel)}d", attrs, [arg(x, dtype)],
                  pool_ref(wide(x), kind, kernel, stride, padding), dtype,
                  "exact" if kind == "max" else "accumulate")


def gelu_tanh_grad(x):
    c = math.sqrt(2.0 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x**2)


def gen_unary_grads(table):
    """Derivative activations (what autodiff rules multiply by). Generated last, so adding
    them moved no earlier case."""
    for shape, perm, tag, dtype in UNARY_LAYOUTS:
        x = normal(shape, 3.0, dtype)
        table.add("gelu_approx_grad", tag, {}, [arg(x, dtype, perm)], gelu_tanh_grad(wide(x)), dtype,
                  "transcendental")


# ---------------------------------------------------------------------------
# Quantized weights, the KV cache and custom functions. Generated after every
# earlier group, so adding them moved no earlier case.
# ---------------------------------------------------------------------------

GGUF_GOLDEN = Path(__file__).resolve().parents[3] / "rlx-gguf/tests/golden/dequant.json"
# The IR's scheme name of each ggml type the golden file holds (F32 rows are plain f32).
GGUF_SCHEMES = {"F16": "GgufF16", "BF16": "GgufBF16", "Q4_0": "GgufQ4_0", "Q4_1": "GgufQ4_1",
                "Q5_0": "GgufQ5_0", "Q5_1": "GgufQ5_1", "Q8_0": "GgufQ8_0", "Q2_K": "GgufQ2K",
                "Q3_K": "GgufQ3K", "Q4_K": "GgufQ4K", "Q5_K": "GgufQ5K", "Q6_K": "GgufQ6K",
                "Q8_K": "GgufQ8K"}


def gguf_rows():
    """(scheme, packed U8 [N, row_bytes], decoded f32 [N, K]) for every GGUF scheme, from the
    blocks and values the `gguf` Python package decoded (crates/rlx-gguf/tests/golden). Rows
    holding a non-finite value (the f16/bf16 special cases) are left out."""
    cases = json.loads(GGUF_GOLDEN.read_text())["cases"]
    out = []
    for c in cases:
        if c["type"] not in GGUF_SCHEMES:
            continue
        raw = np.frombuffer(bytes.fromhex(c["data_hex"]), dtype=np.uint8)
        vals = np.array(c["values_bits"], dtype=np.uint32).view(np.float32)
        rows = 4 if c["type"] in ("F16", "BF16") else 2
        packed = raw.reshape(rows, -1)
        dec = vals.reshape(rows, -1)
        keep = np.all(np.isfinite(dec), axis=1) & np.all(np.abs(dec) < 1e30, axis=1)
        out.append((GGUF_SCHEMES[c["type"]], packed[keep], dec[keep]))
    return out


def gen_gguf(table):
    """Dequantize (decoded rows, exact) and DequantMatMul (x @ W^T). The product's tolerance is
    that of llama.cpp's arithmetic, which rounds activations to 8 bits (Q8_0 / Q8_1 / Q8_K) for
    the integer dot products: 1% of the sum of the terms' magnitudes."""
    for scheme, packed, dec in gguf_rows():
        table.add("dequantize_rows", scheme.lower(), {"scheme": scheme}, [arg(packed.copy(), "u8")], dec, "f32", "exact")
        x = normal([3, dec.shape[1]], 1.0, "f32")
        want = wide(x) @ wide(dec).T
        table.add("dequant_matmul", scheme.lower(), {"scheme": scheme}, [arg(x, "f32"), arg(packed.copy(), "u8")], want,
                  "f32", "accumulate")
        terms = np.abs(wide(x)) @ np.abs(wide(dec)).T
        table.cases[-1]["atol"] = float(0.01 * terms.max())


def cached_attention_ref(q, k, v, pos, scale, window):
    s, hq, _ = q.shape
    t, hkv, dv = v.shape
    out = np.zeros((s, hq, dv))
    for i in range(s):
        last = min(pos + i, t - 1)
        first = 0 if window is None else max(last + 1 - window, 0)
        for h in range(hq):
            kh = h // (hq // hkv)
            sc = scale * (k[first:last + 1, kh] @ q[i, h])
            w = np.exp(sc - sc.max())
            out[i, h] = (w / w.sum()) @ v[first:last + 1, kh]
    return out


def gen_kv(table):
    """CacheWrite (rows past the cache dropped; an f16 cache takes f32 rows) and
    CachedAttention (causal from a position, grouped heads, a sliding window)."""
    for cache_dt, t, s, pos, tag in [("f32", 6, 2, 3, "mid"), ("f32", 6, 3, 4, "past_end"), ("f16", 5, 1, 0, "f16")]:
        cache = normal([t, 2, 3], 1.0, cache_dt)
        upd = normal([s, 2, 3], 1.0, "f32")
        want = wide(cache).copy()
        rows = min(s, t - pos)
        want[pos:pos + rows] = wide(upd)[:rows]
        table.add("cache_write", tag, {}, [arg(cache, cache_dt), arg(upd, "f32"), arg(np.array([pos], np.int32), "i32")],
                  want, cache_dt, "exact")
    for s, hq, hkv, t, pos, window, tag in [(1, 4, 2, 8, 5, None, "decode"), (3, 2, 2, 8, 2, None, "prompt"),
                                             (2, 4, 1, 9, 6, 3, "window")]:
        q = normal([s, hq, 4], 1.0, "f32")
        k = normal([t, hkv, 4], 1.0, "f32")
        v = normal([t, hkv, 5], 1.0, "f32")
        scale = 0.5
        want = cached_attention_ref(wide(q), wide(k), wide(v), pos, scale, window)
        table.add("cached_attention", tag, {"scale": scale, "window": window},
                  [arg(q, "f32"), arg(k, "f32"), arg(v, "f32"), arg(np.array([pos], np.int32), "i32")], want, "f32",
                  "accumulate")


def gen_custom(table):
    """A custom function (softplus, given to the op as a body graph)."""
    for shape, dtype in [([2, 5], "f32"), ([7], "f64")]:
        x = normal(shape, 2.0, dtype)
        table.add("custom", "softplus", {"fn": "softplus", "shape": shape, "dtype": dtype}, [arg(x, dtype)], np.log1p(np.exp(wide(x))), dtype,
                  "transcendental")


def fused_body(name, inputs, lines, out):
    """An RLX graph in its text form: `inputs` as (name, dtype, shape), then node lines."""
    dims = lambda sh: ", ".join(str(d) for d in sh)
    text = [f'graph "{name}" {{']
    for i, (n, dt, sh) in enumerate(inputs):
        text.append(f'  %{i} = input {{name = "{n}"}} : {dt}[{dims(sh)}]')
    text += ["  " + l for l in lines]
    text.append(f"  return {out}")
    text.append("}")
    return "\n".join(text)


def gen_fused(table):
    """Fused regions (an elementwise body as the rlx text form): silu(a) * b, and
    exp(a - b) * c with b and c broadcast."""
    for dtype in ["f32", "f64"]:
        a, b = normal([3, 4], 1.5, dtype), normal([3, 4], 1.0, dtype)
        body = fused_body("swiglu", [("a", dtype, [3, 4]), ("b", dtype, [3, 4])],
                          [f"%2 = silu %0 : {dtype}[3, 4]", f"%3 = mul %2, %1 : {dtype}[3, 4]"], "%3")
        wa = wide(a)
        table.add("fused", "swiglu", {"kind": "elementwise", "body": body}, [arg(a, dtype), arg(b, dtype)],
                  wa / (1 + np.exp(-wa)) * wide(b), dtype, "transcendental")
        c = normal([1], 1.0, dtype)
        b = normal([4], 0.5, dtype)
        body = fused_body("exp_sub_mul", [("a", dtype, [2, 3, 4]), ("b", dtype, [4]), ("c", dtype, [1])],
                          [f"%3 = sub %0, %1 : {dtype}[2, 3, 4]", f"%4 = exp %3 : {dtype}[2, 3, 4]",
                           f"%5 = mul %4, %2 : {dtype}[2, 3, 4]"], "%5")
        a = normal([2, 3, 4], 1.0, dtype)
        table.add("fused", "exp_sub_mul", {"kind": "elementwise", "body": body}, [arg(a, dtype), arg(b, dtype), arg(c, dtype)],
                  np.exp(wide(a) - wide(b)) * wide(c), dtype, "transcendental")


def affine_params(shape, axis, qdtype, fdtype):
    """Positive scales and in-range zero points, scalar (axis None) or one per channel."""
    n = [] if axis is None else [shape[axis]]
    scale = uniform(n, 0.05, 0.5, fdtype)
    lo, hi = (0, 255) if qdtype == "u8" else (-128, 127)
    zp = integers(n, lo // 4, hi // 4 + 1, qdtype)
    return scale, zp


def bcast_param(p, shape, axis):
    p = np.asarray(p)
    if axis is None:
        return p
    d = [1] * len(shape)
    d[axis] = shape[axis]
    return p.reshape(d)


def quantize_ref(x, scale, zp, axis, qdtype):
    """ONNX QuantizeLinear: round half to even of x / scale (divided in x's dtype), plus the
    zero point, saturated to the quantized range."""
    lo, hi = (0, 255) if qdtype == "u8" else (-128, 127)
    q = np.round(x / bcast_param(scale, x.shape, axis)).astype(np.float64)
    return np.clip(q + bcast_param(zp, x.shape, axis).astype(np.float64), lo, hi)


AFFINE_LAYOUTS = [([2, 7], None, "tensor"), ([3, 4], 0, "channel0"), ([2, 3, 5], 1, "channel1")]


def gen_narrow_ints(table):
    """Casts into and out of i8 / u8 (float to int truncates toward zero and saturates at the
    range; int to int wraps) and i8 / u8 arithmetic that wraps. Fixed values (no
    draws), so the cases before these keep their inputs."""
    f32 = lambda v: np.asarray(v, dtype=np.float32)  # noqa: E731

    def saturate(v, lo, hi):
        v = np.asarray(v, np.float64)
        return np.where(np.isnan(v), 0, np.clip(np.trunc(v), lo, hi)).astype(np.int64)

    floats = f32([-300.0, -128.9, -2.7, -0.5, 0.9, 127.9, 254.6, 1e10, -1e10, 77.0])
    ints = np.asarray([-129, 128, 255, 256, -1, 1000, 42, -2**31], np.int32)
    casts = [  # (tag, from, to, value, expected)
        ("f32_to_i8", "f32", "i8", floats, saturate(floats, -128, 127)),
        ("f32_to_u8", "f32", "u8", floats, saturate(floats, 0, 255)),
        ("i32_to_i8", "i32", "i8", ints, ints.astype(np.int8)),
        ("i32_to_u8", "i32", "u8", ints, ints.astype(np.uint8)),
        ("u8_to_i8", "u8", "i8", np.asarray([0, 1, 127, 128, 255], np.uint8),
         np.asarray([0, 1, 127, -128, -1])),
        ("i8_to_u8", "i8", "u8", np.asarray([-128, -1, 0, 1, 127], np.int8),
         np.asarray([128, 255, 0, 1, 127])),
        ("i8_to_f32", "i8", "f32", np.asarray([-128, -1, 0, 5, 127], np.int8),
         np.asarray([-128.0, -1.0, 0.0, 5.0, 127.0])),
        ("i8_to_i32", "i8", "i32", np.asarray([-128, -7, 0, 127], np.int8),
         np.asarray([-128, -7, 0, 127])),
    ]
    for tag, src, dst, value, expected in casts:
        table.add("cast", tag, {"to": dst}, [arg(value, src)], expected, dst, "exact")
    for dtype, a, b in [
        ("i8", [100, -100, 127, -128, 7, -9], [100, -100, 1, -1, 0, 2]),
        ("u8", [200, 0, 255, 3, 17, 9], [100, 1, 1, 5, 0, 2]),
    ]:
        a, b = np.asarray(a, NP_DTYPE[dtype]), np.asarray(b, NP_DTYPE[dtype])
        wa, wb = wide(a), wide(b)
        for op, ref in [("add", wa + wb), ("sub", wa - wb), ("mul", wa * wb)]:
            table.add(op, "wrap", {}, [arg(a, dtype), arg(b, dtype)], ref, dtype, "exact")


def gen_affine_quant(table):
    """Quantize / Dequantize / FakeQuantize, int8 and uint8, per tensor and per channel. The
    inputs include exact ties (x / scale = k + 0.5) and values far outside the range."""
    for (shape, axis, tag), qdtype, fdtype in itertools.product(AFFINE_LAYOUTS, ["i8", "u8"], ["f32", "f64"]):
        if fdtype == "f64" and tag != "channel1":
            continue
        scale, zp = affine_params(shape, axis, qdtype, fdtype)
        x = normal(shape, 8.0, fdtype)
        flat = x.reshape(-1)
        scale.reshape(-1)[0] = 0.25  # channel 0 (the first element's): exact ties below
        flat[0] = 0.625  # x / scale = 2.5 exactly: rounds to 2
        flat[1] = -0.875  # also channel 0 (no layout has the channel axis last): -3.5 rounds to -4
        flat[-1] = 1e4  # saturates
        q = quantize_ref(x, scale, zp, axis, qdtype)
        attrs = {"axis": axis}
        args = [arg(x, fdtype), arg(scale, fdtype), arg(zp, qdtype)]
        table.add("quantize", tag, attrs, args, q, qdtype, "exact")
        fq = (q - bcast_param(zp, shape, axis).astype(np.float64)) * bcast_param(wide(scale), shape, axis)
        table.add("fake_quantize", tag, attrs, args, fq, fdtype, "elementwise")
        qv = q.astype(NP_DTYPE[qdtype])
        deq = (wide(qv) - bcast_param(wide(zp), shape, axis)) * bcast_param(wide(scale), shape, axis)
        table.add("dequantize", tag, attrs, [arg(qv, qdtype), arg(scale, fdtype), arg(zp, qdtype)], deq, fdtype,
                  "elementwise")


def paged_attention_ref(q, k, v, pos, table, scale, window, block):
    s, hq, _ = q.shape
    r, hkv, dv = v.shape
    blocks, m = r // block, table.shape[1]
    out = np.zeros((s, hq, dv))
    for i in range(s):
        if pos[i] < 0:
            continue
        last = min(pos[i], m * block - 1)
        first = 0 if window is None else max(last + 1 - window, 0)
        rows = [table[i, j // block] * block + j % block for j in range(first, last + 1)
                if 0 <= table[i, j // block] < blocks]
        for h in range(hq):
            kh = h // (hq // hkv)
            sc = scale * (k[rows, kh] @ q[i, h])
            w = np.exp(sc - sc.max())
            out[i, h] = (w / w.sum()) @ v[rows, kh]
    return out


def gen_paged(table):
    """The paged KV cache: CacheWrite with one slot per update row (slots outside the cache
    dropped) and PagedAttention (rows of several sequences in one batch, each through its
    block-table row; a block outside the pool skipped, a negative position giving zeros)."""
    for cache_dt, slots, tag in [("f32", [5, 0, 9, -1], "slots"), ("f16", [7, 2], "slots_f16")]:
        cache = normal([8, 2, 3], 1.0, cache_dt)
        upd = normal([len(slots), 2, 3], 1.0, "f32")
        want = wide(cache).copy()
        for r, slot in enumerate(slots):
            if 0 <= slot < 8:
                want[slot] = wide(upd)[r]
        table.add("cache_write", tag, {}, [arg(cache, cache_dt), arg(upd, "f32"),
                                           arg(np.array(slots, np.int32), "i32")], want, cache_dt, "exact")
    cases = [
        # Two sequences side by side: A (blocks 2, 0, 3) at positions 5 and 6, B (blocks 1, 3) at 2.
        (4, None, [5, 2, 6], [[2, 0, 3], [1, 3, 3], [2, 0, 3]], 4, 4, 2, "batch"),
        # A sliding window over blocks of 2; the second query's table names a block past the pool.
        (2, 3, [4, 5], [[3, 1, 0], [3, 9, 0]], 4, 2, 1, "window"),
        # A query with no position sees nothing; a position past the table is clamped.
        (4, None, [-1, 40], [[0, 1], [1, 0]], 2, 2, 2, "edges"),
    ]
    for block, window, pos, tab, nb, hq, hkv, tag in cases:
        s = len(pos)
        q = normal([s, hq, 4], 1.0, "f32")
        k = normal([nb * block, hkv, 4], 1.0, "f32")
        v = normal([nb * block, hkv, 5], 1.0, "f32")
        pos, tab = np.array(pos, np.int32), np.array(tab, np.int32)
        want = paged_attention_ref(wide(q), wide(k), wide(v), pos, tab, 0.5, window, block)
        table.add("paged_attention", tag, {"scale": 0.5, "window": window, "block": block},
                  [arg(q, "f32"), arg(k, "f32"), arg(v, "f32"), arg(pos, "i32"), arg(tab, "i32")], want, "f32",
                  "accumulate")


# ---------------------------------------------------------------------------
# HIR blocks (linear, embedding, mlp, transformer_block): numpy written from the
# layers' definitions, not from RLX's lowering.
# ---------------------------------------------------------------------------


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def rms_norm_ref(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def gen_blocks(table):
    x = normal([3, 4], 1.0, "f32")
    w = normal([4, 5], 0.5, "f32")
    b = normal([5], 0.5, "f32")
    table.add("linear", "bias", {}, [arg(x, "f32"), arg(w, "f32"), arg(b, "f32")],
              wide(x) @ wide(w) + wide(b), "f32", "accumulate")
    x3 = normal([2, 3, 4], 1.0, "f32")
    table.add("linear", "batched", {}, [arg(x3, "f32"), arg(w, "f32")],
              wide(x3) @ wide(w), "f32", "accumulate")

    emb = normal([6, 4], 1.0, "f32")
    ids = np.asarray([[0, 5, 2], [2, 2, 1]], np.int32)
    table.add("embedding", "rows", {}, [arg(emb, "f32"), arg(ids, "i32")], wide(emb)[ids], "f32", "exact")

    x = normal([3, 4], 1.0, "f32")
    wu, wd = normal([4, 8], 0.5, "f32"), normal([8, 4], 0.5, "f32")
    table.add("mlp", "gelu", {"act": "gelu_approx", "gated": False},
              [arg(x, "f32"), arg(wu, "f32"), arg(wd, "f32")],
              gelu_tanh(wide(x) @ wide(wu)) @ wide(wd), "f32", "accumulate")
    wg = normal([4, 8], 0.5, "f32")
    table.add("mlp", "swiglu", {"act": "silu", "gated": True},
              [arg(x, "f32"), arg(wg, "f32"), arg(wu, "f32"), arg(wd, "f32")],
              (silu(wide(x) @ wide(wg)) * (wide(x) @ wide(wu))) @ wide(wd), "f32", "accumulate")

    bsz, t, d, heads, hidden, eps = 2, 4, 8, 2, 16, 1e-5
    x = normal([bsz, t, d], 1.0, "f32")
    n1, n2 = quantize(1.0 + 0.1 * rng.standard_normal(d), "f32"), quantize(1.0 + 0.1 * rng.standard_normal(d), "f32")
    wqkv, wo = normal([d, 3 * d], 0.3, "f32"), normal([d, d], 0.3, "f32")
    w1, w2 = normal([d, hidden], 0.3, "f32"), normal([hidden, d], 0.3, "f32")
    for causal in (True, False):
        xf = wide(x)
        qkv = rms_norm_ref(xf, wide(n1), eps) @ wide(wqkv)
        dh = d // heads
        q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(bsz, t, heads, dh).transpose(0, 2, 1, 3)
                   for i in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
        if causal:
            s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        a = (p @ v).transpose(0, 2, 1, 3).reshape(bsz, t, d) @ wide(wo)
        h = xf + a
        y = h + gelu_tanh(rms_norm_ref(h, wide(n2), eps) @ wide(w1)) @ wide(w2)
        table.add("transformer_block", "causal" if causal else "full",
                  {"heads": heads, "eps": eps, "causal": causal},
                  [arg(x, "f32"), arg(n1, "f32"), arg(wqkv, "f32"), arg(wo, "f32"),
                   arg(n2, "f32"), arg(w1, "f32"), arg(w2, "f32")],
                  y, "f32", "accumulate")


def gen_if(table):
    """lax.cond with a scalar predicate, both ways: then = x*x + 1, else = -x (the branches as
    rlx text-form graphs)."""
    for dtype in ["f32", "f64"]:
        then_b = fused_body("sq1", [("x", dtype, [5])],
                            [f"%1 = mul %0, %0 : {dtype}[5]",
                             f"%2 = constant {{data = 0x{np.ones(5, NP_DTYPE[dtype]).tobytes().hex()}}} : {dtype}[5]",
                             f"%3 = add %1, %2 : {dtype}[5]"], "%3")
        else_b = fused_body("neg", [("x", dtype, [5])], [f"%1 = neg %0 : {dtype}[5]"], "%1")
        x = normal([5], 1.5, dtype)
        for p in (True, False):
            ref = jax.lax.cond(p, lambda v: v * v + 1.0, lambda v: -v, wide(x))
            table.add("if", "true" if p else "false", {"then": then_b, "else": else_b},
                      [arg(np.asarray(p), "bool"), arg(x, dtype)], np.asarray(ref), dtype, "elementwise")


def gen_loops(table):
    """lax.while_loop (halve x while max(x) > 1; also bounded at 2 iterations) and lax.scan (a
    running sum with a decay constant passed whole), the graphs in the rlx text form."""
    for dtype in ["f32", "f64"]:
        cond = fused_body("big", [("x", dtype, [3])],
                          [f"%1 = reduce %0 {{kind = max, axes = [0], keepdims = false}} : {dtype}[]",
                           f"%2 = constant {{data = 0x{np.ones((), NP_DTYPE[dtype]).tobytes().hex()}}} : {dtype}[]",
                           "%3 = gt %1, %2 : bool[]"], "%3")
        body = fused_body("halve", [("x", dtype, [3])],
                          [f"%1 = constant {{data = 0x{np.full(3, 0.5, NP_DTYPE[dtype]).tobytes().hex()}}} : {dtype}[3]",
                           f"%2 = mul %0, %1 : {dtype}[3]"], "%2")
        x = quantize(np.abs(normal([3], 6.0, dtype)) + 1.5, dtype)
        for max_it in (None, 2):
            def run(v):
                return jax.lax.while_loop(lambda c: (c[1] if max_it is not None else True) & (jnp_max(c[0]) > 1.0),
                                          lambda c: (c[0] * 0.5, c[2] + 1 < (max_it or 0), c[2] + 1), (v, True, 0))[0]
            ref = run(wide(x))
            table.add("while", "bounded" if max_it else "free",
                      {"cond": cond, "body": body, "max_iterations": max_it, "output": 0},
                      [arg(x, dtype)], np.asarray(ref), dtype, "elementwise")
        sbody = fused_body("decay_sum", [("c", dtype, [3]), ("k", dtype, [3]), ("x", dtype, [3])],
                           [f"%3 = mul %0, %1 : {dtype}[3]", f"%4 = add %3, %2 : {dtype}[3]"], "%4")
        c0, k, xs = normal([3], 1.0, dtype), quantize(np.full(3, 0.5), dtype), normal([4, 3], 1.0, dtype)
        _, hs = jax.lax.scan(lambda c, x: (c * wide(k) + x, c * wide(k) + x), wide(c0), wide(xs))
        table.add("scan", "decay_sum", {"body": sbody, "consts": 1},
                  [arg(c0, dtype), arg(k, dtype), arg(xs, dtype)], np.asarray(hs), dtype, "accumulate")


def selective_scan_ref(u, delta, a, b, c, d=None, z=None, delta_softplus=False):
    """mamba_ssm's selective_scan_ref (real A, variable B and C), in f64 numpy."""
    u, delta, a, b, c = (np.asarray(v, np.float64) for v in (u, delta, a, b, c))
    if delta_softplus:
        delta = np.logaddexp(0.0, delta)
    delta_a = np.exp(np.einsum("bdl,dn->bdln", delta, a))
    delta_b_u = np.einsum("bdl,bnl,bdl->bdln", delta, b, u)
    x = np.zeros((u.shape[0], u.shape[1], a.shape[1]))
    ys = []
    for i in range(u.shape[2]):
        x = delta_a[:, :, i] * x + delta_b_u[:, :, i]
        ys.append(np.einsum("bdn,bn->bd", x, c[:, :, i]))
    out = np.stack(ys, axis=2)
    if d is not None:
        out = out + u * np.asarray(d, np.float64)[None, :, None]
    if z is not None:
        z = np.asarray(z, np.float64)
        out = out * (z / (1.0 + np.exp(-z)))
    return out


def gen_selective_scan(table):
    """Mamba's selective scan against the reference recurrence: with and without softplus on
    delta, with the skip D and the gate z or without them."""
    for dtype, (bs, ds, ls, ns), softplus, extras in [
        ("f32", (1, 2, 5, 3), False, 0),
        ("f32", (2, 3, 6, 4), True, 2),
        ("f32", (1, 4, 9, 2), True, 1),
        ("f64", (2, 2, 4, 3), False, 2),
    ]:
        u = normal([bs, ds, ls], 1.0, dtype)
        delta = normal([bs, ds, ls], 1.0, dtype) if softplus else uniform([bs, ds, ls], 0.05, 0.8, dtype)
        a = quantize(-np.exp(wide(normal([ds, ns], 0.5, dtype))), dtype)
        b = normal([bs, ns, ls], 1.0, dtype)
        c = normal([bs, ns, ls], 1.0, dtype)
        args = [u, delta, a, b, c]
        if extras >= 1:
            args.append(normal([ds], 1.0, dtype))
        if extras >= 2:
            args.append(normal([bs, ds, ls], 1.0, dtype))
        ref = selective_scan_ref(*[wide(v) for v in args], delta_softplus=softplus)
        tag = ("softplus_" if softplus else "") + ["plain", "skip", "gated"][extras]
        table.add("selective_scan", tag, {"delta_softplus": softplus}, [arg(v, dtype) for v in args],
                  ref, dtype, "accumulate")


def jnp_max(v):
    return jax.numpy.max(v)


def gen_quant_linear(table):
    """The quantized linear block: x @ W^T over packed rows (the dequant_matmul it lowers to,
    one row per GGUF scheme family)."""
    for scheme, packed, dec in gguf_rows():
        if scheme not in ("GgufQ4_0", "GgufQ8_0", "GgufQ4K", "GgufQ6K"):
            continue
        x = normal([2, dec.shape[1]], 1.0, "f32")
        table.add("quant_linear", scheme.lower(), {"scheme": scheme}, [arg(x, "f32"), arg(packed.copy(), "u8")],
                  wide(x) @ wide(dec).T, "f32", "accumulate")
        terms = np.abs(wide(x)) @ np.abs(wide(dec)).T
        table.cases[-1]["atol"] = float(0.01 * terms.max())


def cnormal(shape, scale=1.0):
    """Complex values with standard normal parts (c64)."""
    re = rng.standard_normal(shape) * scale
    im = rng.standard_normal(shape) * scale
    return (re + 1j * im).astype(np.complex64)


def gen_complex(table):
    """c64 through every op that has a complex form (arithmetic, products, sums, movement,
    casts, compares) and the three primitives `complex`, `real` and `imag`."""
    c = "c64"
    for op, fn in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)]:
        for ls, rs, tag in [([3, 4], [3, 4], "same"), ([3, 1], [4], "bcast")]:
            a, b = cnormal(ls), cnormal(rs)
            table.add(op, tag, {}, [arg(a, c), arg(b, c)], fn(wide(a), wide(b)), c, "elementwise")
    a, b = cnormal([2, 5]), cnormal([2, 5]) + np.complex64(1.5 - 0.5j)
    table.add("div", "same", {}, [arg(a, c), arg(b, c)], wide(a) / wide(b), c, "transcendental")
    a = cnormal([6])
    b = a.copy()
    b[1] = np.complex64(a[1].real + 1j * (a[1].imag + 1))  # same real part
    b[4] = np.complex64((a[4].real + 1) + 1j * a[4].imag)  # same imaginary part
    for op, fn in [("eq", np.equal), ("ne", np.not_equal)]:
        table.add(op, "parts", {}, [arg(a, c), arg(b, c)], fn(a, b), "bool", "exact")
    cond = rng.random([2, 3]) < 0.5
    a, b = cnormal([2, 3]), cnormal([2, 3])
    table.add("where", "c64", {}, [arg(cond, "bool"), arg(a, c), arg(b, c)], np.where(cond, a, b), c, "elementwise")
    z = cnormal([3, 4])
    table.add("neg", "c64", {}, [arg(z, c)], -wide(z), c, "elementwise")
    table.add("abs", "c64", {}, [arg(z, c)], np.abs(wide(z)), "f32", "transcendental")
    table.add("exp", "c64", {}, [arg(z, c)], np.exp(wide(z)), c, "transcendental")
    table.add("log", "c64", {}, [arg(z, c)], np.log(wide(z)), c, "transcendental")
    x = normal([2, 3], 1.0, "f32")
    table.add("cast", "f32_to_c64", {"to": c}, [arg(x, "f32")], wide(x).astype(np.complex128), c, "exact")
    table.add("cast", "c64_to_f32", {"to": "f32"}, [arg(z, c)], wide(z).real, "f32", "exact")
    a, b = cnormal([2, 3, 4]), cnormal([4, 5])
    table.add("matmul", "c64", {}, [arg(a, c), arg(b, c)], wide(a) @ wide(b), c, "accumulate")
    a, b = cnormal([3, 4]), cnormal([4, 2])
    table.add("dot_general", "c64", {"lhs_contract": [1], "rhs_contract": [0], "lhs_batch": [], "rhs_batch": []},
              [arg(a, c), arg(b, c)], wide(a) @ wide(b), c, "accumulate")
    z = cnormal([2, 3, 4])
    for kind, fn in [("sum", np.sum), ("mean", np.mean)]:
        table.add("reduce", f"c64_{kind}", {"kind": kind, "axes": [0, 2], "keepdims": False},
                  [arg(z, c)], fn(wide(z), axis=(0, 2)), c, "accumulate")
    table.add("reshape", "c64", {"shape": [4, 6]}, [arg(z, c)], wide(z).reshape(4, 6), c, "exact")
    table.add("transpose", "c64", {"perm": [2, 0, 1]}, [arg(z, c)], np.transpose(wide(z), (2, 0, 1)), c, "exact")
    table.add("narrow", "c64", {"axis": 2, "start": 1, "len": 2}, [arg(z, c)], wide(z)[:, :, 1:3], c, "exact")
    w = cnormal([2, 1, 4])
    table.add("concat", "c64", {"axis": 1}, [arg(z, c), arg(w, c)], np.concatenate([wide(z), wide(w)], axis=1), c, "exact")
    v = cnormal([3, 1])
    table.add("expand", "c64", {"shape": [2, 3, 4]}, [arg(v, c)], np.broadcast_to(wide(v), (2, 3, 4)), c, "exact")
    idx = np.array([2, 0, 2], np.int32)
    table.add("gather", "c64", {"axis": 1}, [arg(z, c), arg(idx, "i32")], np.take(wide(z), idx, axis=1), c, "exact")
    upd = cnormal([2, 3, 4])
    ref = wide(z).copy()
    np.add.at(ref, (slice(None), idx), wide(upd))
    table.add("scatter_add", "c64", {"axis": 1}, [arg(z, c), arg(idx, "i32"), arg(upd, c)], ref, c, "elementwise")
    table.add("cumsum", "c64", {"axis": 2}, [arg(z, c)], np.cumsum(wide(z), axis=2), c, "accumulate")
    re, im = normal([3, 4], 1.0, "f32"), normal([4], 1.0, "f32")
    table.add("complex", "bcast", {}, [arg(re, "f32"), arg(im, "f32")], wide(re) + 1j * wide(im), c, "exact")
    table.add("real", "c64", {}, [arg(z, c)], wide(z).real, "f32", "exact")
    table.add("imag", "c64", {}, [arg(z, c)], wide(z).imag, "f32", "exact")


def gen_fft(table):
    """The four transforms along every axis of small tensors, at lengths 1, 2, powers of two,
    odd, even non-powers and primes (numpy's pocketfft in f64 as the reference)."""
    c = "c64"
    for kind in ["fft", "ifft"]:
        for shape, axis in [([1], 0), ([2], 0), ([8], 0), ([3, 7], 1), ([12, 2], 0), ([2, 17, 3], 1), ([2, 3, 16], 2)]:
            z = cnormal(shape)
            fn = np.fft.fft if kind == "fft" else np.fft.ifft
            table.add("fft", f"{kind}_{shape[axis]}", {"kind": kind, "axis": axis, "n": shape[axis]},
                      [arg(z, c)], fn(wide(z), axis=axis), c, "accumulate")
    for shape, axis in [([1], 0), ([2], 0), ([9], 0), ([4, 10], 1), ([13, 3], 0), ([2, 3, 16], 2)]:
        x = normal(shape, 1.0, "f32")
        n = shape[axis]
        table.add("fft", f"rfft_{n}", {"kind": "rfft", "axis": axis, "n": n},
                  [arg(x, "f32")], np.fft.rfft(wide(x), axis=axis), c, "accumulate")
    for shape, axis, n in [([1], 0, 1), ([2], 0, 2), ([5], 0, 8), ([5], 0, 9), ([3, 6], 1, 11), ([7, 2], 0, 12), ([2, 9, 3], 1, 17)]:
        z = cnormal(shape)
        table.add("fft", f"irfft_{n}", {"kind": "irfft", "axis": axis, "n": n},
                  [arg(z, c)], np.fft.irfft(wide(z), n=n, axis=axis), "f32", "accumulate")


# ---------------------------------------------------------------------------
# Int8 integer ops: expected outputs from TFLite's interpreter
# ---------------------------------------------------------------------------
#
# qlinear, qconv2d, qadd and qpool are checked against TFLite itself, not against a
# re-implementation of its arithmetic: each case is written here as an int8 .tflite model
# (a flatbuffer packed with the schema classes that ai-edge-litert ships) holding the one
# TFLite op the case is, and run by ai-edge-litert's interpreter (LiteRT 2.3.0, pinned in
# scripts/setup-pyenv.sh) with TFLite's reference kernels (OpResolverType.BUILTIN_REF, one
# thread, no delegate); the interpreter's output is the expected value.
#
#   qlinear -> FULLY_CONNECTED            qadd  -> ADD
#   qconv2d -> CONV_2D (NHWC, OHWI; an explicit padding that is not TFLite's SAME goes
#              through PAD, which fills with the input's zero point)
#   qpool   -> MAX_POOL_2D / AVERAGE_POOL_2D (NHWC; a padding that is TFLite's SAME only
#              when mirrored along an axis runs on the input mirrored along it)
#
# RLX's ops take each requantization as a (multiplier, shift) pair; TFLite derives its pair
# from the float32 scales of the model (QuantizeMultiplier of in_scale * w_scale / out_scale
# for FULLY_CONNECTED and CONV_2D, of the ADD ratios for ADD). So the scales of each model are
# chosen (find_product_scales, find_add_scales) so that the real multiplier TFLite computes
# from them is nearest to the case's pair, at least 1/16 of a Q31 step away from halfway:
# TFLite rounds it to that pair whatever its tie rule. A per-output-channel pair needs its own
# input scale, so FULLY_CONNECTED and CONV_2D run one model per output channel. Pools carry no
# scale.
#
# The operands themselves (int8 tensors, biases, the (multiplier, shift) pairs drawn from real
# factors over four decades) are drawn as before. Every case has a TFLite op, so none is left out.
#
# The interpreter's default setup (the XNNPACK delegate, which takes all these ops but
# AVERAGE_POOL_2D) gives the same values. TFLite's optimized kernels without a delegate
# (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES) differ by one on two values of
# qconv2d_wide, halfway cases after the first rounding (-24.5, -74.5) that they round up where
# the reference kernels round away from zero; the reference kernels define the golden.


def draw_multiplier(r):
    """A (multiplier, shift) operand for the real factor r: r's frexp mantissa in Q31 (rounded
    half up) and its exponent. Only draws operands; the expected values come from TFLite."""
    q, e = math.frexp(r)
    m = math.floor(q * 2**31 + 0.5)
    if m == 2**31:
        m, e = m // 2, e + 1
    return m, e


def qparams(rng, n, lo=1e-4, hi=2.0):
    """Per-channel (bias, multiplier, shift) drawn from real factors over [lo, hi] (log-uniform)."""
    factors = np.exp(rng.uniform(np.log(lo), np.log(hi), size=n))
    ms = [draw_multiplier(float(f)) for f in factors]
    bias = rng.integers(-3000, 3000, size=n).astype(np.int32)
    return bias, np.asarray([m for m, _ in ms], np.int32), np.asarray([s for _, s in ms], np.int32)


PAIR_TOL = 7 / 16  # how far (in Q31 steps) a real multiplier may lie from its pair


def near_pair(r, m, s, tol=PAIR_TOL):
    """True if the double r is within `tol` Q31 steps of m * 2^(s - 31), exponent included."""
    q, e = math.frexp(r)
    return e == s and abs(q * 2**31 - m) <= tol


def find_product_scales(m, s):
    """float32 (input, weight) scales whose product (exact in double) is near m * 2^(s - 31)
    (near_pair); the output scale is 1, the bias scale their product."""
    target = m * 2.0 ** (s - 31)
    a = (1.0 + np.arange(1, 1 << 16) * 2.0**-23).astype(np.float32)  # input scales in (1, 1.008)
    b = (target / a.astype(np.float64)).astype(np.float32)
    err = np.abs(a.astype(np.float64) * b.astype(np.float64) * 2.0 ** (31 - s) - m)
    k = int(np.flatnonzero(err <= PAIR_TOL)[0])
    sa, sw = float(a[k]), float(b[k])
    assert near_pair(sa * sw, m, s)
    return sa, sw


def find_add_scales(scales, pairs):
    """float32 (a, b, out) scales near `scales` for which TFLite's int8 ADD multipliers (a and b
    over twice the larger input scale, twice that over 2^20 times the output scale) are each
    near their pair in `pairs` (a, b, out; near_pair). Walks the larger input scale over float32
    neighbours of its value, nearest first."""
    big = int(np.argmax(scales[:2]))
    small = 1 - big
    (ms, ss), (mo, so) = pairs[small], pairs[2]
    steps = np.arange(1, 1 << 21) // 2 * np.where(np.arange(1, 1 << 21) % 2 == 0, 1, -1)
    big32 = (np.float32(scales[big]).view(np.int32) + steps.astype(np.int32)).view(np.float32)
    twice = 2.0 * big32.astype(np.float64)
    small32 = (twice * (ms * 2.0 ** (ss - 31))).astype(np.float32)
    out32 = (twice / (2.0**20 * (mo * 2.0 ** (so - 31)))).astype(np.float32)
    err_small = np.abs(small32.astype(np.float64) / twice * 2.0 ** (31 - ss) - ms)
    err_out = np.abs(twice / (2.0**20 * out32.astype(np.float64)) * 2.0 ** (31 - so) - mo)
    k = int(np.flatnonzero((err_small <= PAIR_TOL) & (err_out <= PAIR_TOL))[0])
    s32 = [0.0, 0.0, float(out32[k])]
    s32[big], s32[small] = float(big32[k]), float(small32[k])
    tw = 2.0 * max(s32[0], s32[1])
    for r, (m, s) in zip([s32[0] / tw, s32[1] / tw, tw / (2.0**20 * s32[2])], pairs):
        assert near_pair(r, m, s), (r, m, s)
    return s32


TFL_TYPE = {"i8": tfl.TensorType.INT8, "i32": tfl.TensorType.INT32}


class TfliteModel:
    """One subgraph of builtin ops, packed as a .tflite flatbuffer and run by the interpreter."""

    def __init__(self):
        self.tensors, self.buffers, self.operators, self.codes = [], [tfl.BufferT()], [], []

    def tensor(self, shape, dtype, scale=None, zero_point=0, data=None):
        t = tfl.TensorT()
        t.shape, t.type, t.name, t.buffer = list(shape), TFL_TYPE[dtype], f"t{len(self.tensors)}", 0
        if data is not None:
            buf = tfl.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data, NP_DTYPE[dtype]).tobytes(), np.uint8)
            self.buffers.append(buf)
            t.buffer = len(self.buffers) - 1
        if scale is not None:
            t.quantization = tfl.QuantizationParametersT()
            t.quantization.scale, t.quantization.zeroPoint = [float(scale)], [int(zero_point)]
        self.tensors.append(t)
        return len(self.tensors) - 1

    def op(self, code, version, inputs, outputs, options_type, options):
        if (code, version) not in self.codes:
            self.codes.append((code, version))
        o = tfl.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = self.codes.index((code, version)), inputs, outputs
        o.builtinOptionsType, o.builtinOptions = options_type, options
        self.operators.append(o)

    def run(self, x_index, x, out_index):
        sub = tfl.SubGraphT()
        sub.tensors, sub.inputs, sub.outputs, sub.operators = self.tensors, [x_index], [out_index], self.operators
        model = tfl.ModelT()
        model.version, model.subgraphs, model.buffers = 3, [sub], self.buffers
        model.operatorCodes = []
        for code, version in self.codes:
            c = tfl.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode, c.version = code, min(code, 127), version
            model.operatorCodes.append(c)
        builder = flatbuffers.Builder(1024)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        interp = Interpreter(model_content=bytes(builder.Output()), num_threads=1,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        return interp.get_tensor(interp.get_output_details()[0]["index"]).copy()


def same_padding(size, k, stride):
    """TFLite's SAME padding (before, after) of one spatial axis."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return [total // 2, total - total // 2]


def used_padding(size, k, stride, pad):
    """An explicit padding less the trailing rows or columns no window reaches."""
    out = (size + pad[0] + pad[1] - k) // stride + 1
    return [pad[0], max((out - 1) * stride + k - size - pad[0], 0)]


def activation(relu):
    return tfl.ActivationFunctionType.RELU if relu else tfl.ActivationFunctionType.NONE


def tflite_fully_connected(x, w, bias, m, s, xzp, ozp, relu):
    """qlinear: FULLY_CONNECTED over x reshaped to [rows, K], one model per output channel."""
    k, n = x.shape[-1], w.shape[0]
    x2 = x.reshape(-1, k)
    y = np.zeros([x2.shape[0], n], np.int8)
    for c in range(n):
        sx, sw = find_product_scales(int(m[c]), int(s[c]))
        g = TfliteModel()
        xi = g.tensor(x2.shape, "i8", sx, xzp)
        wi = g.tensor([1, k], "i8", sw, 0, w[c:c + 1])
        bi = g.tensor([1], "i32", np.float32(sx * sw), 0, bias[c:c + 1])
        yi = g.tensor([x2.shape[0], 1], "i8", 1.0, ozp)
        opts = tfl.FullyConnectedOptionsT()
        opts.fusedActivationFunction = activation(relu)
        g.op(tfl.BuiltinOperator.FULLY_CONNECTED, 4, [xi, wi, bi], [yi], tfl.BuiltinOptions.FullyConnectedOptions, opts)
        y[:, c] = g.run(xi, x2, yi)[:, 0]
    return y.reshape(*x.shape[:-1], n)


def tflite_conv2d(x, w, bias, m, s, stride, pad, xzp, ozp, relu):
    """qconv2d: CONV_2D on NHWC / OHWI, one model per output channel; a padding other than
    SAME goes through PAD (filled with the input's zero point) and a VALID convolution."""
    xn = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    b, h, wd, c = xn.shape
    o, _, kh, kw = w.shape
    same = pad == [same_padding(h, kh, stride[0]), same_padding(wd, kw, stride[1])]
    ho = (h + pad[0][0] + pad[0][1] - kh) // stride[0] + 1
    wo = (wd + pad[1][0] + pad[1][1] - kw) // stride[1] + 1
    y = np.zeros([b, ho, wo, o], np.int8)
    for oc in range(o):
        sx, sw = find_product_scales(int(m[oc]), int(s[oc]))
        g = TfliteModel()
        xi = g.tensor(xn.shape, "i8", sx, xzp)
        ci = xi
        if not same:
            paddings = np.asarray([[0, 0], pad[0], pad[1], [0, 0]], np.int32)
            pi = g.tensor([4, 2], "i32", data=paddings)
            ci = g.tensor([b, h + sum(pad[0]), wd + sum(pad[1]), c], "i8", sx, xzp)
            g.op(tfl.BuiltinOperator.PAD, 2, [xi, pi], [ci], tfl.BuiltinOptions.PadOptions, tfl.PadOptionsT())
        wi = g.tensor([1, kh, kw, c], "i8", sw, 0, w[oc:oc + 1].transpose(0, 2, 3, 1))
        bi = g.tensor([1], "i32", np.float32(sx * sw), 0, bias[oc:oc + 1])
        yi = g.tensor([b, ho, wo, 1], "i8", 1.0, ozp)
        opts = tfl.Conv2DOptionsT()
        opts.padding = tfl.Padding.SAME if same else tfl.Padding.VALID
        opts.strideH, opts.strideW = stride
        opts.dilationHFactor = opts.dilationWFactor = 1
        opts.fusedActivationFunction = activation(relu)
        g.op(tfl.BuiltinOperator.CONV_2D, 3, [ci, wi, bi], [yi], tfl.BuiltinOptions.Conv2DOptions, opts)
        y[..., oc] = g.run(xi, xn, yi)[..., 0]
    return y.transpose(0, 3, 1, 2)


def tflite_add(a, b, scales, zero_points, relu):
    """qadd: int8 ADD with float32 scales `scales` (a, b, out) and `zero_points` (a, b, out)."""
    g = TfliteModel()
    ai = g.tensor(a.shape, "i8", scales[0], zero_points[0])
    bi = g.tensor(b.shape, "i8", scales[1], zero_points[1], b)
    yi = g.tensor(a.shape, "i8", scales[2], zero_points[2])
    opts = tfl.AddOptionsT()
    opts.fusedActivationFunction = activation(relu)
    g.op(tfl.BuiltinOperator.ADD, 2, [ai, bi], [yi], tfl.BuiltinOptions.AddOptions, opts)
    return g.run(ai, a, yi)


def tflite_pool(x, kind, kernel, stride, pad):
    """qpool: MAX_POOL_2D / AVERAGE_POOL_2D on NHWC with SAME or VALID padding; an axis whose
    (used) padding is SAME mirrored runs on the input mirrored along it, and the output is
    mirrored back."""
    xn = x.transpose(0, 2, 3, 1)
    b, h, wd, c = xn.shape
    used = [used_padding(n, k, st, p) for n, k, st, p in zip([h, wd], kernel, stride, pad)]
    same = [same_padding(n, k, st) for n, k, st in zip([h, wd], kernel, stride)]
    if used == [[0, 0], [0, 0]]:
        padding, flip = tfl.Padding.VALID, []
    else:
        flip = [axis for axis in range(2) if used[axis] != same[axis]]
        assert all(used[axis][::-1] == same[axis] for axis in flip), (used, same)
        padding = tfl.Padding.SAME
    xn = np.ascontiguousarray(np.flip(xn, [1 + axis for axis in flip]))
    ho = (h + pad[0][0] + pad[0][1] - kernel[0]) // stride[0] + 1
    wo = (wd + pad[1][0] + pad[1][1] - kernel[1]) // stride[1] + 1
    g = TfliteModel()
    xi = g.tensor(xn.shape, "i8", 1.0, 0)
    yi = g.tensor([b, ho, wo, c], "i8", 1.0, 0)
    opts = tfl.Pool2DOptionsT()
    opts.padding = padding
    opts.strideH, opts.strideW = stride
    opts.filterHeight, opts.filterWidth = kernel
    code = tfl.BuiltinOperator.MAX_POOL_2D if kind == "max" else tfl.BuiltinOperator.AVERAGE_POOL_2D
    g.op(code, 2, [xi], [yi], tfl.BuiltinOptions.Pool2DOptions, opts)
    y = np.flip(g.run(xi, xn, yi), [1 + axis for axis in flip])
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def gen_qint(table):
    """qlinear, qconv2d, qadd and qpool, the expected values from TFLite's interpreter (see the
    section comment)."""
    rng = np.random.default_rng(4040)
    i8 = lambda shape: rng.integers(-128, 128, size=shape).astype(np.int8)  # noqa: E731
    for xshape, n, xzp, ozp, relu, tag in [([3, 20], 5, -3, 5, False, "rows"), ([37], 4, -128, -128, True, "relu"),
                                           ([2, 3, 70], 9, 17, 0, False, "rank3")]:
        x, k = i8(xshape), xshape[-1]
        w = i8([n, k])
        bias, m, s = qparams(rng, n, 1e-4, 0.05 if relu else 0.02)
        lo, hi = (ozp if relu else -128), 127
        y = tflite_fully_connected(x, w, bias, m, s, xzp, ozp, relu)
        table.add("qlinear", tag, {"x_zero_point": xzp, "out_zero_point": ozp, "lo": lo, "hi": hi},
                  [arg(x, "i8"), arg(w, "i8"), arg(bias, "i32"), arg(m, "i32"), arg(s, "i32")], y, "i8", "exact")
    for xshape, o, kh, kw, stride, pad, xzp, ozp, relu, tag in [
        ([2, 3, 6, 5], 4, 3, 3, [1, 1], [[1, 1], [1, 1]], -7, 2, False, "same"),
        ([1, 2, 7, 6], 3, 2, 3, [2, 1], [[0, 1], [2, 0]], 30, -128, True, "strided"),
        ([2, 2, 6, 7], 17, 2, 5, [1, 2], [[1, 0], [2, 2]], 0, 9, False, "wide"),
    ]:
        x = i8(xshape)
        w = i8([o, xshape[1], kh, kw])
        bias, m, s = qparams(rng, o, 1e-4, 0.01)
        lo, hi = (ozp if relu else -128), 127
        y = tflite_conv2d(x, w, bias, m, s, stride, pad, xzp, ozp, relu)
        table.add("qconv2d", tag, {"stride": stride, "padding": pad, "x_zero_point": xzp, "out_zero_point": ozp,
                                   "lo": lo, "hi": hi},
                  [arg(x, "i8"), arg(w, "i8"), arg(bias, "i32"), arg(m, "i32"), arg(s, "i32")], y, "i8", "exact")
    for sa, sb, so, azp, bzp, ozp, relu, tag in [(0.05, 0.02, 0.06, -3, 10, -1, False, "plain"),
                                                 (0.01, 0.03, 0.025, 100, -128, -128, True, "relu")]:
        a, bb = i8([2, 3, 4]), i8([2, 3, 4])
        a.reshape(-1)[:3] = [127, -128, azp]
        bb.reshape(-1)[:3] = [127, -128, bzp]
        # TFLite's int8 ADD: each input over twice the larger input scale, twice that over
        # 2^20 times the output scale (the operands are shifted left by 20 bits).
        twice = 2 * max(sa, sb)
        am, ash = draw_multiplier(sa / twice)
        bm, bsh = draw_multiplier(sb / twice)
        om, osh = draw_multiplier(twice / (2**20 * so))
        lo, hi = (ozp if relu else -128), 127
        scales = find_add_scales([sa, sb, so], [(am, ash), (bm, bsh), (om, osh)])
        y = tflite_add(a, bb, scales, [azp, bzp, ozp], relu)
        attrs = {"a_zero_point": azp, "b_zero_point": bzp, "a_multiplier": am, "a_shift": ash,
                 "b_multiplier": bm, "b_shift": bsh, "out_multiplier": om, "out_shift": osh,
                 "out_zero_point": ozp, "lo": lo, "hi": hi}
        table.add("qadd", tag, attrs, [arg(a, "i8"), arg(bb, "i8")], y, "i8", "exact")
    for kind in ["max", "mean"]:
        for xshape, kernel, stride, pad, tag in [([2, 3, 5, 6], [2, 2], [2, 2], [[0, 1], [0, 0]], "2x2"),
                                                 ([1, 2, 4, 4], [3, 3], [1, 2], [[1, 1], [1, 1]], "3x3pad")]:
            x = i8(xshape)
            y = tflite_pool(x, kind, kernel, stride, pad)
            table.add("qpool", f"{kind}_{tag}", {"kind": kind, "kernel": kernel, "stride": stride, "padding": pad},
                      [arg(x, "i8")], y, "i8", "exact")


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

GENERATORS = [
    gen_binary, gen_compare, gen_where, gen_unary, gen_cast, gen_matmul,
    gen_dot_general, gen_reduce, gen_softmax, gen_norms, gen_reshape,
    gen_transpose, gen_narrow, gen_concat, gen_expand, gen_gather,
    gen_scatter_add, gen_cumsum, gen_topk, gen_attention, gen_rope, gen_conv,
    gen_pool, gen_unary_grads, gen_gguf, gen_kv, gen_custom,
    gen_affine_quant, gen_fused, gen_paged, gen_narrow_ints, gen_blocks, gen_if, gen_loops, gen_quant_linear,
    gen_selective_scan, gen_complex, gen_fft, gen_qint,
]


def main():
    table = CaseTable()
    for gen in GENERATORS:
        gen(table)

    names = [c["name"] for c in table.cases]
    assert len(names) == len(set(names)), "duplicate case names"

    header = {"generator": "gen_ops.py", "numpy": np.__version__, "jax": jax.__version__}
    # One case per line keeps diffs of the golden file reviewable.
    lines = [json.dumps(c, allow_nan=False, separators=(",", ":")) for c in table.cases]
    text = json.dumps(header, allow_nan=False)[:-1] + ', "cases": [\n'
    text += ",\n".join(lines) + "\n]}\n"
    json.loads(text)  # sanity check: the file is valid JSON
    OUT_PATH.write_text(text)

    width = max(len(op) for op in table.per_op)
    for op, count in sorted(table.per_op.items()):
        print(f"  {op:<{width}}  {count}")
    print(f"wrote {len(table.cases)} cases to {OUT_PATH} ({len(text) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
