//! The CPU kernels of the ops, on `faer`, one matrix of the batch at a time (f32 values are
//! computed in f64 and rounded once).

use crate::{EighOutput, Linalg, QrOutput, Rectangular, SvdOutput};
use faer::linalg::solvers::{DenseSolveCore, Solve};
use faer::Mat;
use faer::MatRef;
use rlx_ir::ops::DefinedOp;
use rlx_ir::{DType, Shape};
use std::sync::Arc;

/// Little-endian f32 / f64 bytes as f64.
fn read(bytes: &[u8], dt: DType) -> Vec<f64> {
    match dt {
        DType::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
            .collect(),
    }
}

/// `vals` written as `dt`'s little-endian bytes into `out`.
fn write(vals: &[f64], dt: DType, out: &mut [u8]) {
    match dt {
        DType::F64 => {
            for (o, v) in out.chunks_exact_mut(8).zip(vals) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        _ => {
            for (o, v) in out.chunks_exact_mut(4).zip(vals) {
                o.copy_from_slice(&(*v as f32).to_le_bytes());
            }
        }
    }
}

fn mat(v: &[f64], rows: usize, cols: usize) -> Mat<f64> {
    Mat::from_fn(rows, cols, |i, j| v[i * cols + j])
}

fn flat(m: MatRef<'_, f64>) -> Vec<f64> {
    (0..m.nrows())
        .flat_map(|i| (0..m.ncols()).map(move |j| m[(i, j)]))
        .collect()
}

/// `eigh` of one symmetrized matrix: ascending eigenvalues or the eigenvectors (row-major,
/// columns with their largest entry positive); NaNs if the iteration fails.
fn eigh(am: &Mat<f64>, output: EighOutput) -> Vec<f64> {
    let n = am.nrows();
    let s = Mat::from_fn(n, n, |i, j| 0.5 * (am[(i, j)] + am[(j, i)]));
    let Ok(e) = s.self_adjoint_eigen(faer::Side::Lower) else {
        return vec![
            f64::NAN;
            if output == EighOutput::Values {
                n
            } else {
                n * n
            }
        ];
    };
    match output {
        EighOutput::Values => (0..n).map(|i| e.S()[i]).collect(),
        EighOutput::Vectors => {
            let mut v = flat(e.U());
            crate::reference::fix_eigenvector_signs(&mut v, n);
            v
        }
    }
}

/// The reduced QR factorization of one `m × n` matrix with `r`'s diagonal non-negative: `q`
/// (`m × k`) or `r` (`k × n`), row-major.
fn qr(am: &Mat<f64>, output: QrOutput) -> Vec<f64> {
    let (m, n) = (am.nrows(), am.ncols());
    let k = m.min(n);
    let f = am.qr();
    let r0 = f.thin_R();
    let mut r = Mat::from_fn(k, n, |i, j| if j >= i { r0[(i, j)] } else { 0.0 });
    let flip: Vec<bool> = (0..k).map(|i| r[(i, i)] < 0.0).collect();
    match output {
        QrOutput::Q => {
            let mut q = f.compute_thin_Q();
            for (i, _) in flip.iter().enumerate().filter(|(_, &f)| f) {
                for p in 0..m {
                    q[(p, i)] = -q[(p, i)];
                }
            }
            flat(q.as_ref())
        }
        // R alone: Q is never formed.
        QrOutput::R => {
            for (i, _) in flip.iter().enumerate().filter(|(_, &f)| f) {
                for j in 0..n {
                    r[(i, j)] = -r[(i, j)];
                }
            }
            flat(r.as_ref())
        }
    }
}

/// The reduced SVD of one `m × n` matrix, singular values descending, each column of `u` with
/// its largest entry positive (the matching row of `vt` flipped with it): `u` (`m × k`), `s`
/// (`k`) or `vt` (`k × n`), row-major; NaNs if the iteration fails.
fn svd(am: &Mat<f64>, output: SvdOutput) -> Vec<f64> {
    let (m, n) = (am.nrows(), am.ncols());
    let k = m.min(n);
    if output == SvdOutput::S {
        // The values alone: no singular vectors are formed.
        return match am.singular_values() {
            Ok(s) => s,
            Err(_) => vec![f64::NAN; k],
        };
    }
    let Ok(f) = am.thin_svd() else {
        let len = match output {
            SvdOutput::U => m * k,
            SvdOutput::S => k,
            SvdOutput::Vt => k * n,
        };
        return vec![f64::NAN; len];
    };
    let (mut u, sv, mut v) = (f.U().to_owned(), f.S(), f.V().to_owned());
    let u0 = u.clone();
    crate::reference::fix_singular_vector_signs(
        |i, j| u0[(i, j)],
        m,
        k,
        |j| {
            for i in 0..m {
                u[(i, j)] = -u[(i, j)];
            }
            for i in 0..n {
                v[(i, j)] = -v[(i, j)];
            }
        },
    );
    match output {
        SvdOutput::U => flat(u.as_ref()),
        SvdOutput::S => (0..k).map(|i| sv[i]).collect(),
        SvdOutput::Vt => flat(v.transpose()),
    }
}

/// One op on operands `ins` (dense bytes and shapes) into `out`.
fn run(op: Linalg, ins: &[(&[u8], &Shape)], out: &mut [u8], out_shape: &Shape) {
    let (abytes, ashape) = ins[0];
    let dt = ashape.dtype();
    let ad = ashape.static_dims().unwrap_or_default();
    if let Some(rect) = op.rectangular() {
        // One `m × n` matrix at a time.
        let (m, n) = (ad[ad.len() - 2], ad[ad.len() - 1]);
        let batch: usize = ad[..ad.len() - 2].iter().product();
        let a = read(abytes, dt);
        let one = |b: usize| {
            let slice = &a[b * m * n..(b + 1) * m * n];
            if rect == Rectangular::Svd(SvdOutput::S) {
                // aᵀ (the row-major data read column-major) has a's singular values.
                return MatRef::from_column_major_slice(slice, n, m)
                    .singular_values()
                    .unwrap_or_else(|_| vec![f64::NAN; m.min(n)]);
            }
            let am = mat(slice, m, n);
            match rect {
                Rectangular::Svd(output) => svd(&am, output),
                Rectangular::Qr(output) => qr(&am, output),
            }
        };
        let res: Vec<f64> = (0..batch).flat_map(one).collect();
        write(&res, dt, out);
        return;
    }
    let n = ad[ad.len() - 1];
    let batch: usize = ad[..ad.len() - 2].iter().product();
    let a = read(abytes, dt);
    let b = ins.get(1).map(|(bytes, _)| read(bytes, dt));
    let k = ins
        .get(1)
        .and_then(|(_, s)| s.static_dims())
        .and_then(|d| d.last().copied())
        .unwrap_or(n);
    let mut res = Vec::with_capacity(out_shape.numel().unwrap_or(0));
    for m in 0..batch {
        let am = mat(&a[m * n * n..(m + 1) * n * n], n, n);
        match op {
            Linalg::Solve => {
                let bm = mat(
                    &b.as_ref().expect("two operands")[m * n * k..(m + 1) * n * k],
                    n,
                    k,
                );
                // The row-major operand read column-major is aᵀ: factor it in place of a copy
                // and solve (aᵀ)ᵀ x = b.
                let at = MatRef::from_column_major_slice(&a[m * n * n..(m + 1) * n * n], n, n);
                res.extend(flat(at.partial_piv_lu().solve_transpose(&bm).as_ref()));
            }
            Linalg::TriangularSolve { lower } => {
                // Only the triangle named is read.
                let t = Mat::from_fn(n, n, |i, j| {
                    if i == j || (i > j) == lower {
                        am[(i, j)]
                    } else {
                        0.0
                    }
                });
                let mut x = mat(
                    &b.as_ref().expect("two operands")[m * n * k..(m + 1) * n * k],
                    n,
                    k,
                );
                if lower {
                    t.solve_lower_triangular_in_place(&mut x);
                } else {
                    t.solve_upper_triangular_in_place(&mut x);
                }
                res.extend(flat(x.as_ref()));
            }
            Linalg::Inv => res.extend(flat(am.partial_piv_lu().inverse().as_ref())),
            Linalg::Eigh { output } => res.extend(eigh(&am, output)),
            // Answered above.
            Linalg::Qr { .. } | Linalg::Svd { .. } => {}
            Linalg::Det => res.push(am.as_ref().determinant()),
            Linalg::LogAbsDet => {
                // log |det| from the LU factors' diagonal, with no overflow.
                let lu = am.partial_piv_lu();
                let u = lu.U();
                res.push((0..n).map(|i| u[(i, i)].abs().ln()).sum());
            }
            Linalg::Cholesky => {
                // The lower triangle only; not positive definite: NaNs (JAX's answer).
                let sym = Mat::from_fn(n, n, |i, j| if i >= j { am[(i, j)] } else { am[(j, i)] });
                match sym.llt(faer::Side::Lower) {
                    Ok(l) => {
                        let l = l.L();
                        res.extend((0..n * n).map(|p| {
                            let (i, j) = (p / n, p % n);
                            if i >= j {
                                l[(i, j)]
                            } else {
                                0.0
                            }
                        }))
                    }
                    Err(_) => res.extend(std::iter::repeat_n(f64::NAN, n * n)),
                }
            }
        }
    }
    write(&res, dt, out);
}

/// The matrix size from which a kernel splits its work over the program's threads.
const PARALLEL_FROM: usize = 1024;

/// Give the CPU backend a kernel for each op.
pub(crate) fn register() {
    for r in crate::REGISTRATIONS {
        rlx_cpu::kernels::registered::register_kernel(
            r.name,
            Arc::new(
                |op: &DefinedOp,
                 ins: &[(&[u8], &Shape)],
                 out: &mut [u8],
                 shape: &Shape,
                 pool: &rlx_cpu::pool::Pool| {
                    let op = *op.downcast::<Linalg>().expect("an op of rlx-linalg");
                    // faer splits a factorization of a large matrix over as many threads as
                    // the program has (its rayon pool; RLX's own waits on this step
                    // meanwhile); below PARALLEL_FROM rows, sharing the work costs more than
                    // it saves.
                    let n = ins[0].1.static_dims().map_or(0, |d| d[d.len() - 1]);
                    faer::set_global_parallelism(match pool.threads() {
                        t if t > 1 && n >= PARALLEL_FROM => faer::Par::rayon(t),
                        _ => faer::Par::Seq,
                    });
                    run(op, ins, out, shape)
                },
            ),
        );
    }
}
