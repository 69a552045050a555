#!/usr/bin/env python3
"""numpy (OpenBLAS) reference timings for the rlx-bench comparison binary.

Usage:
    numpy_ref.py --op gemm    --threads T --reps R --size N
    numpy_ref.py --op add     --threads T --reps R --elems E
    numpy_ref.py --op softmax --threads T --reps R --rows R --cols C
    numpy_ref.py --op fft     --threads T --reps R --kind K --shape N[xM] --lib numpy|scipy
    numpy_ref.py --op linalg  --threads T --reps R --kind solve|cholesky|qr_r|svd_s --size N
    numpy_ref.py --op spmm    --threads T --reps R --size N --per-row P --cols K

Prints exactly one JSON line on stdout. Any error goes to stderr and the
process exits non-zero (2 for bad arguments, 1 for anything else).

The BLAS thread count is fixed through OPENBLAS_NUM_THREADS / OMP_NUM_THREADS /
MKL_NUM_THREADS *before* numpy is imported; threadpoolctl (optional) is then
used as a second guard and to report which BLAS build and kernel are loaded.
Without threadpoolctl the same facts are read from OpenBLAS through ctypes
("blas.source" says which); "blas" is null only if neither works.
The caller is expected to unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE; their
values as seen here are echoed under "env" so a stray setting is visible.
"""

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time

WARMUP = 2
SEED = 0


def positive_int(text):
    """Accept '1000', '1e7', '10_000'; reject zero, negatives and fractions."""
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}")
        if not f.is_integer():
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
        value = int(f)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--op", required=True, choices=["gemm", "add", "softmax", "fft", "linalg", "spmm"])
    p.add_argument("--threads", required=True, type=positive_int)
    p.add_argument("--reps", required=True, type=positive_int)
    p.add_argument("--size", type=positive_int, help="gemm: square matrix size N")
    p.add_argument("--rows", type=positive_int, help="softmax: rows")
    p.add_argument("--cols", type=positive_int, help="softmax: cols (reduced axis)")
    p.add_argument("--elems", type=positive_int, help="add: element count")
    p.add_argument("--kind", choices=["fft", "rfft", "fft2", "solve", "cholesky", "qr_r", "svd_s"],
                   help="fft: which transform; linalg: which factorization")
    p.add_argument("--shape", help="fft: N (1-D) or NxM (fft2)")
    p.add_argument("--lib", choices=["numpy", "scipy"], help="fft: numpy.fft or scipy.fft")
    p.add_argument("--per-row", type=positive_int, help="spmm: nonzeros per row")
    args = p.parse_args(argv)

    if args.op == "spmm":
        if args.size is None or args.per_row is None or args.cols is None:
            p.error("--op spmm requires --size, --per-row and --cols")
        return args
    if args.op == "linalg":
        if args.kind not in LINALG_FLOPS or args.size is None:
            p.error("--op linalg requires --kind solve|cholesky|qr_r|svd_s and --size")
        return args
    if args.op == "fft":
        missing = [f"--{n}" for n in ("kind", "shape", "lib") if getattr(args, n) is None]
        if missing:
            p.error(f"--op fft requires {' '.join(missing)}")
        return args
    if any(getattr(args, n) is not None for n in ("kind", "shape", "lib")):
        p.error(f"--op {args.op} does not take --kind, --shape or --lib")
    needed = {"gemm": ["size"], "add": ["elems"], "softmax": ["rows", "cols"]}[args.op]
    missing = [f"--{n}" for n in needed if getattr(args, n) is None]
    if missing:
        p.error(f"--op {args.op} requires {' '.join(missing)}")
    extra = [
        f"--{n}"
        for n in ("size", "rows", "cols", "elems")
        if n not in needed and getattr(args, n) is not None
    ]
    if extra:
        p.error(f"--op {args.op} does not take {' '.join(extra)}")
    return args


def pin_threads(threads):
    # Must run before the first `import numpy`: OpenBLAS sizes its pool at load.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


