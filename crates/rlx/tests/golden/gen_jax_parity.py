#!/usr/bin/env python3
"""JAX reference values for RLX's transforms on whole graphs.

This script writes ``jax_parity.json`` next to itself. Each scenario is a
small model (an MLP, a softmax cross-entropy, a LayerNorm + GELU block,
causal self-attention, a pre-norm transformer block, ...) together with its
concrete inputs and what JAX's transforms (``jax.value_and_grad``,
``jax.jvp``, ``jax.vmap`` of ``jax.grad``, repeated ``jax.grad``) compute for
it. The Rust test ``crates/rlx/tests/jax_parity.rs`` builds the same
computation as an RLX graph, applies RLX's transforms (``grad_with_loss``,
``grad``, ``jvp``, ``hvp``, ``vmap``, ``nth_order_grad``) and compares.

Regenerate with (from the repository root):

    scripts/regen-goldens.sh

or just this file with the pinned environment:

    .venv/bin/python crates/rlx/tests/golden/gen_jax_parity.py

Everything is float64 (``jax_enable_x64``), so the Rust side compares with
tight tolerances. The output is deterministic (fixed seed, fixed scenario
order).

File format::

    {"generator": "gen_jax_parity.py", "numpy": "<version>", "jax": "<version>",
     "scenarios": {"<name>": {"config": {...},
                              "inputs": {"<tensor>": {"shape": [...], "dtype": "f64", "data": [...]}, ...},
                              "expected": {"<tensor>": {"shape": [...], "dtype": "f64", "data": [...]}, ...}},
                   ...}}

* ``data`` is the flat row-major contents; floats are printed with ``repr``
  (they round-trip exactly), integer tensors (labels) as ints.
* ``config`` holds the scalar hyper-parameters. RLX stores norm epsilons and
  attention scales as f32, so those are chosen as f32 values here (the f64
  value of the f32 number), making both sides compute with the same constant.
"""

import json
import math
from pathlib import Path

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")
import jax.numpy as jnp  # noqa: E402  (must come after the config update)

SEED = 20250611
OUT_PATH = Path(__file__).resolve().parent / "jax_parity.json"

rng = np.random.default_rng(SEED)


def normal(shape, scale=1.0):
    return rng.standard_normal(shape) * scale


def f32(v):
    """The f64 value of the f32 nearest to ``v`` (RLX stores eps / scale as f32)."""
    return float(np.float32(v))


def tensor(a, dtype="f64"):
    a = np.asarray(a)
    if dtype == "f64":
        data = [float(v) for v in a.astype(np.float64).reshape(-1)]
        assert all(math.isfinite(v) for v in data), "non-finite value"
    else:
        data = [int(v) for v in a.reshape(-1)]
    return {"shape": list(a.shape), "dtype": dtype, "data": data}


def tensors(d):
    return {k: tensor(v) if not isinstance(v, dict) else v for k, v in d.items()}


# ---------------------------------------------------------------------------
# Model pieces (the Rust side builds exactly these)
# ---------------------------------------------------------------------------


def layer_norm(x, gamma, beta, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mean
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    return xc * jax.lax.rsqrt(var + eps) * gamma + beta


def rms_norm(x, gamma, eps):
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + eps) * gamma


