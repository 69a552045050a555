//! Sparse matrices for RLX, built on an op registered from outside the IR
//! (`rlx_ir::ops::register`):
//!
//! - [`Coo`] and [`Csr`]: a sparse `m × n` matrix as IR values (integer row / column indices or
//!   row pointers, and the nonzero values), so its values can be params, inputs or computed,
//!   and gradients reach them;
//! - `spmm{m}(rows, cols, values, dense)`: the sparse × dense product (SpMM for `dense [n, k]`,
//!   SpMV for `dense [n]`), its rules an [`OpDef`]: shape inference, a reference evaluator, a
//!   decomposition into `gather`, a product and `scatter_add` (so every backend runs it and
//!   autodiff and vmap go through it: gradients with respect to the values and the dense
//!   operand), and a native CPU kernel ([`register`]);
//! - `spmm_csr(indptr, indices, values, dense)`: the same product with the matrix in
//!   compressed-row form ([`Csr::matmul`], [`SpmmCsr`]), as scipy's CSR product computes it:
//!   its decomposition expands the row pointers into rows in `O(m + nnz)` and runs `spmm`'s;
//!   its CPU kernel splits rows over threads by their entry counts and, for f32 values with
//!   i32 columns, gathers sixteen dense values a step with AVX-512;
//! - [`cg`]: a conjugate-gradient solve of `a x = b` for symmetric positive definite `a`, as an
//!   RLX `while` bounded by `max_iterations` (so reverse mode, forward mode and vmap go through
//!   it).
//!
//! Indices must lie in range (`rows < m`, `cols < n`); entries outside are skipped by the
//! reference evaluator and the CPU kernel (a backend running the decomposition does not check
//! them).

#![deny(missing_docs)]

use rlx_cpu::kernels::registered::view;
use rlx_cpu::kernels::{par_ranges, Ptr};
use rlx_cpu::pool::Pool;
use rlx_ir::eval::Tensor;
use rlx_ir::ops::{Cost, DefinedOp, OpDef, OpRegistration};
use rlx_ir::text::Attr;
use rlx_ir::{BinaryOp, CmpOp, DType, Error, Graph, NodeId, Op, ReduceKind, Result, Shape};
use std::sync::Arc;

mod csr;
pub use csr::SpmmCsr;

/// `spmm{m}(rows [nnz], cols [nnz], values [nnz], dense [n] or [n, k]) -> [m] or [m, k]`:
/// `y[rows[e]] += values[e] * dense[cols[e]]` for every entry `e`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spmm {
    /// Rows of the sparse matrix (and of the result).
    pub m: usize,
}

/// The registration of `spmm` (or call [`register`]).
pub const REGISTRATION: OpRegistration = OpRegistration {
    name: "spmm",
    from_attrs: |a| Ok(DefinedOp::new(Spmm { m: a.usize("m")? })),
    examples: || vec![DefinedOp::new(Spmm { m: 3 })],
};

/// The registration of `spmm_csr` (or call [`register`]).
pub const CSR_REGISTRATION: OpRegistration = OpRegistration {
    name: "spmm_csr",
    from_attrs: |_| Ok(DefinedOp::new(SpmmCsr)),
    examples: || vec![DefinedOp::new(SpmmCsr)],
};

/// Register `spmm` and `spmm_csr` with the IR and their kernels with the CPU backend (again is
/// a no-op).
pub fn register() -> Result<()> {
    rlx_ir::ops::register(REGISTRATION)?;
    rlx_ir::ops::register(CSR_REGISTRATION)?;
    rlx_cpu::kernels::registered::register_kernel(
        "spmm_csr",
        Arc::new(
            |_: &DefinedOp, ins: &[(&[u8], &Shape)], out: &mut [u8], shape: &Shape, pool: &Pool| {
                csr::kernel(ins, out, shape, pool)
            },
        ),
    );
    rlx_wgpu::register_kernel(
        "spmm_csr",
        Arc::new(|_: &DefinedOp, ins: &[&Shape], out: &Shape| csr::wgsl_kernel(ins, out)),
    );
    rlx_cuda::register_kernel(
        "spmm_csr",
        Arc::new(|_: &DefinedOp, ins: &[&Shape], out: &Shape| csr::cuda_kernel(ins, out)),
    );
    rlx_cpu::kernels::registered::register_kernel(
        "spmm",
        Arc::new(
            |op: &DefinedOp,
             ins: &[(&[u8], &Shape)],
             out: &mut [u8],
             shape: &Shape,
             pool: &Pool| {
                let m = op.downcast::<Spmm>().map_or(0, |s| s.m);
                kernel(m, ins, out, shape, pool)
            },
        ),
    );
    Ok(())
}

