//! The reference evaluator of the ops: textbook algorithms in f64 (LU with partial pivoting,
//! Cholesky–Banachiewicz, substitution, cyclic Jacobi rotations for `eigh`, Householder
//! reflections for `qr`, one-sided Jacobi (Hestenes) for `svd`), one matrix of the batch at a
//! time.

use crate::{EighOutput, Linalg, QrOutput, Rectangular, SvdOutput};
use rlx_ir::eval::Tensor;
use rlx_ir::{Error, Result, Shape};

/// `a` (row-major `n × n`) factored in place as `P a = L U`; the row order and the sign of `P`.
fn lu(a: &mut [f64], n: usize) -> (Vec<usize>, f64) {
    let mut perm: Vec<usize> = (0..n).collect();
    let mut sign = 1.0;
    for c in 0..n {
        let p = (c..n)
            .max_by(|&i, &j| a[i * n + c].abs().total_cmp(&a[j * n + c].abs()))
            .unwrap_or(c);
        if p != c {
            for k in 0..n {
                a.swap(c * n + k, p * n + k);
            }
            perm.swap(c, p);
            sign = -sign;
        }
        let d = a[c * n + c];
        for i in c + 1..n {
            let f = a[i * n + c] / d;
            a[i * n + c] = f;
            for k in c + 1..n {
                a[i * n + k] -= f * a[c * n + k];
            }
        }
    }
    (perm, sign)
}

/// Solve `t x = b` (`b` row-major `n × k`, overwritten) for triangular `t`; `unit`: a unit
/// diagonal.
fn substitute(t: &[f64], b: &mut [f64], n: usize, k: usize, lower: bool, unit: bool) {
    let rows: Vec<usize> = if lower {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    };
    for &i in &rows {
        for c in 0..k {
            let mut s = b[i * k + c];
            for j in 0..n {
                let before = if lower { j < i } else { j > i };
                if before {
                    s -= t[i * n + j] * b[j * k + c];
                }
            }
            b[i * k + c] = if unit { s } else { s / t[i * n + i] };
        }
    }
}

/// Solve `a x = b` with `a` factored by [`lu`].
fn lu_solve(f: &[f64], perm: &[usize], b: &[f64], n: usize, k: usize) -> Vec<f64> {
    let mut x: Vec<f64> = perm
        .iter()
        .flat_map(|&p| b[p * k..(p + 1) * k].to_vec())
        .collect();
    substitute(f, &mut x, n, k, true, true);
    substitute(f, &mut x, n, k, false, false);
    x
}

/// Make each eigenvector (column of the row-major `n × n` `v`) have its entry of largest
/// magnitude (the first such) positive: the sign convention of `eigh`.
pub(crate) fn fix_eigenvector_signs(v: &mut [f64], n: usize) {
    for j in 0..n {
        let p = (0..n).fold(0, |p, i| {
            if v[i * n + j].abs() > v[p * n + j].abs() {
                i
            } else {
                p
            }
        });
        if v[p * n + j] < 0.0 {
            for i in 0..n {
                v[i * n + j] = -v[i * n + j];
            }
        }
    }
}

/// Rotate columns `p` and `q` of the row-major `rows × stride` matrix `a` by the rotation
/// `(c, s)`: `a_p ← c a_p - s a_q`, `a_q ← s a_p + c a_q` (rows `p`, `q` with `by_rows`).
fn rotate(
    a: &mut [f64],
    stride: usize,
    rows: usize,
    [p, q]: [usize; 2],
    (c, s): (f64, f64),
    by_rows: bool,
) {
    for k in 0..rows {
        let (ip, iq) = if by_rows {
            (p * stride + k, q * stride + k)
        } else {
            (k * stride + p, k * stride + q)
        };
        let (x, y) = (a[ip], a[iq]);
        a[ip] = c * x - s * y;
        a[iq] = s * x + c * y;
    }
}