def causal_attention(q, k, v, scale):
    """q [B, Hq, S, D], k / v [B, Hkv, S, D]; kv heads repeated for grouped queries."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        k = jnp.repeat(k, hq // hkv, axis=1)
        v = jnp.repeat(v, hq // hkv, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale
    n = q.shape[2]
    mask = jnp.tril(jnp.ones((n, n), dtype=bool))
    s = jnp.where(mask, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def split_heads(t, heads):
    b, s, e = t.shape
    return t.reshape(b, s, heads, e // heads).transpose(0, 2, 1, 3)


def merge_heads(t):
    b, h, s, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def self_attention(x, wq, wk, wv, hq, hkv, scale):
    q = split_heads(x @ wq, hq)
    k = split_heads(x @ wk, hkv)
    v = split_heads(x @ wv, hkv)
    return merge_heads(causal_attention(q, k, v, scale))


# ---------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------


def mlp_data():
    n, d_in, d_hidden, d_out = 4, 6, 16, 5
    return {
        "x": normal((n, d_in)),
        "y": normal((n, d_out)),
        "w1": normal((d_in, d_hidden), 1 / math.sqrt(d_in)),
        "b1": normal((d_hidden,), 0.1),
        "w2": normal((d_hidden, d_out), 1 / math.sqrt(d_hidden)),
        "b2": normal((d_out,), 0.1),
    }


def mlp_loss(w1, b1, w2, b2, x, y):
    h = jnp.tanh(x @ w1 + b1)
    out = h @ w2 + b2
    return jnp.mean((out - y) ** 2)


def scenario_mlp_mse(mlp):
    """(a) 2-layer tanh MLP with MSE loss: loss and grads w.r.t. all weights and biases."""
    args = [mlp[k] for k in ("w1", "b1", "w2", "b2", "x", "y")]
    loss, grads = jax.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))(*args)
    expected = {"loss": loss}
    for k, gk in zip(("w1", "b1", "w2", "b2"), grads):
        expected[f"grad_{k}"] = gk
    return {"config": {}, "inputs": tensors(mlp), "expected": tensors(expected)}


def scenario_softmax_xent():
    """(b) Linear layer + softmax cross-entropy with integer labels."""
    n, d, c = 4, 6, 5
    x = normal((n, d))
    w = normal((d, c), 1 / math.sqrt(d))
    b = normal((c,), 0.1)
    labels = np.array([3, 0, 4, 1], dtype=np.int64)

    def loss_fn(x, w, b):
        logits = x @ w + b
        m = jnp.max(logits, axis=1, keepdims=True)
        z = logits - m
        lse = jnp.log(jnp.sum(jnp.exp(z), axis=1, keepdims=True))
        logp = z - lse
        onehot = (labels[:, None] == jnp.arange(c)[None, :]).astype(jnp.float64)
        return -jnp.mean(jnp.sum(onehot * logp, axis=1))

    loss, (gx, gw, gb) = jax.value_and_grad(loss_fn, argnums=(0, 1, 2))(x, w, b)
    inputs = tensors({"x": x, "w": w, "b": b})
    inputs["labels"] = tensor(labels, "i64")
    return {
        "config": {"classes": c},
        "inputs": inputs,
        "expected": tensors({"loss": loss, "grad_x": gx, "grad_w": gw, "grad_b": gb}),
    }


def scenario_layernorm_gelu():
    """(c) LayerNorm + exact GELU, loss = sum(y * r): grads w.r.t. x, gamma, beta."""
    eps = f32(1e-5)
    shape = (2, 3, 8)
    x = normal(shape, 1.5) + 0.3
    gamma = 1.0 + normal((8,), 0.2)
    beta = normal((8,), 0.2)
    r = normal(shape)

    def loss_fn(x, gamma, beta):
        y = jax.nn.gelu(layer_norm(x, gamma, beta, eps), approximate=False)
        return jnp.sum(y * r)

    loss, (gx, gg, gb) = jax.value_and_grad(loss_fn, argnums=(0, 1, 2))(x, gamma, beta)
    return {
        "config": {"eps": eps},
        "inputs": tensors({"x": x, "gamma": gamma, "beta": beta, "r": r}),
        "expected": tensors({"loss": loss, "grad_x": gx, "grad_gamma": gg, "grad_beta": gb}),
    }


def attention_scenario(hq, hkv, d_head):
    """(d) Causal self-attention with q/k/v projections from x, loss = sum(out * r)."""
    b, s = 2, 5
    e = hq * d_head
    scale = f32(1 / math.sqrt(d_head))
    x = normal((b, s, e))
    wq = normal((e, hq * d_head), 1 / math.sqrt(e))
    wk = normal((e, hkv * d_head), 1 / math.sqrt(e))
    wv = normal((e, hkv * d_head), 1 / math.sqrt(e))
    r = normal((b, s, hq * d_head))

    def loss_fn(x, wq, wk, wv):
        return jnp.sum(self_attention(x, wq, wk, wv, hq, hkv, scale) * r)

    loss, grads = jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3))(x, wq, wk, wv)
    expected = {"loss": loss}
    for k, gk in zip(("x", "wq", "wk", "wv"), grads):
        expected[f"grad_{k}"] = gk
    return {
        "config": {"q_heads": hq, "kv_heads": hkv, "head_dim": d_head, "scale": scale},
        "inputs": tensors({"x": x, "wq": wq, "wk": wk, "wv": wv, "r": r}),
        "expected": tensors(expected),
    }


TRANSFORMER_PARAMS = ("g1", "wq", "wk", "wv", "wo", "g2", "wg", "wu", "wd")


def transformer_data():
    b, s, e, heads, f = 2, 5, 8, 2, 12
    cfg = {"heads": heads, "eps": f32(1e-6), "scale": f32(1 / math.sqrt(e // heads))}
    x = normal((b, s, e))
    p = {
        "g1": 1.0 + normal((e,), 0.1),
        "wq": normal((e, e), 1 / math.sqrt(e)),
        "wk": normal((e, e), 1 / math.sqrt(e)),
        "wv": normal((e, e), 1 / math.sqrt(e)),
        "wo": normal((e, e), 1 / math.sqrt(e)),
        "g2": 1.0 + normal((e,), 0.1),
        "wg": normal((e, f), 1 / math.sqrt(e)),
        "wu": normal((e, f), 1 / math.sqrt(e)),
        "wd": normal((f, e), 1 / math.sqrt(f)),
    }
    return {"cfg": cfg, "x": x, "params": p}


def transformer_loss(p, x, cfg):
    """Pre-norm block: RMSNorm, causal attention, residual, SwiGLU MLP, residual;
    loss = mean(out ** 2)."""
    heads, eps, scale = cfg["heads"], cfg["eps"], cfg["scale"]
    a = self_attention(rms_norm(x, p["g1"], eps), p["wq"], p["wk"], p["wv"], heads, heads, scale)
    h = x + a @ p["wo"]
    n = rms_norm(h, p["g2"], eps)
    m = (jax.nn.silu(n @ p["wg"]) * (n @ p["wu"])) @ p["wd"]
    out = h + m
    return jnp.mean(out * out)


def scenario_transformer_block(tf):
    """(e) Pre-norm transformer block (2 heads): loss and grads w.r.t. every param."""
    loss, grads = jax.value_and_grad(transformer_loss)(tf["params"], tf["x"], tf["cfg"])
    expected = {"loss": loss}
    for k in TRANSFORMER_PARAMS:
        expected[f"grad_{k}"] = grads[k]
    return {
        "config": tf["cfg"],
        "inputs": tensors({"x": tf["x"], **tf["params"]}),
        "expected": tensors(expected),
    }


TRANSFORMER_HVP_WRT = ("wq", "g2", "wd")


def scenario_transformer_hvp(tf):
    """(f') Hessian-vector product of (e)'s loss w.r.t. several params at once (through
    attention, RMSNorm and SwiGLU), by jvp of grad."""
    p = tf["params"]
    vs = {k: normal(p[k].shape) for k in TRANSFORMER_HVP_WRT}

    def grads(*ws):
        q = dict(p, **dict(zip(TRANSFORMER_HVP_WRT, ws)))
        g = jax.grad(transformer_loss)(q, tf["x"], tf["cfg"])
        return tuple(g[k] for k in TRANSFORMER_HVP_WRT)

    primals = tuple(p[k] for k in TRANSFORMER_HVP_WRT)
    tangents = tuple(vs[k] for k in TRANSFORMER_HVP_WRT)
    gs, hvs = jax.jvp(grads, primals, tangents)
    expected = {"loss": transformer_loss(p, tf["x"], tf["cfg"])}
    for k, gk in zip(TRANSFORMER_HVP_WRT, gs):
        expected[f"grad_{k}"] = gk
    for k, hk in zip(TRANSFORMER_HVP_WRT, hvs):
        expected[f"hvp_{k}"] = hk
    return {
        "config": tf["cfg"],
        "inputs": tensors({"x": tf["x"], **p, **{f"v_{k}": v for k, v in vs.items()}}),
        "expected": tensors(expected),
    }


def scenario_mlp_hvp(mlp):
    """(f) Hessian-vector product of scenario (a)'s loss w.r.t. w1, by jvp of grad."""
    v = normal(mlp["w1"].shape)
    rest = [mlp[k] for k in ("b1", "w2", "b2", "x", "y")]

    def grad_w1(w1):
        return jax.grad(mlp_loss)(w1, *rest)

    g, hv = jax.jvp(grad_w1, (mlp["w1"],), (v,))
    loss = mlp_loss(mlp["w1"], *rest)
    return {
        "config": {},
        "inputs": tensors({**mlp, "v": v}),
        "expected": tensors({"loss": loss, "grad_w1": g, "hvp_w1": hv}),
    }


def scenario_per_example_grads():
    """(g) Per-example gradients of a linear model with squared error:
    vmap(grad(loss), in_axes=(None, 0, 0))."""
    n, d_in, d_out = 4, 6, 3
    w = normal((d_in, d_out), 1 / math.sqrt(d_in))
    b = normal((d_out,), 0.1)
    xs = normal((n, d_in))
    ys = normal((n, d_out))

    def loss_fn(params, x, y):
        w, b = params
        pred = x @ w + b
        return jnp.sum((pred - y) ** 2)

    gw, gb = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))((w, b), xs, ys)
    return {
        "config": {"batch": n},
        "inputs": tensors({"w": w, "b": b, "x": xs, "y": ys}),
        "expected": tensors({"grad_w": gw, "grad_b": gb}),
    }


