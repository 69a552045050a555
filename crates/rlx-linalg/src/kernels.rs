//! The CPU kernels of the ops, on `faer`, one matrix of the batch at a time (f32 values are
//! computed in f64 and rounded once).

use crate::{EighOutput, Linalg, QrOutput, Rectangular, SvdOutput};
use faer::linalg::solvers::DenseSolveCore;
use faer::Mat;
use faer::MatRef;
use rlx_cpu::kernels::registered::fail;
use rlx_ir::ops::DefinedOp;
use rlx_ir::{DType, Shape};
use std::sync::Arc;

/// Little-endian f32 / f64 bytes as f64.
fn read(bytes: &[u8], dt: DType) -> Vec<f64> {
    match dt {
        DType::F64 => {
            let mut v = vec![0.0f64; bytes.len() / 8];
            if cfg!(target_endian = "little") {
                // The bytes are the values: one copy.
                copy_le_f64(bytes, &mut v);
            } else {
                for (x, c) in v.iter_mut().zip(bytes.chunks_exact(8)) {
                    *x = f64::from_le_bytes(c.try_into().expect("8 bytes"));
                }
            }
            v
        }
        _ => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
            .collect(),
    }
}

/// `bytes` (little-endian f64 on a little-endian host) copied into `v`.
fn copy_le_f64(bytes: &[u8], v: &mut [f64]) {
    assert_eq!(bytes.len(), v.len() * 8, "f64 bytes");
    // SAFETY: `v` holds exactly `bytes.len()` initialized bytes and every bit pattern is an
    // f64; the regions do not overlap (`v` is owned by the caller, `bytes` borrowed).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len())
    }
}

/// `vals` written as `dt`'s little-endian bytes into `out`.
fn write(vals: &[f64], dt: DType, out: &mut [u8]) {
    match dt {
        DType::F64 if cfg!(target_endian = "little") => {
            // The values are the bytes: one copy.
            assert_eq!(out.len(), vals.len() * 8, "f64 bytes");
            // SAFETY: `out` holds exactly the bytes of `vals`, which do not overlap it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    vals.as_ptr().cast::<u8>(),
                    out.as_mut_ptr(),
                    out.len(),
                )
            }
        }
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

/// The LU factorization's recursion stops at panels this wide (faer's default is 16; 32
/// measured faster here from 256 to 2048 rows).
const LU_RECURSION: usize = 32;

/// Solve `a x = b` in place: `a` is `n × n` row-major, so read column-major it is `aᵀ`, which is
/// factored in place (`P aᵀ = L U`, partial pivoting); then `a x = b` is the transposed
/// solve. `b` (`n × k`, row-major) becomes `x`. Whether `a` is singular (an exactly zero
/// pivot, as LAPACK's `getrf` reports it; `x` then holds infinities or NaNs).
fn solve_in_place(a: &mut [f64], n: usize, b: &mut [f64], k: usize, par: faer::Par) -> bool {
    use faer::dyn_stack::{MemBuffer, MemStack};
    use faer::linalg::lu::partial_pivoting::{factor, solve};
    let mut params: factor::PartialPivLuParams = faer::Auto::<f64>::auto();
    params.recursion_threshold = LU_RECURSION;
    let mut lu = faer::MatMut::from_column_major_slice_mut(a, n, n);
    let (mut perm, mut perm_inv) = (vec![0usize; n], vec![0usize; n]);
    let mut mem = MemBuffer::new(
        factor::lu_in_place_scratch::<usize, f64>(n, n, par, params.into()).or(
            solve::solve_transpose_in_place_scratch::<usize, f64>(n, k, par),
        ),
    );
    let (_, p) = factor::lu_in_place(
        lu.as_mut(),
        &mut perm,
        &mut perm_inv,
        par,
        MemStack::new(&mut mem),
        params.into(),
    );
    let singular = (0..n).any(|i| lu[(i, i)] == 0.0);
    let x = faer::MatMut::from_row_major_slice_mut(b, n, k);
    solve::solve_transpose_in_place(lu.as_ref(), lu.as_ref(), p, x, par, MemStack::new(&mut mem));
    singular
}

