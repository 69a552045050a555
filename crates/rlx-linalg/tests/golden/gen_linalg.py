"""Goldens for rlx-linalg: values and reverse-mode gradients from JAX (x64).

For each case: the inputs, a cotangent W for the result, the result, and the gradient of
sum(result * W) with respect to every input, as JAX computes them (jnp.linalg / jax.scipy).
Run by scripts/regen-goldens.sh (pinned environment); the output is deterministic.
"""
import json
import os

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import jax.scipy.linalg as jsl  # noqa: E402
import numpy as np  # noqa: E402

rng = np.random.RandomState(20261127)


def general(shape):
    n = shape[-1]
    return rng.randn(*shape) + n * np.eye(n) * 0.5


def spd(shape):
    n = shape[-1]
    m = rng.randn(*shape)
    return m @ np.swapaxes(m, -1, -2) + n * np.eye(n)


def triangular(shape, lower):
    n = shape[-1]
    t = rng.randn(*shape) + 3.0 * np.eye(n)
    return np.tril(t) if lower else np.triu(t)


def case(name, op, attrs, fn, inputs, dtype="f64"):
    out = fn(*inputs)
    w = rng.randn(*np.shape(out))

    def loss(*args):
        return jnp.sum(fn(*args) * w)

    grads = jax.grad(loss, argnums=tuple(range(len(inputs))))(*inputs)
    return {
        "name": name,
        "op": op,
        "attrs": attrs,
        "dtype": dtype,
        "inputs": [{"shape": list(np.shape(x)), "data": np.ravel(x).tolist()} for x in inputs],
        "cotangent": np.ravel(w).tolist(),
        "expected": {"shape": list(np.shape(out)), "data": np.ravel(np.asarray(out)).tolist()},
        "grads": [np.ravel(np.asarray(g)).tolist() for g in grads],
    }


cases = []
for shape, k in [((3, 3), 2), ((2, 4, 4), 3), ((1, 1), 1)]:
    tag = "x".join(map(str, shape))
    a = general(shape)
    b = rng.randn(*shape[:-1], k)
    cases.append(case(f"solve_{tag}", "solve", {}, jnp.linalg.solve, [a, b]))
    for lower in (True, False):
        t = triangular(shape, lower)
        # The other triangle holds values the op must not read.
        t_noisy = t + (np.triu(rng.randn(*shape), 1) if lower else np.tril(rng.randn(*shape), -1))
        cases.append(
            case(
                f"triangular_solve_{'lower' if lower else 'upper'}_{tag}",
                "triangular_solve",
                {"lower": lower},
                lambda a, b, lower=lower: jsl.solve_triangular(
                    jnp.tril(a) if lower else jnp.triu(a), b, lower=lower
                ),
                [t_noisy, rng.randn(*shape[:-1], k)],
            )
        )
    cases.append(case(f"cholesky_{tag}", "cholesky", {}, jnp.linalg.cholesky, [spd(shape)]))
    cases.append(case(f"inv_{tag}", "inv", {}, jnp.linalg.inv, [general(shape)]))
    cases.append(case(f"det_{tag}", "det", {}, jnp.linalg.det, [general(shape)]))
    cases.append(
        case(f"logabsdet_{tag}", "logabsdet", {}, lambda a: jnp.linalg.slogdet(a)[1], [general(shape)])
    )



def fix_vectors(v):
    """Each eigenvector's entry of largest magnitude made positive (rlx-linalg's convention)."""
    idx = jnp.argmax(jnp.abs(v), axis=-2)
    s = jnp.sign(jnp.take_along_axis(v, idx[..., None, :], axis=-2))
    return v * s


def fix_qr(q, r):
    """r's diagonal made non-negative (rlx-linalg's convention)."""
    d = jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))
    return q * d[..., None, :], r * d[..., :, None]


# Appended after the cases above so their random draws stay the same.
for shape in [(3, 3), (2, 4, 4), (1, 1)]:
    tag = "x".join(map(str, shape))
    a = rng.randn(*shape)  # not symmetric: eigh uses (a + a^T) / 2, as jnp.linalg.eigh does
    cases.append(
        case(f"eigh_values_{tag}", "eigh", {"output": "values"}, lambda a: jnp.linalg.eigh(a)[0], [a])
    )
    cases.append(
        case(
            f"eigh_vectors_{tag}",
            "eigh",
            {"output": "vectors"},
            lambda a: fix_vectors(jnp.linalg.eigh(a)[1]),
            [rng.randn(*shape)],
        )
    )
for shape in [(3, 3), (5, 3), (2, 4, 2), (1, 1)]:
    tag = "x".join(map(str, shape))
    for which in ("q", "r"):
        cases.append(
            case(
                f"qr_{which}_{tag}",
                "qr",
                {"output": which},
                lambda a, which=which: fix_qr(*jnp.linalg.qr(a))[0 if which == "q" else 1],
                [rng.randn(*shape)],
            )
        )



def fix_svd(u, s, vt):
    """Each column of u with its entry of largest magnitude positive, vt's row flipped with it."""
    idx = jnp.argmax(jnp.abs(u), axis=-2)
    sg = jnp.sign(jnp.take_along_axis(u, idx[..., None, :], axis=-2))
    return u * sg, s, vt * jnp.swapaxes(sg, -1, -2)


for shape in [(3, 3), (5, 3), (3, 5), (2, 4, 3)]:
    tag = "x".join(map(str, shape))
    for k, which in enumerate(("u", "s", "vt")):
        cases.append(
            case(
                f"svd_{which}_{tag}",
                "svd",
                {"output": which},
                lambda a, k=k: fix_svd(*jnp.linalg.svd(a, full_matrices=False))[k],
                [rng.randn(*shape)],
            )
        )

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "linalg.json")
with open(out, "w") as f:
    json.dump({"generator": "gen_linalg.py", "jax": jax.__version__, "cases": cases}, f, indent=None)
    f.write("\n")
print(f"wrote {len(cases)} cases to {out}")
