"""Fit the polynomials of rlx-cpu's vectorizable f32 erf (`crates/rlx-cpu/src/math.rs`, erf_f32).

    .venv/bin/python scripts/fit-erf.py

Least squares on Chebyshev nodes in double precision (numpy), then the f32 evaluation the Rust
code does is simulated and its error printed in ulp of the result:
  |x| < 1:      erf(x) = x + x * P(x^2),    P of degree 6 (fits erf(x)/x - 1)
  1 <= |x| < 4: erf(x) = 1 - exp(-x^2) * Q(u), u = (1/|x| - 0.625) / 0.375 in [-1, 1],
                Q of degree 9 (fits erfc(x) exp(x^2))
"""
import math

import numpy as np

erf = np.vectorize(math.erf)
erfc = np.vectorize(math.erfc)


def fit(var, f, deg, domain):
    c = np.polynomial.chebyshev.Chebyshev.fit(var, f, deg, domain=domain)
    return c.convert(kind=np.polynomial.Polynomial, domain=domain, window=domain).coef


def horner32(coefs, v):
    acc = np.full_like(v, np.float32(coefs[-1]), dtype=np.float32)
    for c in coefs[-2::-1]:
        acc = (acc.astype(np.float64) * v + np.float64(np.float32(c))).astype(np.float32)
    return acc


def ulp(approx, exact):
    spacing = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.max(np.abs(approx.astype(np.float64) - exact) / spacing)


nodes = np.cos(np.linspace(0, np.pi, 4000))
t = nodes * 0.5 + 0.5  # x^2 in [0, 1]
x = np.sqrt(t)
p = fit(t, np.where(x > 0, erf(x) / np.where(x > 0, x, 1), 2 / math.sqrt(math.pi)) - 1, 6, [0, 1])
u = nodes
xb = 1 / (u * 0.375 + 0.625)
q = fit(u, erfc(xb) * np.exp(xb * xb), 9, [-1, 1])
print("P =", [float(c) for c in p])
print("Q =", [float(c) for c in q])

xs = np.linspace(0, 1, 200001).astype(np.float32)
ts = (xs.astype(np.float64) * xs).astype(np.float32)
small = (xs.astype(np.float64) * horner32(p, ts) + xs).astype(np.float32)
print("|x| < 1: max error", ulp(small, erf(xs.astype(np.float64))), "ulp")
xs = np.linspace(1, 3.95, 200001).astype(np.float32)
us = ((np.float32(1) / xs).astype(np.float64) * np.float32(1 / 0.375) - np.float32(0.625 / 0.375)).astype(np.float32)
e = np.exp(-(xs.astype(np.float64) ** 2))
large = (1.0 - e * horner32(q, us)).astype(np.float32)
print("1 <= |x| < 3.95: max error", ulp(large, erf(xs.astype(np.float64))), "ulp")