/// The lower Cholesky factor of the `n × n` row-major matrix `a` in place (its lower triangle
/// read, the upper set to 0). Factored as a row-major view, which for faer is the upper factor
/// of the column-major `aᵀ`: no copy. Where `a` is not positive definite: NaNs, and the order of
/// the first leading minor that is not positive.
fn cholesky_in_place(a: &mut [f64], n: usize, par: faer::Par) -> Option<usize> {
    use faer::dyn_stack::{MemBuffer, MemStack};
    use faer::linalg::cholesky::llt::factor;
    let mut params: factor::LltParams = faer::Auto::<f64>::auto();
    // Measured on row-major views from 256 to 2048 rows (faer's defaults: 64 and 128).
    params.recursion_threshold = 32;
    params.block_size = 64;
    let mut mem = MemBuffer::new(factor::cholesky_in_place_scratch::<f64>(
        n,
        par,
        params.into(),
    ));
    let l = faer::MatMut::from_row_major_slice_mut(a, n, n);
    let result = factor::cholesky_in_place(
        l,
        Default::default(),
        par,
        MemStack::new(&mut mem),
        params.into(),
    );
    if let Err(factor::LltError::NonPositivePivot { index }) = result {
        a.fill(f64::NAN);
        return Some(index + 1);
    }
    for i in 0..n {
        a[i * n + i + 1..(i + 1) * n].fill(0.0);
    }
    None
}

/// `src` (`rows × cols`, row-major) into `dst` as its transpose (`cols × rows`, row-major),
/// in tiles so both sides stay in cache.
fn transpose(src: &[f64], rows: usize, cols: usize, dst: &mut [f64]) {
    const TILE: usize = 32;
    for i0 in (0..rows).step_by(TILE) {
        for j0 in (0..cols).step_by(TILE) {
            for i in i0..(i0 + TILE).min(rows) {
                for j in j0..(j0 + TILE).min(cols) {
                    dst[j * rows + i] = src[i * cols + j];
                }
            }
        }
    }
}

