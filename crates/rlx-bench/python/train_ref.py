#!/usr/bin/env python3
"""JAX / PyTorch reference timings of one training step for rlx-bench.

Usage:
    train_ref.py --framework jax|torch --model mlp|gpt --threads T --steps N
                 [--warmup W]

One step = forward + backward + AdamW update, on a fixed batch. Prints exactly
one JSON line on stdout:

    {"framework", "model", "threads", "steps", "warmup", "times_s",
     "median_s", "loss_first", "loss_last", "losses", "cpu_util",
     "compile_s", "n_params", "threading", "versions"}

  times_s    wall seconds (time.perf_counter) of each of the N steps that
             follow the W warmup steps; JAX results are block_until_ready()'d
             inside the timed region, torch eager is synchronous on CPU.
  loss_first loss of the very first step (initial parameters, warmup included)
  loss_last  loss of the last timed step (computed before its update)
  losses     every step's loss, warmup steps first
  cpu_util   process CPU seconds / wall seconds over the timed steps: ~1 when
             one core does the work, up to T when T threads are busy.
  compile_s  JAX only: ahead-of-time jit compile time (not in times_s);
             null for torch.

Any error goes to stderr and the process exits non-zero (2 for bad arguments,
1 for anything else).

Models (identical to the RLX ones, so the FLOPs match):
  mlp  x[64,256] -> Linear(256,512)+b -> GELU(tanh) -> Linear(512,512)+b
       -> GELU(tanh) -> Linear(512,10)+b -> softmax cross-entropy (mean).
  gpt  char GPT: vocab 60, context 64, width 128, 4 heads of 32, 2 pre-norm
       layers (RMSNorm eps 1e-5 with weight, no biases anywhere), fused Wqkv
       [D,3D], explicit causal softmax attention (scale 32^-0.5, no fused
       SDPA kernel), Wo [D,D], MLP W1 [D,4D] / GELU(tanh) / W2 [4D,D], final
       RMSNorm, untied Wout [D,60]; batch 16; next-token cross-entropy (mean).
Optimizer: AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, decoupled weight
decay 0.01 on every parameter, constant lr, no clipping. JAX: hand-written
update inside the jitted step (params, m, v donated). torch:
torch.optim.AdamW with default implementation selection.

Parameters and data are drawn once with numpy from fixed seeds and loaded
into either framework, so both start from bit-identical values and their
loss_first agree to float32 rounding. Weights are stored [in, out] for JAX
(x @ W) and transposed to torch's [out, in] layout for F.linear.

Threads (set before the framework is imported):
  torch: OMP_NUM_THREADS = MKL_NUM_THREADS = T, then torch.set_num_threads(T)
         and torch.set_num_interop_threads(1).
  jax:   T == 1: XLA_FLAGS gets
             --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1
         (appended to any XLA_FLAGS already set). On jax 0.10.2 that alone
         does NOT limit these models to one core: XLA's CPU client sizes its
         worker pool from the process's CPU affinity mask, and with 2 CPUs
         allowed the step still ran on two busy tf_XLAEigen threads
         (cpu_util ~1.8). So, for any T, if more than T CPUs are allowed the
         script narrows its own affinity to the first T of them
         (os.sched_setaffinity) before importing jax. JAX has no API for an
         exact thread count; the mask is what bounds it.
  The caller is expected to pin the process with taskset as well (then the
  narrowing is a no-op); the affinity on entry and the one in force are
  echoed under "threading".
"""

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time

SEED = 0
DEFAULT_WARMUP = 3

# AdamW hyper-parameters.
LR = 1e-3
BETA1 = 0.9
BETA2 = 0.999
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.01

# mlp
MLP_BATCH, MLP_IN, MLP_HIDDEN, MLP_CLASSES = 64, 256, 512, 10

# gpt
GPT_VOCAB, GPT_CTX, GPT_WIDTH, GPT_HEADS, GPT_LAYERS, GPT_BATCH = 60, 64, 128, 4, 2, 16
GPT_HEAD_DIM = GPT_WIDTH // GPT_HEADS
RMS_EPS = 1e-5
GPT_INIT_STD = 0.02