/// The cost of a sparse × dense product: operands `[.., .., values [nnz], dense [n, k]]`.
pub(crate) fn product_cost(ins: &[&Shape], out: &Shape) -> Cost {
    let nnz = ins[2].numel().unwrap_or(0) as u64;
    let k = ins[3]
        .static_dims()
        .and_then(|d| d.get(1).copied())
        .unwrap_or(1) as u64;
    let bytes = ins
        .iter()
        .chain([&out])
        .map(|s| s.size_bytes().unwrap_or(0) as u64)
        .sum();
    Cost {
        flops: 2 * nnz * k,
        bytes,
    }
}

/// That `dense` has the sparse matrix's `shape.1` rows (for `op`).
fn check_dense(g: &Graph, op: &str, shape: (usize, usize), dense: NodeId) -> Result<()> {
    let n = g
        .shape(dense)
        .static_dims()
        .and_then(|d| d.first().copied());
    if n != Some(shape.1) {
        return Err(Error::op(
            op,
            format!(
                "a {}x{} sparse matrix times dense {}",
                shape.0,
                shape.1,
                g.shape(dense)
            ),
        ));
    }
    Ok(())
}

fn int(d: DType) -> bool {
    matches!(d, DType::I32 | DType::I64)
}

impl Spmm {
    fn err(&self, msg: String) -> Error {
        Error::op("spmm", msg)
    }
}

impl OpDef for Spmm {
    fn name(&self) -> &'static str {
        "spmm"
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![("m", Attr::from(self.m))]
    }

    fn arity(&self) -> (usize, usize) {
        (4, 4)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let (rows, cols, values, dense) = (ins[0], ins[1], ins[2], ins[3]);
        let dims = |s: &Shape| {
            s.static_dims()
                .ok_or_else(|| self.err(format!("{s} needs static dimensions")))
        };
        let (rd, cd, vd, dd) = (dims(rows)?, dims(cols)?, dims(values)?, dims(dense)?);
        if !int(rows.dtype()) || !int(cols.dtype()) || rd.len() != 1 || cd != rd {
            return Err(self.err(format!(
                "rows {rows} and cols {cols} must be integer vectors of one length"
            )));
        }
        if !values.dtype().is_float() || vd != rd {
            return Err(self.err(format!(
                "values {values} must be a float vector of the {} entries",
                rd[0]
            )));
        }
        if dense.dtype() != values.dtype() || !(1..=2).contains(&dd.len()) {
            return Err(self.err(format!(
                "dense {dense} must be [n] or [n, k] of {}",
                values.dtype()
            )));
        }
        let mut out = dd.clone();
        out[0] = self.m;
        Ok(Shape::new(&out, values.dtype()))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let (rows, cols, values, dense) =
            (ins[0].i64s(), ins[1].i64s(), ins[2].f64s(), ins[3].f64s());
        let n = ins[3].dims()[0];
        let k = ins[3].dims().get(1).copied().unwrap_or(1);
        let mut y = vec![0.0; self.m * k];
        for e in 0..values.len() {
            let (r, c) = (rows[e], cols[e]);
            if r < 0 || c < 0 || r as usize >= self.m || c as usize >= n {
                continue;
            }
            for j in 0..k {
                y[r as usize * k + j] += values[e] * dense[c as usize * k + j];
            }
        }
        let dims = out.static_dims().unwrap_or_default();
        Ok(Tensor::from_f64(&dims, out.dtype(), y))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        product_cost(ins, out)
    }

    /// `scatter_add(zeros [m, k], rows, values · gather(dense, cols))`.
    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some((|| {
            let (rows, cols, values, dense) = (ins[0], ins[1], ins[2], ins[3]);
            let gathered = g.try_gather(dense, cols, 0)?;
            let vals = if g.shape(dense).rank() == 2 {
                let nnz = g.shape(values).numel().unwrap_or(0);
                g.try_op(
                    Op::Reshape {
                        shape: vec![nnz, 1],
                    },
                    &[values],
                )?
            } else {
                values
            };
            let prod = g.try_mul(gathered, vals)?;
            let mut out = g.shape(dense).static_dims().unwrap_or_default();
            out[0] = self.m;
            let dt = g.shape(values).dtype();
            let zero = g.try_scalar(0.0, dt)?;
            let zeros = g.try_op(Op::Expand { shape: out }, &[zero])?;
            g.try_scatter_add(zeros, rows, prod, 0)
        })())
    }

    fn batchable(&self, _batched: &[bool]) -> bool {
        false
    }
}