def scenario_third_derivative():
    """(h) Third derivatives of scalar functions by grad(grad(grad(f)))."""
    points = np.array([-1.3, -0.4, 0.7, 1.9])

    def f_sin_exp(x):
        return jnp.sin(x) * jnp.exp(x / 2) + x**4

    def f_tanh(x):
        return jnp.tanh(x) * x

    expected = {}
    for name, f in (("sin_exp_pow", f_sin_exp), ("tanh_x", f_tanh)):
        d3 = jax.grad(jax.grad(jax.grad(f)))
        expected[f"d3_{name}"] = np.array([float(d3(p)) for p in points])
        expected[f"f_{name}"] = np.array([float(f(p)) for p in points])
    return {"config": {}, "inputs": tensors({"points": points}), "expected": tensors(expected)}


def scenario_mlp_jvp():
    """(i) Forward mode: jvp of a small GELU (tanh approximation) MLP's vector output w.r.t.
    its input."""
    n, d_in, d_hidden, d_out = 4, 6, 8, 3
    x = normal((n, d_in))
    tx = normal((n, d_in))
    w1 = normal((d_in, d_hidden), 1 / math.sqrt(d_in))
    b1 = normal((d_hidden,), 0.1)
    w2 = normal((d_hidden, d_out), 1 / math.sqrt(d_hidden))
    b2 = normal((d_out,), 0.1)

    def f(x):
        h = jax.nn.gelu(x @ w1 + b1, approximate=True)
        return h @ w2 + b2

    y, ty = jax.jvp(f, (x,), (tx,))
    return {
        "config": {},
        "inputs": tensors({"x": x, "tangent_x": tx, "w1": w1, "b1": b1, "w2": w2, "b2": b2}),
        "expected": tensors({"y": y, "tangent_y": ty}),
    }