/// `svd`'s sign convention: for each of the `k` columns of `u` (`m` rows, read by `get`) whose
/// entry of largest magnitude (the first such) is negative, `flip(j)` negates column `j` of `u`
/// and the matching singular vector of `v`.
pub(crate) fn fix_singular_vector_signs(
    get: impl Fn(usize, usize) -> f64,
    m: usize,
    k: usize,
    mut flip: impl FnMut(usize),
) {
    for j in 0..k {
        let p = (0..m).fold(0, |p, i| {
            if get(i, j).abs() > get(p, j).abs() {
                i
            } else {
                p
            }
        });
        if get(p, j) < 0.0 {
            flip(j);
        }
    }
}

/// The reduced SVD of row-major `m × n` `a` by one-sided Jacobi rotations (Hestenes): `u`
/// (`m × k`), `s` (`k`, descending) and `vt` (`k × n`), row-major, signs fixed.
fn jacobi_svd(a: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let k = m.min(n);
    let (mut u, s, mut vt) = if m < n {
        // a = u s vt  <=>  aᵀ = vtᵀ s uᵀ: u = vt2ᵀ (m × m), vt = u2ᵀ (m × n).
        let at: Vec<f64> = (0..n * m).map(|p| a[(p % m) * n + p / m]).collect();
        let (u2, s, vt2) = tall_svd(&at, n, m);
        let u: Vec<f64> = (0..m * k).map(|p| vt2[(p % k) * m + p / k]).collect();
        let vt: Vec<f64> = (0..k * n).map(|p| u2[(p % n) * k + p / n]).collect();
        (u, s, vt)
    } else {
        tall_svd(a, m, n)
    };
    let uc = u.clone();
    fix_singular_vector_signs(
        |i, j| uc[i * k + j],
        m,
        k,
        |j| {
            (0..m).for_each(|i| u[i * k + j] = -u[i * k + j]);
            (0..n).for_each(|i| vt[j * n + i] = -vt[j * n + i]);
        },
    );
    (u, s, vt)
}

/// [`jacobi_svd`] of a tall `a` (`m >= n`), signs as the iteration leaves them.
fn tall_svd(a: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    // m >= n: orthogonalize the columns of w = a v.
    let mut w = a.to_vec();
    let mut v: Vec<f64> = (0..n * n).map(|k| f64::from(k / n == k % n)).collect();
    for _sweep in 0..100 {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let (mut al, mut be, mut ga) = (0.0, 0.0, 0.0);
                for i in 0..m {
                    let (x, y) = (w[i * n + p], w[i * n + q]);
                    al += x * x;
                    be += y * y;
                    ga += x * y;
                }
                if ga.abs() <= 1e-15 * (al * be).sqrt() || ga == 0.0 {
                    continue;
                }
                rotated = true;
                let zeta = (be - al) / (2.0 * ga);
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let c = 1.0 / (1.0 + t * t).sqrt();
                rotate(&mut w, n, m, [p, q], (c, c * t), false);
                rotate(&mut v, n, n, [p, q], (c, c * t), false);
            }
        }
        if !rotated {
            break;
        }
    }
    let norms: Vec<f64> = (0..n)
        .map(|j| {
            (0..m)
                .map(|i| w[i * n + j] * w[i * n + j])
                .sum::<f64>()
                .sqrt()
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| norms[j].total_cmp(&norms[i]));
    let k = n;
    let s: Vec<f64> = order.iter().map(|&j| norms[j]).collect();
    let u: Vec<f64> = (0..m * k)
        .map(|p| {
            let (i, c) = (p / k, order[p % k]);
            if norms[c] > 0.0 {
                w[i * n + c] / norms[c]
            } else {
                0.0
            }
        })
        .collect();
    let vt: Vec<f64> = (0..k * n).map(|p| v[(p % n) * n + order[p / n]]).collect();
    (u, s, vt)
}