/// The CPU kernel: `y[rows[e]] += values[e] * dense[cols[e]]` in the values' type (f32 or f64
/// with rows and columns both i32 or both i64 read in place; other types through f64). When the rows are sorted
/// (as a CSR matrix's are) the result's rows are split over the pool, each thread summing the
/// entries of its rows in order; otherwise one thread sums every entry in order.
fn kernel(m: usize, ins: &[(&[u8], &Shape)], out: &mut [u8], shape: &Shape, pool: &Pool) {
    let dd = ins[3].1.static_dims().unwrap_or_default();
    let (n, k) = (dd[0], dd.get(1).copied().unwrap_or(1));
    let dt = shape.dtype();
    let idt = ins[0].1.dtype();
    macro_rules! fast {
        ($i:ty, $t:ty) => {{
            let (rows, cols) = (view::<$i>(ins[0].0), view::<$i>(ins[1].0));
            let (v, d) = (view::<$t>(ins[2].0), view::<$t>(ins[3].0));
            if (out.as_ptr() as usize).is_multiple_of(std::mem::align_of::<$t>()) {
                out.fill(0);
                // SAFETY: `out` holds m·k values of the type, aligned for it; zero bytes are 0.
                let y = unsafe {
                    std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut $t, m * k)
                };
                products(&rows, &cols, &v, &d, y, (m, n, k), pool);
            } else {
                let mut y = vec![<$t>::default(); m * k];
                products(&rows, &cols, &v, &d, &mut y, (m, n, k), pool);
                for (o, x) in out.chunks_exact_mut(std::mem::size_of::<$t>()).zip(&y) {
                    o.copy_from_slice(&x.to_le_bytes());
                }
            }
        }};
    }
    // Rows and columns of one index type are read in place; mixed types go the general way.
    let same = ins[1].1.dtype() == idt;
    match (idt, dt) {
        (DType::I32, DType::F32) if same => fast!(i32, f32),
        (DType::I64, DType::F32) if same => fast!(i64, f32),
        (DType::I32, DType::F64) if same => fast!(i32, f64),
        (DType::I64, DType::F64) if same => fast!(i64, f64),
        _ => {
            let ints = |(b, s): (&[u8], &Shape)| -> Vec<i64> {
                Tensor::from_bytes(s, b)
                    .map(|t| t.i64s())
                    .unwrap_or_default()
            };
            let floats = |(b, s): (&[u8], &Shape)| -> Vec<f64> {
                Tensor::from_bytes(s, b)
                    .map(|t| t.f64s())
                    .unwrap_or_default()
            };
            let (rows, cols) = (ints(ins[0]), ints(ins[1]));
            let (v, d) = (floats(ins[2]), floats(ins[3]));
            let mut y = vec![0f64; m * k];
            accumulate(&rows, &cols, m, n, |e, r, c| {
                for j in 0..k {
                    y[r * k + j] += v[e] * d[c * k + j];
                }
            });
            let t = Tensor::from_f64(&[m * k], dt, y);
            out.copy_from_slice(&t.to_bytes());
        }
    }
}

/// An index type of the sparse operands; a negative index becomes one too large to be in
/// range.
trait Index: Copy + Sync {
    fn at(self) -> usize;
}

impl Index for i32 {
    #[inline(always)]
    fn at(self) -> usize {
        self as u32 as usize
    }
}

impl Index for i64 {
    #[inline(always)]
    fn at(self) -> usize {
        self as u64 as usize
    }
}