def cond_piecewise(w, x):
    """sum(lax.cond(sum(x*w) > 0, u -> u*u/2, u -> -sin(u)) applied to u = x*w)."""
    u = x * w
    y = jax.lax.cond(jnp.sum(u) > 0, lambda u: u * u * 0.5, lambda u: -jnp.sin(u), u)
    return jnp.sum(y)


def scenario_cond():
    """lax.cond: value and grad on both sides of the predicate, jvp, and vmap over a batch
    whose predicates differ (batched cond becomes a per-element select)."""
    w = normal((4,))
    x_pos = np.abs(normal((4,))) * np.sign(w)        # sum(x*w) > 0
    x_neg = -x_pos                                    # sum(x*w) < 0
    t_w = normal((4,))
    xs = np.stack([x_pos, x_neg, normal((4,))])
    expected = {}
    for tag, x in (("pos", x_pos), ("neg", x_neg)):
        loss, g = jax.value_and_grad(cond_piecewise)(w, x)
        expected[f"loss_{tag}"] = loss
        expected[f"grad_w_{tag}"] = g
        y, ty = jax.jvp(lambda w: cond_piecewise(w, x), (w,), (t_w,))
        expected[f"jvp_{tag}"] = ty
    expected["vmap_losses"] = jax.vmap(lambda x: cond_piecewise(w, x))(xs)
    expected["vmap_grads"] = jax.vmap(lambda x: jax.grad(cond_piecewise)(w, x))(xs)
    return {
        "config": {},
        "inputs": tensors({"w": w, "x_pos": x_pos, "x_neg": x_neg, "t_w": t_w, "xs": xs}),
        "expected": tensors(expected),
    }


def newton_sqrt(a, tol=True):
    """sqrt(a) by Newton's iteration x <- (x + a/x)/2 from x = a: while |x*x - a| > 1e-12 * a
    (tol), or exactly 30 iterations (a fori_loop, reverse-differentiable)."""
    body = lambda c: (c[0], 0.5 * (c[1] + c[0] / c[1]))  # noqa: E731
    if tol:
        return jax.lax.while_loop(lambda c: jnp.abs(c[1] * c[1] - c[0]) > 1e-12 * c[0], body, (a, a))[1]
    return jax.lax.fori_loop(0, 30, lambda i, c: body(c), (a, a))[1]