BLAS_KEYS = ("internal_api", "version", "architecture", "num_threads",
             "threading_layer", "prefix", "filepath")


def _tpc_blas_entry():
    """threadpoolctl's BLAS entry; None if threadpoolctl or BLAS is missing."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            out = {k: lib.get(k) for k in BLAS_KEYS}
            out["source"] = "threadpoolctl"
            out["config"] = None
            return out
    return None


class _OpenBLASFallback:
    """Minimal ctypes access to the OpenBLAS numpy has loaded (Linux only).

    Used when threadpoolctl is not installed. numpy's wheels bundle
    scipy-openblas, whose exported names carry a "scipy_" prefix and a "64_"
    suffix (e.g. scipy_openblas_get_corename64_); plain builds have neither.
    """

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.path = None
        self.lib = None
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "/" in line}
        except OSError:
            return
        for path in sorted(paths):
            if "openblas" in os.path.basename(path).lower():
                try:
                    self.lib = ctypes.CDLL(path)  # already mapped: same handle
                    self.path = path
                    break
                except OSError:
                    continue

    def _fn(self, base, restype):
        if self.lib is None:
            return None
        for prefix in ("", "scipy_"):
            for suffix in ("", "64_"):
                fn = getattr(self.lib, prefix + base + suffix, None)
                if fn is not None:
                    fn.restype = restype
                    return fn
        return None

    def set_num_threads(self, n):
        fn = self._fn("openblas_set_num_threads", None)
        if fn is not None:
            fn.argtypes = [self.ctypes.c_int]
            fn(n)

    def info(self):
        if self.lib is None:
            return None
        c = self.ctypes
        get = lambda base, t: self._fn(base, t)  # noqa: E731
        corename, config, nthreads = (
            get("openblas_get_corename", c.c_char_p),
            get("openblas_get_config", c.c_char_p),
            get("openblas_get_num_threads", c.c_int),
        )
        config_s = config().decode(errors="replace") if config else None
        version = None
        if config_s and config_s.startswith("OpenBLAS "):
            version = config_s.split()[1]
        m = re.match(r"(lib\w*?openblas)", os.path.basename(self.path))
        return {
            "internal_api": "openblas",
            "version": version,
            "architecture": corename().decode(errors="replace") if corename else None,
            "num_threads": nthreads() if nthreads else None,
            "threading_layer": None,
            "prefix": m.group(1) if m else None,
            "filepath": self.path,
            "source": "ctypes",
            "config": config_s,
        }


def blas_info():
    """Which BLAS numpy uses: threadpoolctl's view, else ctypes, else None."""
    info = _tpc_blas_entry()
    if info is None:
        try:
            info = _OpenBLASFallback().info()
        except Exception:  # best-effort reporting only
            info = None
    return info


class ThreadLimit:
    """Second guard on the BLAS thread count while timing.

    threadpoolctl.threadpool_limits(T, "blas") if available, otherwise
    openblas_set_num_threads(T) through ctypes (best effort).
    """

    def __init__(self, threads):
        self.threads = threads
        self.ctx = None

    def __enter__(self):
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            try:
                _OpenBLASFallback().set_num_threads(self.threads)
            except Exception:
                pass
            return self
        self.ctx = threadpool_limits(limits=self.threads, user_api="blas")
        self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self.ctx is not None:
            return self.ctx.__exit__(*exc)
        return False


def time_reps(fn, reps):
    for _ in range(WARMUP):
        fn()
    times = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


def setup_gemm(np, args):
    n = args.size
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)

    def run():
        np.matmul(a, b, out=c)

    def check():
        # One row against a float64 reference.
        ref = a[0].astype(np.float64) @ b.astype(np.float64)
        tol = 1e-3 * np.sqrt(n) * (1.0 + np.abs(ref).max())
        if not np.all(np.abs(c[0] - ref) <= tol):
            raise RuntimeError("gemm result check failed")

    flops = 2.0 * n ** 3
    return run, check, "gflops", lambda t: flops / t / 1e9, {"size": n}