/// `y += values · dense` over the entries (out-of-range ones skipped), split over the pool by
/// rows when the rows are sorted.
fn products<I: Index, T>(
    rows: &[I],
    cols: &[I],
    v: &[T],
    d: &[T],
    y: &mut [T],
    (m, n, k): (usize, usize, usize),
    pool: &Pool,
) where
    T: Copy + Default + std::ops::Mul<Output = T> + std::ops::AddAssign + Send + Sync,
{
    // Entries lo..hi into `y`, whose first row is `first_row`.
    let sum = |lo: usize, hi: usize, y: &mut [T], first_row: usize| {
        if k == 1 {
            // One row at a time (the rows are sorted), its sum in four registers so the adds
            // do not wait on each other.
            let mut e = lo;
            while e < hi {
                let r = rows[e].at();
                let mut t = e + 1;
                while t < hi && rows[t].at() == r {
                    t += 1;
                }
                if r < m {
                    let term = |i: usize| {
                        let c = cols[i].at();
                        if c < n {
                            // SAFETY: c < n = d.len().
                            v[i] * unsafe { *d.get_unchecked(c) }
                        } else {
                            T::default()
                        }
                    };
                    let mut acc = [T::default(); 4];
                    let mut i = e;
                    while i + 4 <= t {
                        for (j, a) in acc.iter_mut().enumerate() {
                            *a += term(i + j);
                        }
                        i += 4;
                    }
                    for i in i..t {
                        acc[0] += term(i);
                    }
                    let (mut s01, mut s23) = (acc[0], acc[2]);
                    s01 += acc[1];
                    s23 += acc[3];
                    s01 += s23;
                    y[r - first_row] += s01;
                }
                e = t;
            }
            return;
        }
        for e in lo..hi {
            let (r, c) = (rows[e].at(), cols[e].at());
            if r < m && c < n {
                let (yr, dc) = ((r - first_row) * k, c * k);
                for (yv, &dv) in y[yr..yr + k].iter_mut().zip(&d[dc..dc + k]) {
                    *yv += v[e] * dv;
                }
            }
        }
    };
    let sorted = rows.windows(2).all(|w| w[0].at() <= w[1].at());
    if !sorted || pool.threads() < 2 || rows.len() < 1 << 14 {
        if sorted {
            sum(0, rows.len(), y, 0);
        } else {
            // Rows in any order: every row of y is this part's.
            for e in 0..rows.len() {
                let (r, c) = (rows[e].at(), cols[e].at());
                if r < m && c < n {
                    for j in 0..k {
                        y[r * k + j] += v[e] * d[c * k + j];
                    }
                }
            }
        }
        return;
    }
    let at = |row: usize| rows.partition_point(|&r| r.at() < row);
    let yp = Ptr(y.as_mut_ptr() as *mut u8);
    par_ranges(pool, m, 64, |rr| {
        // SAFETY: each range of rows owns its own rows of `y`.
        let part = unsafe {
            std::slice::from_raw_parts_mut((yp.get() as *mut T).add(rr.start * k), rr.len() * k)
        };
        sum(at(rr.start), at(rr.end), part, rr.start);
    });
}

/// `f(entry, row, col)` for every entry whose indices are in range.
fn accumulate(
    rows: &[i64],
    cols: &[i64],
    m: usize,
    n: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    for (e, (&r, &c)) in rows.iter().zip(cols).enumerate() {
        if r >= 0 && c >= 0 && (r as usize) < m && (c as usize) < n {
            f(e, r as usize, c as usize);
        }
    }
}

/// A sparse `m × n` matrix in coordinate form: entry `e` is `values[e]` at `(rows[e],
/// cols[e])` (duplicates add up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coo {
    /// Row index of each entry (i32 or i64, `[nnz]`).
    pub rows: NodeId,
    /// Column index of each entry.
    pub cols: NodeId,
    /// The entries' values (a float vector `[nnz]`).
    pub values: NodeId,
    /// Rows and columns.
    pub shape: (usize, usize),
}

/// A sparse `m × n` matrix in compressed-row form: the entries of row `i` are
/// `indptr[i]..indptr[i + 1]` of `indices` (their columns) and `values`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Csr {
    /// Row pointers (`[m + 1]`, i32 or i64).
    pub indptr: NodeId,
    /// Column index of each entry.
    pub indices: NodeId,
    /// The entries' values.
    pub values: NodeId,
    /// Rows and columns.
    pub shape: (usize, usize),
}

