"""Goldens for rlx-sparse: sparse x dense products and a conjugate-gradient solve, with the
gradients of sum(result * W), from scipy.sparse (values) and JAX (x64, gradients).

Run by scripts/regen-goldens.sh (pinned environment); the output is deterministic.
"""
import json
import os

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

rng = np.random.RandomState(20261127)


def coo_product(rows, cols, m):
    def f(values, dense):
        upd = values[:, None] * dense[cols] if dense.ndim == 2 else values * dense[cols]
        out = jnp.zeros((m,) + dense.shape[1:], dense.dtype)
        return out.at[rows].add(upd)

    return f


def arr(x):
    return {"shape": list(np.shape(x)), "data": np.ravel(np.asarray(x)).tolist()}


cases = []


def spmm_case(name, m, n, k, nnz, form):
    rows = rng.randint(0, m, nnz)
    cols = rng.randint(0, n, nnz)
    rows[0], cols[0] = rows[1], cols[1]  # a duplicate entry: the two add up
    values = rng.randn(nnz)
    dense = rng.randn(n, k) if k else rng.randn(n)
    f = coo_product(rows, cols, m)
    out = np.asarray(f(values, dense))
    a = sp.coo_matrix((values, (rows, cols)), shape=(m, n))
    assert np.allclose(out, a @ dense, atol=1e-12)
    w = rng.randn(*out.shape)
    gv, gd = jax.grad(lambda v, d: jnp.sum(f(v, d) * w), argnums=(0, 1))(values, dense)
    case = {
        "name": name,
        "kind": "spmm",
        "form": form,
        "m": m,
        "n": n,
        "values": arr(values),
        "dense": arr(dense),
        "cotangent": arr(w),
        "expected": arr(out),
        "grad_values": arr(gv),
        "grad_dense": arr(gd),
    }
    if form == "coo":
        case["rows"], case["cols"] = rows.tolist(), cols.tolist()
    else:
        # CSR from scipy, the entries in its (row-sorted, duplicates summed) order.
        c = a.tocsr()
        c.sum_duplicates()
        case["indptr"], case["indices"] = c.indptr.tolist(), c.indices.tolist()
        case["values"] = arr(c.data)
        r = np.repeat(np.arange(m), np.diff(c.indptr))
        fc = coo_product(r, c.indices, m)
        gv, gd = jax.grad(lambda v, d: jnp.sum(fc(v, d) * w), argnums=(0, 1))(c.data, dense)
        case["grad_values"], case["grad_dense"] = arr(gv), arr(gd)
    cases.append(case)


spmm_case("spmm_coo_5x4_k3", 5, 4, 3, 9, "coo")
spmm_case("spmv_coo_6x7", 6, 7, 0, 12, "coo")
spmm_case("spmm_csr_6x5_k2", 6, 5, 2, 14, "csr")
spmm_case("spmv_csr_4x8", 4, 8, 0, 10, "csr")

# Conjugate gradients on a sparse SPD matrix (a 2-D Laplacian on a 4x4 grid plus a shift),
# against the dense solve; gradients of sum(x * w) by JAX through jnp.linalg.solve.
g = 4
n = g * g
entries = {}
for i in range(g):
    for j in range(g):
        p = i * g + j
        entries[(p, p)] = 4.5
        for di, dj in ((0, 1), (1, 0), (0, -1), (-1, 0)):
            ii, jj = i + di, j + dj
            if 0 <= ii < g and 0 <= jj < g:
                entries[(p, ii * g + jj)] = -1.0 + 0.1 * rng.rand()
# Symmetric: the average of (p, q) and (q, p).
keys = sorted(entries)
vals = {k: 0.5 * (entries[k] + entries[(k[1], k[0])]) for k in keys}
rows = np.array([k[0] for k in keys])
cols = np.array([k[1] for k in keys])
values = np.array([vals[k] for k in keys])
b = rng.randn(n)
w = rng.randn(n)


def dense_of(v):
    return jnp.zeros((n, n)).at[rows, cols].add(v)


x = np.linalg.solve(np.asarray(dense_of(values)), b)
gv, gb = jax.grad(lambda v, b: jnp.sum(jnp.linalg.solve(dense_of(v), b) * w), argnums=(0, 1))(
    values, b
)
cases.append(
    {
        "name": "cg_laplacian_16",
        "kind": "cg",
        "n": n,
        "rows": rows.tolist(),
        "cols": cols.tolist(),
        "values": arr(values),
        "b": arr(b),
        "cotangent": arr(w),
        "expected": arr(x),
        "grad_values": arr(gv),
        "grad_b": arr(gb),
    }
)

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparse.json")
with open(out, "w") as f:
    json.dump({"generator": "gen_sparse.py", "jax": jax.__version__, "cases": cases}, f, indent=None)
    f.write("\n")
print(f"wrote {len(cases)} cases to {out}")