def nonneg_int(text, minimum):
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}: {text!r}")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--framework", required=True, choices=["jax", "torch"])
    p.add_argument("--model", required=True, choices=["mlp", "gpt"])
    p.add_argument("--threads", required=True, type=lambda s: nonneg_int(s, 1))
    p.add_argument("--steps", required=True, type=lambda s: nonneg_int(s, 1))
    p.add_argument("--warmup", default=DEFAULT_WARMUP, type=lambda s: nonneg_int(s, 0),
                   help=f"untimed steps before the timed ones (default {DEFAULT_WARMUP})")
    return p.parse_args(argv)


# ---------------------------------------------------------------- thread setup

JAX_ONE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def pin_threads(framework, threads):
    """Process-level part of the thread limit; must run before the import.

    Returns the CPU affinity this process had on entry (None if unknown).
    """
    entry = affinity()
    if framework == "torch":
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ["MKL_NUM_THREADS"] = str(threads)
        return entry
    if threads == 1:
        prev = os.environ.get("XLA_FLAGS", "").strip()
        os.environ["XLA_FLAGS"] = (prev + " " + JAX_ONE_THREAD_FLAGS).strip()
    # XLA sizes its CPU pools from the affinity mask at client creation, and
    # in jax 0.10.2 the flags above do not stop a 2-CPU mask from being used
    # by two worker threads. Narrow the mask to the first T allowed CPUs so
    # the limit holds without the caller's taskset (a no-op under it).
    if entry is not None and len(entry) > threads:
        os.sched_setaffinity(0, entry[:threads])
    return entry


def affinity():
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


# ------------------------------------------------------- shared numpy init/data

def init_mlp(np):
    """Params as {name: float32 array}; weights [in, out], torch-default init."""
    rng = np.random.default_rng(SEED)
    dims = [(MLP_IN, MLP_HIDDEN), (MLP_HIDDEN, MLP_HIDDEN), (MLP_HIDDEN, MLP_CLASSES)]
    params = {}
    for i, (fan_in, fan_out) in enumerate(dims):
        bound = 1.0 / np.sqrt(fan_in)
        params[f"w{i}"] = rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
        params[f"b{i}"] = rng.uniform(-bound, bound, (fan_out,)).astype(np.float32)
    return params


def data_mlp(np):
    rng = np.random.default_rng(SEED + 1)
    x = rng.standard_normal((MLP_BATCH, MLP_IN), dtype=np.float32)
    y = rng.integers(0, MLP_CLASSES, (MLP_BATCH,), dtype=np.int64)
    return {"x": x, "y": y}


def init_gpt(np):
    """Params as {name: float32 array}; matrices [in, out], N(0, 0.02)."""
    rng = np.random.default_rng(SEED)
    d = GPT_WIDTH

    def normal(*shape):
        return (GPT_INIT_STD * rng.standard_normal(shape)).astype(np.float32)

    params = {"wte": normal(GPT_VOCAB, d), "wpe": normal(GPT_CTX, d)}
    for l in range(GPT_LAYERS):
        params[f"l{l}.norm1"] = np.ones((d,), np.float32)
        params[f"l{l}.wqkv"] = normal(d, 3 * d)
        params[f"l{l}.wo"] = normal(d, d)
        params[f"l{l}.norm2"] = np.ones((d,), np.float32)
        params[f"l{l}.w1"] = normal(d, 4 * d)
        params[f"l{l}.w2"] = normal(4 * d, d)
    params["norm_f"] = np.ones((d,), np.float32)
    params["wout"] = normal(d, GPT_VOCAB)
    return params


def data_gpt(np):
    """Random characters; inputs are seq[:, :T], targets seq[:, 1:] (flattened)."""
    rng = np.random.default_rng(SEED + 1)
    seq = rng.integers(0, GPT_VOCAB, (GPT_BATCH, GPT_CTX + 1), dtype=np.int64)
    return {"tokens": np.ascontiguousarray(seq[:, :-1]),
            "targets": np.ascontiguousarray(seq[:, 1:]).reshape(-1)}


# ------------------------------------------------------------------------- JAX