impl Coo {
    /// `self · dense` (`dense [n]` or `[n, k]`).
    pub fn matmul(&self, g: &mut Graph, dense: NodeId) -> Result<NodeId> {
        register()?;
        check_dense(g, "spmm", self.shape, dense)?;
        g.define(
            Spmm { m: self.shape.0 },
            &[self.rows, self.cols, self.values, dense],
        )
    }

    /// The transpose (rows and columns swapped; no data moves).
    pub fn transpose(&self) -> Coo {
        Coo {
            rows: self.cols,
            cols: self.rows,
            values: self.values,
            shape: (self.shape.1, self.shape.0),
        }
    }
}

impl Csr {
    /// The same matrix in coordinate form: each entry's row, `rows[e] = #{i ≥ 1 : indptr[i] ≤
    /// e}`, computed in the graph (a one at each row's end pointer, summed by `cumsum`: `O(m +
    /// nnz)`), so it runs wherever the graph runs.
    pub fn to_coo(&self, g: &mut Graph) -> Result<Coo> {
        self.check(g)?;
        let nnz = g.shape(self.values).numel().unwrap_or(0);
        let rows = csr::rows_of(g, self.indptr, nnz)?;
        Ok(Coo {
            rows,
            cols: self.indices,
            values: self.values,
            shape: self.shape,
        })
    }

    /// `self · dense` (`dense [n]` or `[n, k]`): `spmm_csr`.
    pub fn matmul(&self, g: &mut Graph, dense: NodeId) -> Result<NodeId> {
        register()?;
        self.check(g)?;
        check_dense(g, "spmm_csr", self.shape, dense)?;
        g.define(SpmmCsr, &[self.indptr, self.indices, self.values, dense])
    }

    /// `indptr` holds `m + 1` integer row pointers.
    fn check(&self, g: &Graph) -> Result<()> {
        let ip = g.shape(self.indptr);
        if !int(ip.dtype()) || ip.static_dims() != Some(vec![self.shape.0 + 1]) {
            return Err(Error::op(
                "csr",
                format!(
                    "indptr {ip} must be an integer vector of {} row pointers",
                    self.shape.0 + 1
                ),
            ));
        }
        Ok(())
    }
}

/// `Σ x ⊙ y` over every axis (a scalar).
fn dot(g: &mut Graph, x: NodeId, y: NodeId) -> Result<NodeId> {
    let p = g.try_binary(BinaryOp::Mul, x, y)?;
    let axes = (0..g.shape(p).rank()).collect();
    g.try_op(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes,
            keepdims: false,
        },
        &[p],
    )
}

/// Solve `a x = b` (`b [n]`) for symmetric positive definite `a` by conjugate gradients
/// (Hestenes–Stiefel), starting from `x = 0`, until `|r|² ≤ tol² |b|²` or after
/// `max_iterations` steps: an RLX `while` bounded by `max_iterations`, wrapped as a custom
/// function whose reverse-mode rule is the implicit one (JAX's `custom_linear_solve`): `b̄ =
/// cg(a, x̄)` (a is symmetric) and `ā[i, j] = -b̄[i] x[j]` at each entry, one more solve
/// instead of differentiating the iterations. Forward mode goes through the iterations.
pub fn cg(g: &mut Graph, a: &Coo, b: NodeId, tol: f64, max_iterations: usize) -> Result<NodeId> {
    register()?;
    let bs = g.shape(b).clone();
    let n = a.shape.0;
    if a.shape.0 != a.shape.1 || bs.static_dims() != Some(vec![n]) {
        return Err(Error::op(
            "cg",
            format!(
                "needs a square sparse matrix and b [{n}]; got {}x{} and {bs}",
                a.shape.0, a.shape.1
            ),
        ));
    }
    let shapes = [
        g.shape(a.rows).clone(),
        g.shape(a.cols).clone(),
        g.shape(a.values).clone(),
        bs.clone(),
    ];
    let args = |h: &mut Graph, names: &[&str]| -> Result<Vec<NodeId>> {
        names
            .iter()
            .zip(shapes.iter().chain([&bs, &bs]))
            .map(|(nm, s)| h.try_input(nm, s.clone()))
            .collect()
    };
    let coo = |v: &[NodeId]| Coo {
        rows: v[0],
        cols: v[1],
        values: v[2],
        shape: a.shape,
    };
    let mut body = Graph::new("cg");
    let v = args(&mut body, &["rows", "cols", "values", "b"])?;
    let x = cg_loop(&mut body, &coo(&v), v[3], tol, max_iterations)?;
    body.try_set_outputs(vec![x])?;
    // The implicit rule: one solve with the cotangent.
    let mut vjp = Graph::new("cg.vjp");
    let v = args(&mut vjp, &["rows", "cols", "values", "b", "x", "ct"])?;
    let lam = cg_loop(&mut vjp, &coo(&v), v[5], tol, max_iterations)?;
    let lr = vjp.try_gather(lam, v[0], 0)?;
    let xc = vjp.try_gather(v[4], v[1], 0)?;
    let p = vjp.try_mul(lr, xc)?;
    let ca = vjp.try_activation(rlx_ir::Activation::Neg, p)?;
    vjp.try_set_outputs(vec![v[0], v[1], ca, lam])?;
    g.try_custom(
        rlx_ir::CustomFn {
            name: "cg".into(),
            body: Box::new(body),
            vjp: Some(Box::new(vjp)),
            jvp: None,
        },
        &[a.rows, a.cols, a.values, b],
    )
}