def setup_add(np, args):
    e = args.elems
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal(e, dtype=np.float32)
    b = rng.standard_normal(e, dtype=np.float32)
    c = np.empty(e, dtype=np.float32)

    def run():
        np.add(a, b, out=c)

    def check():
        k = min(e, 4096)
        if not np.array_equal(c[:k], a[:k] + b[:k]) or c[-1] != a[-1] + b[-1]:
            raise RuntimeError("add result check failed")

    nbytes = 3.0 * 4 * e
    return run, check, "gb_s", lambda t: nbytes / t / 1e9, {"elems": e}


def setup_softmax(np, args):
    rows, cols = args.rows, args.cols
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    y = np.empty_like(x)
    red = np.empty((rows, 1), dtype=np.float32)  # row max, then row sum

    def run():
        np.max(x, axis=1, keepdims=True, out=red)
        np.subtract(x, red, out=y)
        np.exp(y, out=y)
        np.sum(y, axis=1, keepdims=True, out=red)
        # Divide by the row sum as rows reciprocals + one multiply pass:
        # ~7% faster than np.divide over the full [rows, cols] array.
        np.reciprocal(red, out=red)
        np.multiply(y, red, out=y)

    def check():
        k = min(rows, 64)
        xs = x[:k].astype(np.float64)
        ref = np.exp(xs - xs.max(axis=1, keepdims=True))
        ref /= ref.sum(axis=1, keepdims=True)
        if not np.allclose(y[:k], ref, rtol=1e-4, atol=1e-6):
            raise RuntimeError("softmax result check failed")

    nbytes = 2.0 * 4 * rows * cols
    return run, check, "gb_s", lambda t: nbytes / t / 1e9, {"rows": rows, "cols": cols}


# Nominal flop counts of each factorization of an n x n matrix (the usual leading terms), so
# that a rate is comparable across sizes; the ratio of two rates is the ratio of their times.
LINALG_FLOPS = {
    "solve": lambda n: 2.0 / 3.0 * n ** 3,       # LU (one right-hand side)
    "cholesky": lambda n: 1.0 / 3.0 * n ** 3,
    "qr_r": lambda n: 4.0 / 3.0 * n ** 3,        # Householder, R only
    "svd_s": lambda n: 8.0 / 3.0 * n ** 3,       # bidiagonalization, singular values only
}


def setup_linalg(np, args):
    """numpy.linalg (LAPACK from numpy's OpenBLAS) in float64 on an n x n matrix: solve with one
    right-hand side, cholesky of a symmetric positive definite matrix, qr(mode="r"),
    svd(compute_uv=False)."""
    n = args.size
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((n, n))
    if args.kind == "cholesky":
        a = a @ a.T + n * np.eye(n)
    b = rng.standard_normal((n, 1))
    fn = {
        "solve": lambda: np.linalg.solve(a, b),
        "cholesky": lambda: np.linalg.cholesky(a),
        "qr_r": lambda: np.linalg.qr(a, mode="r"),
        "svd_s": lambda: np.linalg.svd(a, compute_uv=False),
    }[args.kind]
    out = {}

    def run():
        out["y"] = fn()

    def check():
        if args.kind == "solve" and not np.allclose(a @ out["y"], b, atol=1e-6 * n):
            raise RuntimeError("solve result check failed")

    flops = LINALG_FLOPS[args.kind](n)
    return run, check, "gflops", lambda t: flops / t / 1e9, {
        "kind": args.kind, "size": n, "dtype": "float64"}