def build_jax(model, np):
    import jax
    import jax.numpy as jnp

    def gelu(x):
        return jax.nn.gelu(x, approximate=True)  # tanh approximation

    def cross_entropy(logits, labels):
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
        return -jnp.mean(picked)

    def rms_norm(x, w):
        ms = jnp.mean(x * x, axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(ms + RMS_EPS) * w

    def mlp_loss(p, batch):
        h = gelu(batch["x"] @ p["w0"] + p["b0"])
        h = gelu(h @ p["w1"] + p["b1"])
        return cross_entropy(h @ p["w2"] + p["b2"], batch["y"])

    causal = np.tril(np.ones((GPT_CTX, GPT_CTX), dtype=bool))

    def gpt_loss(p, batch):
        b, t, d, nh, hd = GPT_BATCH, GPT_CTX, GPT_WIDTH, GPT_HEADS, GPT_HEAD_DIM
        x = p["wte"][batch["tokens"]] + p["wpe"]  # [B,T,D]
        for l in range(GPT_LAYERS):
            h = rms_norm(x, p[f"l{l}.norm1"])
            qkv = h @ p[f"l{l}.wqkv"]
            q, k, v = jnp.split(qkv, 3, axis=-1)
            q, k, v = (a.reshape(b, t, nh, hd).transpose(0, 2, 1, 3) for a in (q, k, v))
            att = (q @ k.transpose(0, 1, 3, 2)) * (hd ** -0.5)  # [B,H,T,T]
            att = jnp.where(causal, att, -jnp.inf)
            att = jax.nn.softmax(att, axis=-1)
            y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
            x = x + y @ p[f"l{l}.wo"]
            h = rms_norm(x, p[f"l{l}.norm2"])
            x = x + gelu(h @ p[f"l{l}.w1"]) @ p[f"l{l}.w2"]
        x = rms_norm(x, p["norm_f"])
        logits = (x @ p["wout"]).reshape(b * t, GPT_VOCAB)
        return cross_entropy(logits, batch["targets"])

    if model == "mlp":
        loss_fn, params_np, data_np = mlp_loss, init_mlp(np), data_mlp(np)
        data_np = {"x": data_np["x"], "y": data_np["y"].astype(np.int32)}
    else:
        loss_fn, params_np, data_np = gpt_loss, init_gpt(np), data_gpt(np)
        data_np = {k: v.astype(np.int32) for k, v in data_np.items()}

    def train_step(params, m, v, step, batch):
        """step: 1-based AdamW step count (int32 scalar)."""
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        t = step.astype(jnp.float32)
        bc1 = 1.0 - BETA1 ** t
        bc2 = 1.0 - BETA2 ** t
        m = jax.tree_util.tree_map(lambda m_, g: BETA1 * m_ + (1.0 - BETA1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v_, g: BETA2 * v_ + (1.0 - BETA2) * (g * g), v, grads)

        def update(p_, m_, v_):
            upd = (m_ / bc1) / (jnp.sqrt(v_ / bc2) + ADAM_EPS) + WEIGHT_DECAY * p_
            return p_ - LR * upd

        params = jax.tree_util.tree_map(update, params, m, v)
        return params, m, v, loss

    params = {k: jnp.asarray(a) for k, a in params_np.items()}
    m = {k: jnp.zeros_like(a) for k, a in params.items()}
    v = {k: jnp.zeros_like(a) for k, a in params.items()}
    batch = {k: jnp.asarray(a) for k, a in data_np.items()}
    step0 = np.int32(1)

    t0 = time.perf_counter()
    compiled = (jax.jit(train_step, donate_argnums=(0, 1, 2))
                .lower(params, m, v, step0, batch).compile())
    compile_s = time.perf_counter() - t0

    state = {"params": params, "m": m, "v": v}

    def run_step(step):
        p, m_, v_, loss = compiled(state["params"], state["m"], state["v"],
                                   np.int32(step), batch)
        jax.block_until_ready((p, m_, v_, loss))
        state["params"], state["m"], state["v"] = p, m_, v_
        return loss  # still a device array: converted after timing

    import jaxlib
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "jax": jax.__version__, "jaxlib": jaxlib.__version__}
    threading = {"XLA_FLAGS": os.environ.get("XLA_FLAGS"),
                 "devices": [str(dv) for dv in jax.devices()]}
    n_params = int(sum(a.size for a in params_np.values()))
    return run_step, float, compile_s, n_params, versions, threading


# ----------------------------------------------------------------------- torch

def build_torch(model, threads, np):
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(SEED)
    import torch.nn.functional as F

    def gelu(x):
        return F.gelu(x, approximate="tanh")

    if hasattr(F, "rms_norm"):
        def rms_norm(x, w):
            return F.rms_norm(x, (x.shape[-1],), w, eps=RMS_EPS)
    else:  # torch < 2.4
        def rms_norm(x, w):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w

    if model == "mlp":
        params_np, data_np = init_mlp(np), data_mlp(np)
    else:
        params_np, data_np = init_gpt(np), data_gpt(np)

    # Matrices go to torch's [out, in] layout for F.linear; embeddings
    # ([rows, D] tables) and vectors as they are.
    def to_param(name, a):
        if a.ndim == 2 and name not in ("wte", "wpe"):
            a = a.T
        return torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(a)))

    p = {k: to_param(k, a) for k, a in params_np.items()}
    batch = {k: torch.from_numpy(a) for k, a in data_np.items()}  # int64 labels

    causal = torch.ones(GPT_CTX, GPT_CTX, dtype=torch.bool).tril()

    def mlp_loss():
        h = gelu(F.linear(batch["x"], p["w0"], p["b0"]))
        h = gelu(F.linear(h, p["w1"], p["b1"]))
        return F.cross_entropy(F.linear(h, p["w2"], p["b2"]), batch["y"])

    def gpt_loss():
        b, t, d, nh, hd = GPT_BATCH, GPT_CTX, GPT_WIDTH, GPT_HEADS, GPT_HEAD_DIM
        x = F.embedding(batch["tokens"], p["wte"]) + p["wpe"]
        for l in range(GPT_LAYERS):
            h = rms_norm(x, p[f"l{l}.norm1"])
            q, k, v = F.linear(h, p[f"l{l}.wqkv"]).split(d, dim=-1)
            q, k, v = (a.view(b, t, nh, hd).transpose(1, 2) for a in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (hd ** -0.5)
            att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + F.linear(y, p[f"l{l}.wo"])
            h = rms_norm(x, p[f"l{l}.norm2"])
            x = x + F.linear(gelu(F.linear(h, p[f"l{l}.w1"])), p[f"l{l}.w2"])
        x = rms_norm(x, p["norm_f"])
        logits = F.linear(x, p["wout"]).view(b * t, GPT_VOCAB)
        return F.cross_entropy(logits, batch["targets"])

    loss_fn = mlp_loss if model == "mlp" else gpt_loss
    opt = torch.optim.AdamW(list(p.values()), lr=LR, betas=(BETA1, BETA2),
                            eps=ADAM_EPS, weight_decay=WEIGHT_DECAY)

    def run_step(step):
        del step  # torch.optim.AdamW counts its own steps
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss.detach()

    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "torch": torch.__version__}
    threading = {"num_threads": torch.get_num_threads(),
                 "num_interop_threads": torch.get_num_interop_threads(),
                 "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                 "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS")}
    n_params = int(sum(a.size for a in params_np.values()))
    return run_step, lambda l: float(l.item()), None, n_params, versions, threading


# ------------------------------------------------------------------------ main

def main(argv):
    args = parse_args(argv)
    entry_affinity = pin_threads(args.framework, args.threads)

    import numpy as np  # noqa: E402  (after pin_threads, like the framework)

    if args.framework == "jax":
        built = build_jax(args.model, np)
    else:
        built = build_torch(args.model, args.threads, np)
    run_step, to_float, compile_s, n_params, versions, threading = built

    losses = []
    step = 0
    for _ in range(args.warmup):
        step += 1
        losses.append(run_step(step))

    times = []
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.steps):
            step += 1
            t0 = time.perf_counter()
            loss = run_step(step)
            times.append(time.perf_counter() - t0)
            losses.append(loss)
        cpu1, wall1 = time.process_time(), time.perf_counter()
    finally:
        if gc_was_enabled:
            gc.enable()

    losses = [to_float(l) for l in losses]
    bad = [i for i, l in enumerate(losses) if l != l or l in (float("inf"), float("-inf"))]
    if bad:
        raise RuntimeError(f"non-finite loss at step {bad[0] + 1}: {losses[bad[0]]}")

    threading["affinity"] = affinity()
    threading["affinity_on_entry"] = entry_affinity
    out = {
        "framework": args.framework,
        "model": args.model,
        "threads": args.threads,
        "steps": args.steps,
        "warmup": args.warmup,
        "times_s": times,
        "median_s": statistics.median(times),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
        "cpu_util": (cpu1 - cpu0) / (wall1 - wall0) if wall1 > wall0 else None,
        "compile_s": compile_s,
        "n_params": n_params,
        "threading": threading,
        "versions": versions,
    }
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except BaseException as exc:  # report anything else as one stderr line
        print(f"train_ref.py: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