/// The iterations of [`cg`] as a bounded `while`.
fn cg_loop(g: &mut Graph, a: &Coo, b: NodeId, tol: f64, max_iterations: usize) -> Result<NodeId> {
    let bs = g.shape(b).clone();
    let n = a.shape.0;
    let dt = bs.dtype();
    let scalar = Shape::new(&[], dt);
    let shapes = [
        bs.clone(),                // x
        bs.clone(),                // r
        bs.clone(),                // p
        scalar.clone(),            // |r|²
        scalar.clone(),            // the threshold
        g.shape(a.rows).clone(),   // rows
        g.shape(a.cols).clone(),   // cols
        g.shape(a.values).clone(), // values
    ];
    let names = ["x", "r", "p", "rr", "tol", "rows", "cols", "values"];
    let inputs = |h: &mut Graph| -> Result<Vec<NodeId>> {
        names
            .iter()
            .zip(&shapes)
            .map(|(nm, s)| h.try_input(nm, s.clone()))
            .collect()
    };
    // The condition: |r|² above the threshold.
    let mut cond = Graph::new("cg.cond");
    let c = inputs(&mut cond)?;
    let go = cond.try_compare(CmpOp::Gt, c[3], c[4])?;
    cond.try_set_outputs(vec![go])?;
    // One step.
    let mut body = Graph::new("cg.step");
    let v = inputs(&mut body)?;
    let (x, r, p, rr) = (v[0], v[1], v[2], v[3]);
    let am = Coo {
        rows: v[5],
        cols: v[6],
        values: v[7],
        shape: a.shape,
    };
    let ap = am.matmul(&mut body, p)?;
    let pap = dot(&mut body, p, ap)?;
    let alpha = body.try_div(rr, pap)?;
    let ax = body.try_mul(p, alpha)?;
    let x2 = body.try_add(x, ax)?;
    let aap = body.try_mul(ap, alpha)?;
    let r2 = body.try_sub(r, aap)?;
    let rr2 = dot(&mut body, r2, r2)?;
    let beta = body.try_div(rr2, rr)?;
    let bp = body.try_mul(p, beta)?;
    let p2 = body.try_add(r2, bp)?;
    body.try_set_outputs(vec![x2, r2, p2, rr2, v[4], v[5], v[6], v[7]])?;
    // x = 0, r = p = b.
    let zero = g.try_scalar(0.0, dt)?;
    let x0 = g.try_op(Op::Expand { shape: vec![n] }, &[zero])?;
    let bb = dot(g, b, b)?;
    let t2 = g.try_scalar(tol * tol, dt)?;
    let thr = g.try_mul(bb, t2)?;
    let out = g.while_loop_bounded(
        cond,
        body,
        &[x0, b, b, bb, thr, a.rows, a.cols, a.values],
        Some(max_iterations),
    )?;
    Ok(out[0])
}
