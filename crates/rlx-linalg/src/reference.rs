//! The reference evaluator of the ops: textbook algorithms in f64 (LU with partial pivoting,
//! Cholesky–Banachiewicz, substitution), one matrix of the batch at a time.

use crate::Linalg;
use rlx_ir::eval::Tensor;
use rlx_ir::{Result, Shape};

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

pub(crate) fn eval(op: Linalg, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let ad = ins[0].dims().to_vec();
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
                let bm = &b.as_ref().expect("two operands")[m * n * k..(m + 1) * n * k];
                res.extend(lu_solve(&f, &perm, bm, n, k));
            }
            Linalg::TriangularSolve { lower } => {
                let mut x = b.as_ref().expect("two operands")[m * n * k..(m + 1) * n * k].to_vec();
                substitute(am, &mut x, n, k, lower, false);
                res.extend(x);
            }
            Linalg::Inv => {
                let mut f = am.to_vec();
                let (perm, _) = lu(&mut f, n);
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
            Linalg::Cholesky => {
                // Only the lower triangle is read; a matrix that is not positive definite gives
                // NaNs, as LAPACK-backed JAX does.
                let mut l = vec![0.0; n * n];
                let mut ok = true;
                for i in 0..n {
                    for j in 0..=i {
                        let s: f64 = (0..j).map(|p| l[i * n + p] * l[j * n + p]).sum();
                        if i == j {
                            let d = am[i * n + i] - s;
                            ok &= d > 0.0;
                            l[i * n + i] = d.max(0.0).sqrt();
                        } else {
                            l[i * n + j] = (am[i * n + j] - s) / l[j * n + j];
                        }
                    }
                }
                if !ok {
                    l.iter_mut().for_each(|v| *v = f64::NAN);
                }
                res.extend(l);
            }
        }
    }
    let dims = out.static_dims().unwrap_or_default();
    Ok(Tensor::from_f64(&dims, out.dtype(), res))
}