/// Eigenvalues (ascending) and eigenvectors (columns, signs fixed) of the symmetric part of
/// `a` (row-major `n × n`) by cyclic Jacobi rotations.
fn jacobi_eigh(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut s: Vec<f64> = (0..n * n)
        .map(|k| 0.5 * (a[k] + a[(k % n) * n + k / n]))
        .collect();
    let mut v: Vec<f64> = (0..n * n).map(|k| f64::from(k / n == k % n)).collect();
    let norm = s.iter().map(|x| x * x).sum::<f64>().sqrt();
    for _sweep in 0..100 {
        let off: f64 = (0..n * n)
            .filter(|k| k / n != k % n)
            .map(|k| s[k] * s[k])
            .sum::<f64>()
            .sqrt();
        if off <= 1e-15 * norm || !off.is_finite() {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = s[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                // The rotation zeroing s[p][q] (Golub & Van Loan, symmetric Schur).
                let tau = (s[q * n + q] - s[p * n + p]) / (2.0 * apq);
                // (signum(0) is 1: a zero tau rotates by 45 degrees.)
                let t = tau.signum() / (tau.abs() + (1.0 + tau * tau).sqrt());
                let c = 1.0 / (1.0 + t * t).sqrt();
                let r = (c, t * c);
                rotate(&mut s, n, n, [p, q], r, false);
                rotate(&mut s, n, n, [p, q], r, true);
                rotate(&mut v, n, n, [p, q], r, false);
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| s[i * n + i].total_cmp(&s[j * n + j]));
    let w = order.iter().map(|&i| s[i * n + i]).collect();
    let mut vs: Vec<f64> = (0..n * n).map(|k| v[(k / n) * n + order[k % n]]).collect();
    fix_eigenvector_signs(&mut vs, n);
    (w, vs)
}

/// The reduced QR factorization of row-major `m × n` `a` by Householder reflections, `r`'s
/// diagonal made non-negative: `q` (`m × k`) and `r` (`k × n`), `k = min(m, n)`.
fn householder_qr(a: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let k = m.min(n);
    let mut r = a.to_vec();
    // q starts as the first k columns of the identity; reflections are applied in reverse.
    let mut vs: Vec<Vec<f64>> = Vec::with_capacity(k);
    for j in 0..k {
        let x: Vec<f64> = (j..m).map(|i| r[i * n + j]).collect();
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut v = x.clone();
        let alpha = if x[0] >= 0.0 { -norm } else { norm };
        v[0] -= alpha;
        let vn = v.iter().map(|t| t * t).sum::<f64>().sqrt();
        if vn > 0.0 {
            v.iter_mut().for_each(|t| *t /= vn);
            for c in j..n {
                let d: f64 = (j..m).map(|i| v[i - j] * r[i * n + c]).sum();
                for i in j..m {
                    r[i * n + c] -= 2.0 * v[i - j] * d;
                }
            }
        }
        vs.push(v);
    }
    let mut q: Vec<f64> = (0..m * k).map(|p| f64::from(p / k == p % k)).collect();
    for j in (0..k).rev() {
        let v = &vs[j];
        for c in 0..k {
            let d: f64 = (j..m).map(|i| v[i - j] * q[i * k + c]).sum();
            for i in j..m {
                q[i * k + c] -= 2.0 * v[i - j] * d;
            }
        }
    }
    let mut rk: Vec<f64> = (0..k * n)
        .map(|p| {
            let (i, j) = (p / n, p % n);
            if j >= i {
                r[i * n + j]
            } else {
                0.0
            }
        })
        .collect();
    for i in 0..k {
        if rk[i * n + i] < 0.0 {
            (0..n).for_each(|j| rk[i * n + j] = -rk[i * n + j]);
            (0..m).for_each(|p| q[p * k + i] = -q[p * k + i]);
        }
    }
    (q, rk)
}

/// `qr` or `svd`'s result of one `m × n` matrix.
fn rectangular(op: Rectangular, a: &[f64], m: usize, n: usize) -> Vec<f64> {
    match op {
        Rectangular::Qr(output) => {
            let (q, r) = householder_qr(a, m, n);
            match output {
                QrOutput::Q => q,
                QrOutput::R => r,
            }
        }
        Rectangular::Svd(output) => {
            let (u, s, vt) = jacobi_svd(a, m, n);
            match output {
                SvdOutput::U => u,
                SvdOutput::S => s,
                SvdOutput::Vt => vt,
            }
        }
    }
}

pub(crate) fn eval(op: Linalg, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let ad = ins[0].dims().to_vec();
    if let Some(rect) = op.rectangular() {
        let (m, n) = (ad[ad.len() - 2], ad[ad.len() - 1]);
        let batch: usize = ad[..ad.len() - 2].iter().product();
        let a = ins[0].f64s();
        let mut res = Vec::new();
        for b in 0..batch {
            let am = &a[b * m * n..(b + 1) * m * n];
            res.extend(rectangular(rect, am, m, n));
        }
        let dims = out.static_dims().unwrap_or_default();
        return Ok(Tensor::from_f64(&dims, out.dtype(), res));
    }
    let n = ad[ad.len() - 1];
    let batch: usize = ad[..ad.len() - 2].iter().product();
    let a = ins[0].f64s();
    let b = ins.get(1).map(|t| t.f64s());
    let k = ins.get(1).map_or(n, |t| *t.dims().last().unwrap_or(&1));
    let mut res = Vec::new();
    for m in 0..batch {
        let am = &a[m * n * n..(m + 1) * n * n];
        match op {
            Linalg::Solve => {
                let mut f = am.to_vec();
                let (perm, _) = lu(&mut f, n);
                if (0..n).any(|i| f[i * n + i] == 0.0) {
                    return Err(Error::op("solve", crate::singular(m, batch)));
                }
                let bm = &b.as_ref().expect("two operands")[m * n * k..(m + 1) * n * k];
                res.extend(lu_solve(&f, &perm, bm, n, k));
            }
            Linalg::TriangularSolve { lower } => {
                if (0..n).any(|i| am[i * n + i] == 0.0) {
                    return Err(Error::op("triangular_solve", crate::singular(m, batch)));
                }
                let mut x = b.as_ref().expect("two operands")[m * n * k..(m + 1) * n * k].to_vec();
                substitute(am, &mut x, n, k, lower, false);
                res.extend(x);
            }
            Linalg::Inv => {
                let mut f = am.to_vec();
                let (perm, _) = lu(&mut f, n);
                if (0..n).any(|i| f[i * n + i] == 0.0) {
                    return Err(Error::op("inv", crate::singular(m, batch)));
                }
                let eye: Vec<f64> = (0..n * n).map(|i| f64::from(i / n == i % n)).collect();
                res.extend(lu_solve(&f, &perm, &eye, n, n));
            }
            Linalg::Det => {
                let mut f = am.to_vec();
                let (_, sign) = lu(&mut f, n);
                res.push((0..n).map(|i| f[i * n + i]).product::<f64>() * sign);
            }
            Linalg::LogAbsDet => {
                let mut f = am.to_vec();
                lu(&mut f, n);
                res.push((0..n).map(|i| f[i * n + i].abs().ln()).sum::<f64>());
            }
            Linalg::Eigh { output } => {
                let (w, v) = jacobi_eigh(am, n);
                res.extend(match output {
                    EighOutput::Values => w,
                    EighOutput::Vectors => v,
                });
            }
            // Answered above.
            Linalg::Qr { .. } | Linalg::Svd { .. } => {}
            Linalg::Cholesky => {
                // Only the lower triangle is read; a matrix that is not positive definite is an
                // error naming its first leading minor that is not positive.
                let mut l = vec![0.0; n * n];
                for i in 0..n {
                    for j in 0..=i {
                        let s: f64 = (0..j).map(|p| l[i * n + p] * l[j * n + p]).sum();
                        if i == j {
                            let d = am[i * n + i] - s;
                            if d.is_nan() || d <= 0.0 {
                                return Err(Error::op(
                                    "cholesky",
                                    crate::not_positive_definite(m, batch, i + 1),
                                ));
                            }
                            l[i * n + i] = d.sqrt();
                        } else {
                            l[i * n + j] = (am[i * n + j] - s) / l[j * n + j];
                        }
                    }
                }
                res.extend(l);
            }
        }
    }
    let dims = out.static_dims().unwrap_or_default();
    Ok(Tensor::from_f64(&dims, out.dtype(), res))
}