def scenario_while():
    """lax.while_loop (Newton's square root, carries (a, x)): values and jvp with the
    tolerance test; the gradient through a fixed 30-iteration loop; vmap over several a, and
    vmap of the jvp."""
    a = np.float64(2.7)
    ta = np.float64(0.3)
    as_ = np.array([0.5, 2.0, 9.0, 30.0])
    t_as = np.array([1.0, -0.5, 0.25, 2.0])
    y, ty = jax.jvp(newton_sqrt, (a,), (ta,))
    return {
        "config": {},
        "inputs": tensors({"a": np.asarray(a), "t_a": np.asarray(ta), "as": as_, "t_as": t_as}),
        "expected": tensors({
            "sqrt": np.asarray(y),
            "jvp": np.asarray(ty),
            "grad_fori": np.asarray(jax.grad(lambda a: newton_sqrt(a, tol=False))(a)),
            "vmap": jax.vmap(newton_sqrt)(as_),
            "vmap_jvp": jax.vmap(lambda a, t: jax.jvp(newton_sqrt, (a,), (t,))[1])(as_, t_as),
        }),
    }


def rnn_loss(h0, w, u, xs):
    """sum of the hidden states of h_t = tanh(h_{t-1} w + x_t u), by lax.scan."""
    def step(h, x):
        h = jnp.tanh(h @ w + x @ u)
        return h, h
    _, hs = jax.lax.scan(step, h0, xs)
    return jnp.sum(hs), hs


def scenario_scan():
    """lax.scan (a tanh RNN over 5 steps): the stacked states, the loss and its gradients,
    jvp along w, and vmap over a batch of sequences."""
    hdim, d, t = 3, 2, 5
    h0, w, u = normal((hdim,)), normal((hdim, hdim), 0.5), normal((d, hdim), 0.5)
    xs = normal((t, d))
    tw = normal((hdim, hdim))
    batch = normal((4, t, d))
    (loss, hs), grads = jax.value_and_grad(rnn_loss, argnums=(0, 1, 2), has_aux=True)(h0, w, u, xs)
    _, tloss = jax.jvp(lambda w: rnn_loss(h0, w, u, xs)[0], (w,), (tw,))
    return {
        "config": {},
        "inputs": tensors({"h0": h0, "w": w, "u": u, "xs": xs, "t_w": tw, "batch": batch}),
        "expected": tensors({
            "hs": hs, "loss": np.asarray(loss),
            "grad_h0": grads[0], "grad_w": grads[1], "grad_u": grads[2],
            "jvp_w": np.asarray(tloss),
            "vmap_losses": jax.vmap(lambda xs: rnn_loss(h0, w, u, xs)[0])(batch),
        }),
    }


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def main():
    # Draw order is part of the file's determinism: do not reorder.
    mlp = mlp_data()
    scenarios = {}
    scenarios["mlp_mse"] = scenario_mlp_mse(mlp)
    scenarios["softmax_xent"] = scenario_softmax_xent()
    scenarios["layernorm_gelu"] = scenario_layernorm_gelu()
    scenarios["causal_attention"] = attention_scenario(hq=2, hkv=2, d_head=4)
    scenarios["causal_attention_gqa"] = attention_scenario(hq=4, hkv=2, d_head=3)
    tf = transformer_data()
    scenarios["transformer_block"] = scenario_transformer_block(tf)
    scenarios["mlp_hvp"] = scenario_mlp_hvp(mlp)
    scenarios["per_example_grads"] = scenario_per_example_grads()
    scenarios["third_derivative"] = scenario_third_derivative()
    scenarios["mlp_jvp"] = scenario_mlp_jvp()
    scenarios["transformer_hvp"] = scenario_transformer_hvp(tf)
    scenarios["cond"] = scenario_cond()
    scenarios["while"] = scenario_while()
    scenarios["scan"] = scenario_scan()

    header = {"generator": "gen_jax_parity.py", "numpy": np.__version__, "jax": jax.__version__}
    # One scenario per line keeps diffs of the golden file reviewable.
    lines = [
        json.dumps(name) + ":" + json.dumps(s, allow_nan=False, separators=(",", ":"))
        for name, s in scenarios.items()
    ]
    text = json.dumps(header, allow_nan=False)[:-1] + ', "scenarios": {\n'
    text += ",\n".join(lines) + "\n}}\n"
    json.loads(text)  # sanity check: the file is valid JSON
    OUT_PATH.write_text(text)

    for name, s in scenarios.items():
        outs = ", ".join(f"{k}{s['expected'][k]['shape']}" for k in s["expected"])
        print(f"  {name:<22} {outs}")
    print(f"wrote {len(scenarios)} scenarios to {OUT_PATH} ({len(text) / 1e3:.1f} kB)")


if __name__ == "__main__":
    main()