/// `r` of the reduced QR factorization of one `m × n` row-major matrix (`k × n`, `k = min(m,
/// n)`, row-major, diagonal non-negative), factored in place by Householder reflections in
/// blocks; `q` is never formed.
fn qr_r(a: &[f64], m: usize, n: usize, par: faer::Par) -> Vec<f64> {
    use faer::dyn_stack::{MemBuffer, MemStack};
    use faer::linalg::qr::no_pivoting::factor;
    let k = m.min(n);
    // Column-major `m × n` is the row-major transpose.
    let mut f = vec![0.0; m * n];
    transpose(a, m, n, &mut f);
    let block = factor::recommended_block_size::<f64>(m, n);
    let mut coeff = Mat::<f64>::zeros(block, k);
    let mut mem = MemBuffer::new(factor::qr_in_place_scratch::<f64>(
        m,
        n,
        block,
        par,
        Default::default(),
    ));
    factor::qr_in_place(
        faer::MatMut::from_column_major_slice_mut(&mut f, m, n),
        coeff.as_mut(),
        par,
        MemStack::new(&mut mem),
        Default::default(),
    );
    let mut r = vec![0.0; m * n];
    transpose(&f, n, m, &mut r);
    r.truncate(k * n);
    for (i, row) in r.chunks_exact_mut(n).enumerate() {
        row[..i].fill(0.0);
        if row[i] < 0.0 {
            row[i..].iter_mut().for_each(|v| *v = -*v);
        }
    }
    r
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

/// `q` of the reduced QR factorization of one `m × n` matrix (`m × k`, row-major), its columns
/// signed to match [`qr_r`]'s non-negative diagonal.
fn qr_q(am: &Mat<f64>) -> Vec<f64> {
    let m = am.nrows();
    let f = am.qr();
    let r = f.thin_R();
    let mut q = f.compute_thin_Q();
    for i in (0..r.nrows().min(r.ncols())).filter(|&i| r[(i, i)] < 0.0) {
        for p in 0..m {
            q[(p, i)] = -q[(p, i)];
        }
    }
    flat(q.as_ref())
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
/// `par`: how the factorizations that take it explicitly (solve, Cholesky) split their work.
fn run(op: Linalg, ins: &[(&[u8], &Shape)], out: &mut [u8], out_shape: &Shape, par: faer::Par) {
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
            match rect {
                Rectangular::Svd(output) => svd(&mat(slice, m, n), output),
                Rectangular::Qr(QrOutput::R) => qr_r(slice, m, n, par),
                Rectangular::Qr(QrOutput::Q) => qr_q(&mat(slice, m, n)),
            }
        };
        let res: Vec<f64> = (0..batch).flat_map(one).collect();
        write(&res, dt, out);
        return;
    }
    let n = ad[ad.len() - 1];
    let batch: usize = ad[..ad.len() - 2].iter().product();
    let mut a = read(abytes, dt);
    let mut b = ins.get(1).map(|(bytes, _)| read(bytes, dt));
    let k = ins
        .get(1)
        .and_then(|(_, s)| s.static_dims())
        .and_then(|d| d.last().copied())
        .unwrap_or(n);
    // Solve and Cholesky work in place on the operands' values (no copy per matrix).
    match (op, b.as_mut()) {
        (Linalg::Solve, Some(b)) => {
            if n * k > 0 {
                for (m, (am, bm)) in a
                    .chunks_exact_mut(n * n)
                    .zip(b.chunks_exact_mut(n * k))
                    .enumerate()
                {
                    if solve_in_place(am, n, bm, k, par) {
                        fail(crate::singular(m, batch));
                    }
                }
            }
            write(b, dt, out);
            return;
        }
        (Linalg::Cholesky, _) => {
            if n > 0 {
                for (m, am) in a.chunks_exact_mut(n * n).enumerate() {
                    if let Some(order) = cholesky_in_place(am, n, par) {
                        fail(crate::not_positive_definite(m, batch, order));
                    }
                }
            }
            write(&a, dt, out);
            return;
        }
        _ => {}
    }
    let mut res = Vec::with_capacity(out_shape.numel().unwrap_or(0));
    for m in 0..batch {
        let a_m = &a[m * n * n..(m + 1) * n * n];
        let b_m = || &b.as_ref().expect("two operands")[m * n * k..(m + 1) * n * k];
        let am = || mat(a_m, n, n);
        match op {
            // Answered above.
            Linalg::Solve | Linalg::Cholesky => {}
            Linalg::TriangularSolve { lower } => {
                // Only the triangle named is read.
                let t = Mat::from_fn(n, n, |i, j| {
                    if i == j || (i > j) == lower {
                        a_m[i * n + j]
                    } else {
                        0.0
                    }
                });
                if (0..n).any(|i| a_m[i * n + i] == 0.0) {
                    fail(crate::singular(m, batch));
                }
                let mut x = mat(b_m(), n, k);
                if lower {
                    t.solve_lower_triangular_in_place(&mut x);
                } else {
                    t.solve_upper_triangular_in_place(&mut x);
                }
                res.extend(flat(x.as_ref()));
            }
            Linalg::Inv => {
                let lu = am().partial_piv_lu();
                if (0..n).any(|i| lu.U()[(i, i)] == 0.0) {
                    fail(crate::singular(m, batch));
                }
                res.extend(flat(lu.inverse().as_ref()))
            }
            Linalg::Eigh { output } => res.extend(eigh(&am(), output)),
            // Answered above.
            Linalg::Qr { .. } | Linalg::Svd { .. } => {}
            Linalg::Det => res.push(am().as_ref().determinant()),
            Linalg::LogAbsDet => {
                // log |det| from the LU factors' diagonal, with no overflow.
                let lu = am().partial_piv_lu();
                let u = lu.U();
                res.push((0..n).map(|i| u[(i, i)].abs().ln()).sum());
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
                    let par = match pool.threads() {
                        t if t > 1 && n >= PARALLEL_FROM => faer::Par::rayon(t),
                        _ => faer::Par::Seq,
                    };
                    // The ops on faer's high-level API read its global setting.
                    faer::set_global_parallelism(par);
                    run(op, ins, out, shape, par)
                },
            ),
        );
    }
}