def setup_spmm(np, args):
    """scipy.sparse: an n x n float32 CSR matrix with `per_row` nonzeros in each row (random
    columns) times a dense float32 vector (`cols` = 1) or [n, cols] matrix. scipy's sparse
    products run on one thread."""
    import scipy
    import scipy.sparse as sp

    n, per, k = args.size, args.per_row, args.cols
    rng = np.random.default_rng(SEED)
    indices = rng.integers(0, n, size=n * per).astype(np.int32)
    indptr = np.arange(0, n * per + 1, per, dtype=np.int32)
    data = rng.standard_normal(n * per, dtype=np.float32)
    a = sp.csr_matrix((data, indices, indptr), shape=(n, n))
    x = rng.standard_normal(n if k == 1 else (n, k), dtype=np.float32)
    out = {}

    def run():
        out["y"] = a @ x

    def check():
        if out["y"].dtype != np.float32:
            raise RuntimeError(f"spmm computed in {out['y'].dtype}")

    flops = 2.0 * n * per * k
    return run, check, "gflops", lambda t: flops / t / 1e9, {
        "size": n, "per_row": per, "k": k, "scipy": scipy.__version__}


def setup_fft(np, args):
    """One transform of complex64 (float32 for rfft) data, numpy's pocketfft (one thread) or
    scipy.fft with `workers` = the thread count; GFLOP/s counts 5 N log2 N per complex
    transform of N points (2.5 N log2 N for a real one), the usual FFT convention."""
    import math

    dims = [positive_int(d) for d in args.shape.split("x")]
    rng = np.random.default_rng(SEED)
    if args.kind == "rfft":
        x = rng.standard_normal(dims, dtype=np.float32)
    else:
        x = (rng.standard_normal(dims) + 1j * rng.standard_normal(dims)).astype(np.complex64)
    if args.lib == "scipy":
        import scipy
        import scipy.fft as sfft

        fn = {"fft": sfft.fft, "rfft": sfft.rfft, "fft2": sfft.fft2}[args.kind]
        kw = {"workers": args.threads}
        version = scipy.__version__
    else:
        fn = {"fft": np.fft.fft, "rfft": np.fft.rfft, "fft2": np.fft.fft2}[args.kind]
        kw = {}
        version = np.__version__
    out = {}

    def run():
        out["y"] = fn(x, **kw)

    def check():
        ref = np.fft.fft(x[:4096].astype(np.complex128)) if args.kind == "fft" and dims[0] <= 4096 else None
        if out["y"].dtype != np.complex64:
            raise RuntimeError(f"fft computed in {out['y'].dtype}, not complex64")
        if ref is not None and not np.allclose(out["y"], ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max()):
            raise RuntimeError("fft result check failed")

    n = math.prod(dims)
    flops = (2.5 if args.kind == "rfft" else 5.0) * n * math.log2(n)
    return run, check, "gflops", lambda t: flops / t / 1e9, {
        "kind": args.kind, "shape": dims, "lib": args.lib, "lib_version": version}


def main(argv):
    args = parse_args(argv)
    pin_threads(args.threads)

    import numpy as np  # noqa: E402  (deliberately after pin_threads)

    setup = {"gemm": setup_gemm, "add": setup_add, "softmax": setup_softmax,
             "fft": setup_fft, "linalg": setup_linalg, "spmm": setup_spmm}[args.op]
    run, check, metric, to_metric, dims = setup(np, args)

    with ThreadLimit(args.threads):
        blas = blas_info()  # num_threads as in force while timing
        times = time_reps(run, args.reps)
    check()

    values = [to_metric(t) for t in times]
    out = {"op": args.op, "threads": args.threads}
    dtype = dims.pop("dtype", "float32")
    out.update(dims)
    out.update({
        "reps": args.reps,
        "warmup": WARMUP,
        "dtype": dtype,
        "times_s": times,
        "median_s": statistics.median(times),
        "metric": metric,
        "values": values,
        "median": statistics.median(values),
        "numpy": np.__version__,
        "blas": blas,
        "env": {k: os.environ.get(k) for k in (
            "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
    })
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except BaseException as exc:  # report anything else as one stderr line
        print(f"numpy_ref.py: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
