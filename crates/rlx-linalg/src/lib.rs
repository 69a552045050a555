//! Dense linear algebra for RLX, as ops registered from outside the IR
//! (`rlx_ir::ops::register`): `solve`, `triangular_solve`, `cholesky`, `inv`, `det`,
//! `logabsdet`, `eigh`, `qr` and `svd`, batched over leading axes, on f32 and f64. Each op's rules are its [`OpDef`]:
//! shape inference (errors name the op and shapes), a reference evaluator in f64, JAX's
//! derivative rules for reverse and forward mode (written with these ops and the IR's, so they
//! differentiate again), batching for vmap, and a native CPU kernel on `faer` ([`register`]
//! gives it to the CPU backend). They have no decomposition: a backend without a kernel for
//! them (the GPU backends) refuses them by name.
//!
//! As numpy, scipy and PyTorch do (JAX returns NaNs instead), `solve`, `inv` and
//! `triangular_solve` of a singular matrix (an exactly zero pivot or diagonal entry, as LAPACK
//! reports it) and `cholesky` of a matrix that is not positive definite end the run with an
//! error naming the op, its node, which matrix of the batch and (for `cholesky`) the order of
//! its first leading minor that is not positive; the CPU kernels report it through
//! `rlx_cpu::kernels::registered::fail`, the reference evaluator as its error. `det` and
//! `logabsdet` of a singular matrix are 0 and -inf.
//!
//! Ops with several results (`eigh`'s eigenvalues and eigenvectors, `qr`'s `q` and `r`, `svd`'s
//! `u`, `s` and `vt`) are one op per result, as the IR's `top_k` is; a kernel computes the
//! factorization for each. Their gauge is fixed so results are unique where the factorization
//! is: `eigh` sorts eigenvalues ascending and makes each eigenvector's entry of largest
//! magnitude positive; `qr` makes `r`'s diagonal non-negative; `svd` sorts singular values
//! descending and makes each column of `u`'s entry of largest magnitude positive (flipping the
//! matching row of `vt`). (LAPACK, and so JAX, leaves those signs to the algorithm; the
//! derivative rules hold for any choice, and the goldens apply the same convention to JAX's
//! results.)

#![deny(missing_docs)]

use rlx_ir::eval::Tensor;
use rlx_ir::ops::{Batched, Cost, DefinedOp, OpClass, OpDef, OpRegistration};
use rlx_ir::text::Attr;
use rlx_ir::{Activation, DType, Error, Graph, NodeId, Op, ReduceKind, Result, Shape};

mod kernels;
mod reference;

/// The ops of this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Linalg {
    /// `solve(a [..., n, n], b [..., n, k]) -> x [..., n, k]` with `a x = b`.
    Solve,
    /// `triangular_solve(a [..., n, n], b [..., n, k]) -> x` with `a x = b`, `a` lower (or
    /// upper) triangular; the other triangle of `a` is not read.
    TriangularSolve {
        /// Whether `a` is lower triangular.
        lower: bool,
    },
    /// `cholesky(a [..., n, n]) -> l` lower triangular with `l lᵀ = a` (`a` symmetric positive
    /// definite; only its lower triangle is read).
    Cholesky,
    /// `inv(a [..., n, n])`.
    Inv,
    /// `det(a [..., n, n]) -> [...]`.
    Det,
    /// `logabsdet(a [..., n, n]) -> [...]`: `log |det a|` (the second result of JAX's
    /// `slogdet`), which does not overflow where `det` would.
    LogAbsDet,
    /// `eigh(a [..., n, n])`: the eigenvalues `w [..., n]` (ascending) or eigenvectors `v [...,
    /// n, n]` (columns) of the symmetric `(a + aᵀ) / 2`, with `a = v diag(w) vᵀ` (JAX's
    /// `jnp.linalg.eigh`, which symmetrizes its input the same way).
    Eigh {
        /// Which result.
        output: EighOutput,
    },
    /// `qr(a [..., m, n])`: the reduced QR factorization, `q [..., m, k]` with orthonormal
    /// columns and upper triangular `r [..., k, n]`, `k = min(m, n)`, `a = q r` (JAX's
    /// `jnp.linalg.qr`, mode "reduced"). Derivatives need `m >= n`, as in JAX.
    Qr {
        /// Which result.
        output: QrOutput,
    },
    /// `svd(a [..., m, n])`: the reduced singular value decomposition, `u [..., m, k]`, `s [...,
    /// k]` (descending, non-negative) and `vt [..., k, n]`, `k = min(m, n)`, `a = u diag(s) vt`
    /// (JAX's `jnp.linalg.svd(a, full_matrices=False)`). Derivatives of `u` and `vt` need
    /// distinct singular values, as JAX's.
    Svd {
        /// Which result.
        output: SvdOutput,
    },
}

/// An op on rectangular matrices (`qr`, `svd`), which kernels take one `m × n` matrix at a
/// time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rectangular {
    Qr(QrOutput),
    Svd(SvdOutput),
}

impl Linalg {
    /// The op as a [`Rectangular`] one, if it is.
    pub(crate) fn rectangular(self) -> Option<Rectangular> {
        match self {
            Linalg::Qr { output } => Some(Rectangular::Qr(output)),
            Linalg::Svd { output } => Some(Rectangular::Svd(output)),
            Linalg::Solve
            | Linalg::TriangularSolve { .. }
            | Linalg::Cholesky
            | Linalg::Inv
            | Linalg::Det
            | Linalg::LogAbsDet
            | Linalg::Eigh { .. } => None,
        }
    }
}

/// Which result of [`Linalg::Svd`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SvdOutput {
    /// The left singular vectors (columns).
    U,
    /// The singular values, descending.
    S,
    /// The right singular vectors (rows).
    Vt,
}

impl SvdOutput {
    fn name(self) -> &'static str {
        match self {
            SvdOutput::U => "u",
            SvdOutput::S => "s",
            SvdOutput::Vt => "vt",
        }
    }
}

/// Which result of [`Linalg::Eigh`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EighOutput {
    /// The eigenvalues, ascending.
    Values,
    /// The eigenvectors, as columns in the eigenvalues' order.
    Vectors,
}

/// Which result of [`Linalg::Qr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QrOutput {
    /// The orthonormal factor.
    Q,
    /// The upper triangular factor.
    R,
}

impl EighOutput {
    fn name(self) -> &'static str {
        match self {
            EighOutput::Values => "values",
            EighOutput::Vectors => "vectors",
        }
    }
}

impl QrOutput {
    fn name(self) -> &'static str {
        match self {
            QrOutput::Q => "q",
            QrOutput::R => "r",
        }
    }
}

/// The registrations of the ops (`rlx_ir::ops::register` each, or call [`register`]).
pub const REGISTRATIONS: [OpRegistration; 9] = [
    OpRegistration {
        name: "solve",
        from_attrs: |_| Ok(DefinedOp::new(Linalg::Solve)),
        examples: || vec![DefinedOp::new(Linalg::Solve)],
    },
    OpRegistration {
        name: "triangular_solve",
        from_attrs: |a| {
            Ok(DefinedOp::new(Linalg::TriangularSolve {
                lower: a.bool("lower")?,
            }))
        },
        examples: || {
            [true, false]
                .map(|lower| DefinedOp::new(Linalg::TriangularSolve { lower }))
                .to_vec()
        },
    },
    OpRegistration {
        name: "cholesky",
        from_attrs: |_| Ok(DefinedOp::new(Linalg::Cholesky)),
        examples: || vec![DefinedOp::new(Linalg::Cholesky)],
    },
    OpRegistration {
        name: "inv",
        from_attrs: |_| Ok(DefinedOp::new(Linalg::Inv)),
        examples: || vec![DefinedOp::new(Linalg::Inv)],
    },
    OpRegistration {
        name: "det",
        from_attrs: |_| Ok(DefinedOp::new(Linalg::Det)),
        examples: || vec![DefinedOp::new(Linalg::Det)],
    },
    OpRegistration {
        name: "logabsdet",
        from_attrs: |_| Ok(DefinedOp::new(Linalg::LogAbsDet)),
        examples: || vec![DefinedOp::new(Linalg::LogAbsDet)],
    },
    OpRegistration {
        name: "eigh",
        from_attrs: |a| {
            let output = output_attr(
                a,
                &[EighOutput::Values, EighOutput::Vectors],
                EighOutput::name,
            )?;
            Ok(DefinedOp::new(Linalg::Eigh { output }))
        },
        examples: || {
            [EighOutput::Values, EighOutput::Vectors]
                .map(|output| DefinedOp::new(Linalg::Eigh { output }))
                .to_vec()
        },
    },
    OpRegistration {
        name: "qr",
        from_attrs: |a| {
            let output = output_attr(a, &[QrOutput::Q, QrOutput::R], QrOutput::name)?;
            Ok(DefinedOp::new(Linalg::Qr { output }))
        },
        examples: || {
            [QrOutput::Q, QrOutput::R]
                .map(|output| DefinedOp::new(Linalg::Qr { output }))
                .to_vec()
        },
    },
    OpRegistration {
        name: "svd",
        from_attrs: |a| {
            let all = [SvdOutput::U, SvdOutput::S, SvdOutput::Vt];
            let output = output_attr(a, &all, SvdOutput::name)?;
            Ok(DefinedOp::new(Linalg::Svd { output }))
        },
        examples: || {
            [SvdOutput::U, SvdOutput::S, SvdOutput::Vt]
                .map(|output| DefinedOp::new(Linalg::Svd { output }))
                .to_vec()
        },
    },
];

/// The `output` attribute of an op with several results: one of `all`, by name.
fn output_attr<T: Copy>(
    a: &mut rlx_ir::text::Attrs,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<T> {
    let choices: Vec<&str> = all.iter().map(|&o| name(o)).collect();
    a.word("output", &choices.join(", "), |w| {
        all.iter().copied().find(|&o| name(o) == w)
    })
}

/// Which matrix of a batch of `batch` an error is about (`m` counts from 0).
fn which(m: usize, batch: usize) -> String {
    if batch == 1 {
        "the matrix".into()
    } else {
        format!("matrix {m} of the batch of {batch}")
    }
}

/// The error of `solve`, `inv` and `triangular_solve` on a singular matrix: an exactly zero
/// pivot of its LU factorization (or diagonal entry of the triangle), as LAPACK reports it.
pub(crate) fn singular(m: usize, batch: usize) -> String {
    format!(
        "{} is singular (an exactly zero pivot; det and logabsdet give 0 and -inf for it)",
        which(m, batch)
    )
}

/// The error of `cholesky` on a matrix that is not positive definite: the order of its first
/// leading minor that is not positive.
pub(crate) fn not_positive_definite(m: usize, batch: usize, order: usize) -> String {
    format!(
        "{} is not positive definite (its leading minor of order {order} is not positive)",
        which(m, batch)
    )
}

/// Register the ops with the IR and their kernels with the CPU backend (again is a no-op).
pub fn register() -> Result<()> {
    for r in REGISTRATIONS {
        rlx_ir::ops::register(r)?;
    }
    kernels::register();
    Ok(())
}

/// Append `op` on `ins` to `g`, registering the ops and their CPU kernels first (as
/// [`register`] does; again is a no-op).
pub fn apply(g: &mut Graph, op: Linalg, ins: &[NodeId]) -> Result<NodeId> {
    register()?;
    g.try_op(Op::Defined(DefinedOp::new(op)), ins)
}

/// Swap the last two axes of `x`.
fn mt(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    let r = g.shape(x).rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    g.try_op(Op::Transpose { perm }, &[x])
}

fn mm(g: &mut Graph, a: NodeId, b: NodeId) -> Result<NodeId> {
    g.try_op(Op::MatMul, &[a, b])
}

/// `x` with everything outside the lower (or upper) triangle of its last two axes zeroed, and
/// its diagonal times `diag`.
fn triangle(g: &mut Graph, x: NodeId, lower: bool, diag: f64) -> Result<NodeId> {
    let s = g.shape(x).clone();
    let d = s.static_dims().unwrap_or_default();
    let n = d[d.len() - 1];
    let vals: Vec<f64> = (0..n * n)
        .map(|k| {
            let (i, j) = (k / n, k % n);
            if i == j {
                diag
            } else if (i > j) == lower {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let t = Tensor::from_f64(&[n, n], s.dtype(), vals);
    let m = g.try_constant_bytes(Shape::new(&[n, n], s.dtype()), t.to_bytes())?;
    g.try_mul(x, m)
}

/// The constant identity `[n, n]` of `dt`.
fn eye(g: &mut Graph, n: usize, dt: DType) -> Result<NodeId> {
    let vals: Vec<f64> = (0..n * n).map(|k| f64::from(k / n == k % n)).collect();
    let t = Tensor::from_f64(&[n, n], dt, vals);
    g.try_constant_bytes(Shape::new(&[n, n], dt), t.to_bytes())
}

/// The last axis of `x` as a row (`[..., 1, n]`) or a column (`[..., n, 1]`).
fn as_matrix(g: &mut Graph, x: NodeId, row: bool) -> Result<NodeId> {
    let mut d = g.shape(x).static_dims().unwrap_or_default();
    d.insert(if row { d.len() - 1 } else { d.len() }, 1);
    g.try_op(Op::Reshape { shape: d }, &[x])
}

/// `(x + xᵀ) / 2`.
fn sym(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    let xt = mt(g, x)?;
    let s = g.try_add(x, xt)?;
    let half = g.try_scalar(0.5, g.shape(s).dtype())?;
    g.try_mul(s, half)
}

/// The diagonal of the last two axes of `x` (`[..., n, n] -> [..., n]`).
fn diagonal(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    let s = g.shape(x).clone();
    let n = s
        .static_dims()
        .unwrap_or_default()
        .last()
        .copied()
        .unwrap_or(0);
    let e = eye(g, n, s.dtype())?;
    let p = g.try_mul(x, e)?;
    let r = s.rank();
    g.try_op(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![r - 1],
            keepdims: false,
        },
        &[p],
    )
}

/// `eigh`'s matrix of reciprocal eigenvalue gaps: `F[i, j] = 1 / (w[j] - w[i])` off the
/// diagonal, 0 on it (JAX's `Fmat`).
fn gaps(g: &mut Graph, w: NodeId) -> Result<NodeId> {
    let s = g.shape(w).clone();
    let n = s
        .static_dims()
        .unwrap_or_default()
        .last()
        .copied()
        .unwrap_or(0);
    let e = eye(g, n, s.dtype())?;
    let (r, c) = (as_matrix(g, w, true)?, as_matrix(g, w, false)?);
    let d = g.try_sub(r, c)?;
    let d = g.try_add(d, e)?;
    let one = g.try_scalar(1.0, s.dtype())?;
    let f = g.try_div(one, d)?;
    g.try_sub(f, e)
}

/// `1 / s` with 0 where `s` is 0 (JAX's guard for `svd`'s zero singular values).
fn safe_reciprocal(g: &mut Graph, s: NodeId) -> Result<NodeId> {
    let dt = g.shape(s).dtype();
    let zero = g.try_scalar(0.0, dt)?;
    let z = g.try_compare(rlx_ir::CmpOp::Eq, s, zero)?;
    let z = g.try_cast(z, dt)?;
    let d = g.try_add(s, z)?;
    let one = g.try_scalar(1.0, dt)?;
    let r = g.try_div(one, d)?;
    g.try_sub(r, z)
}

/// `x r⁻¹` for upper triangular `r` (a solve from the right: `rᵀ zᵀ = xᵀ`).
fn right_solve_upper(g: &mut Graph, x: NodeId, r: NodeId) -> Result<NodeId> {
    let (rt, xt) = (mt(g, r)?, mt(g, x)?);
    let z = apply(g, Linalg::TriangularSolve { lower: true }, &[rt, xt])?;
    mt(g, z)
}

/// `x r⁻ᵀ` for upper triangular `r` (`r zᵀ = xᵀ`).
fn right_solve_upper_t(g: &mut Graph, x: NodeId, r: NodeId) -> Result<NodeId> {
    let xt = mt(g, x)?;
    let z = apply(g, Linalg::TriangularSolve { lower: false }, &[r, xt])?;
    mt(g, z)
}

impl Linalg {
    /// A float matrix (`[..., m, n]`, static): `(m, n)`.
    fn float_matrix(&self, what: &str, s: &Shape) -> Result<(usize, usize)> {
        let d = s
            .static_dims()
            .ok_or_else(|| Error::op(self.name(), format!("{what} {s} needs static dimensions")))?;
        if !matches!(s.dtype(), DType::F32 | DType::F64) || d.len() < 2 {
            return Err(Error::op(
                self.name(),
                format!("{what} {s} must be f32 or f64 matrices [..., m, n]"),
            ));
        }
        Ok((d[d.len() - 2], d[d.len() - 1]))
    }

    /// The other result of `eigh` on `a`.
    fn other_eigh(&self, g: &mut Graph, a: NodeId, output: EighOutput) -> Result<NodeId> {
        apply(g, Linalg::Eigh { output }, &[a])
    }

    /// `qr`'s `(q, r)` on `a`, one of them `out` (the result `output`), for a derivative rule:
    /// an error for `m < n`, where JAX defines none either.
    fn qr_factors(
        &self,
        g: &mut Graph,
        a: NodeId,
        out: NodeId,
        output: QrOutput,
    ) -> Result<(NodeId, NodeId)> {
        self.qr_differentiable(g, a)?;
        let other = |g: &mut Graph, output| apply(g, Linalg::Qr { output }, &[a]);
        Ok(match output {
            QrOutput::Q => (out, other(g, QrOutput::R)?),
            QrOutput::R => (other(g, QrOutput::Q)?, out),
        })
    }

    /// `svd`'s `(u, s, vt)` on `a`, one of them `out` (the result `output`).
    fn svd_factors(
        &self,
        g: &mut Graph,
        a: NodeId,
        out: NodeId,
        output: SvdOutput,
    ) -> Result<(NodeId, NodeId, NodeId)> {
        let get = |g: &mut Graph, o: SvdOutput| {
            if o == output {
                Ok(out)
            } else {
                apply(g, Linalg::Svd { output: o }, &[a])
            }
        };
        Ok((
            get(g, SvdOutput::U)?,
            get(g, SvdOutput::S)?,
            get(g, SvdOutput::Vt)?,
        ))
    }

    /// `qr`'s derivatives exist for `m >= n` only (as in JAX).
    fn qr_differentiable(&self, g: &Graph, a: NodeId) -> Result<()> {
        let d = g.shape(a).static_dims().unwrap_or_default();
        let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
        if m < n {
            return Err(Error::op(
                self.name(),
                format!(
                    "the derivative of qr needs m >= n; a is {} (JAX does not define it either)",
                    g.shape(a)
                ),
            ));
        }
        Ok(())
    }

    fn infer_qr(&self, a: &Shape, output: QrOutput) -> Result<Shape> {
        let (m, n) = self.float_matrix("a", a)?;
        let mut d = a.static_dims().unwrap_or_default();
        let r = d.len();
        let k = m.min(n);
        match output {
            QrOutput::Q => d[r - 1] = k,
            QrOutput::R => d[r - 2] = k,
        }
        Ok(Shape::new(&d, a.dtype()))
    }

    fn infer_svd(&self, a: &Shape, output: SvdOutput) -> Result<Shape> {
        let (m, n) = self.float_matrix("a", a)?;
        let mut d = a.static_dims().unwrap_or_default();
        let r = d.len();
        let k = m.min(n);
        match output {
            SvdOutput::U => d[r - 1] = k,
            SvdOutput::S => {
                d.truncate(r - 1);
                d[r - 2] = k;
            }
            SvdOutput::Vt => d[r - 2] = k,
        }
        Ok(Shape::new(&d, a.dtype()))
    }

    fn infer_square(&self, ins: &[&Shape]) -> Result<Shape> {
        let a = ins[0];
        let n = self.float_square("a", a)?;
        let ad = a.static_dims().unwrap_or_default();
        let batch = &ad[..ad.len() - 2];
        match self {
            Linalg::Solve | Linalg::TriangularSolve { .. } => {
                let b = ins[1];
                let bd = b.static_dims().unwrap_or_default();
                if b.dtype() != a.dtype()
                    || bd.len() != ad.len()
                    || bd[..bd.len() - 2] != *batch
                    || bd[bd.len() - 2] != n
                {
                    return Err(Error::op(
                        self.name(),
                        format!(
                            "b {b} must be [..., {n}, k] of {}, with a {a}'s batch axes",
                            a.dtype()
                        ),
                    ));
                }
                Ok(b.clone())
            }
            Linalg::Cholesky
            | Linalg::Inv
            | Linalg::Eigh {
                output: EighOutput::Vectors,
            } => Ok(a.clone()),
            Linalg::Det | Linalg::LogAbsDet => Ok(Shape::new(batch, a.dtype())),
            Linalg::Eigh {
                output: EighOutput::Values,
            } => Ok(Shape::new(&ad[..ad.len() - 1], a.dtype())),
            Linalg::Qr { output } => self.infer_qr(a, *output),
            Linalg::Svd { output } => self.infer_svd(a, *output),
        }
    }

    fn float_square(&self, what: &str, s: &Shape) -> Result<usize> {
        let d = s
            .static_dims()
            .ok_or_else(|| Error::op(self.name(), format!("{what} {s} needs static dimensions")))?;
        if !matches!(s.dtype(), DType::F32 | DType::F64) {
            return Err(Error::op(
                self.name(),
                format!("{what} {s} must be f32 or f64"),
            ));
        }
        if d.len() < 2 || d[d.len() - 1] != d[d.len() - 2] {
            return Err(Error::op(
                self.name(),
                format!("{what} {s} must be square matrices [..., n, n]"),
            ));
        }
        Ok(d[d.len() - 1])
    }
}

impl OpDef for Linalg {
    fn name(&self) -> &'static str {
        match self {
            Linalg::Solve => "solve",
            Linalg::TriangularSolve { .. } => "triangular_solve",
            Linalg::Cholesky => "cholesky",
            Linalg::Inv => "inv",
            Linalg::Det => "det",
            Linalg::LogAbsDet => "logabsdet",
            Linalg::Eigh { .. } => "eigh",
            Linalg::Qr { .. } => "qr",
            Linalg::Svd { .. } => "svd",
        }
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        match self {
            Linalg::TriangularSolve { lower } => vec![("lower", Attr::Bool(*lower))],
            Linalg::Eigh { output } => vec![("output", Attr::word(output.name()))],
            Linalg::Qr { output } => vec![("output", Attr::word(output.name()))],
            Linalg::Svd { output } => vec![("output", Attr::word(output.name()))],
            Linalg::Solve | Linalg::Cholesky | Linalg::Inv | Linalg::Det | Linalg::LogAbsDet => {
                Vec::new()
            }
        }
    }

    fn arity(&self) -> (usize, usize) {
        match self {
            Linalg::Solve | Linalg::TriangularSolve { .. } => (2, 2),
            Linalg::Cholesky
            | Linalg::Inv
            | Linalg::Det
            | Linalg::LogAbsDet
            | Linalg::Eigh { .. }
            | Linalg::Qr { .. }
            | Linalg::Svd { .. } => (1, 1),
        }
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        match self {
            Linalg::Qr { output } => self.infer_qr(ins[0], *output),
            Linalg::Svd { output } => self.infer_svd(ins[0], *output),
            _ => self.infer_square(ins),
        }
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        reference::eval(*self, ins, out)
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        let d = ins[0].static_dims().unwrap_or_default();
        let n = *d.last().unwrap_or(&0) as u64;
        let batch: u64 = d[..d.len().saturating_sub(2)].iter().product::<usize>() as u64;
        let k = out
            .static_dims()
            .and_then(|o| o.last().copied())
            .unwrap_or(1) as u64;
        let m = d.len().checked_sub(2).map_or(n, |i| d[i] as u64);
        let flops = match self {
            Linalg::Eigh {
                output: EighOutput::Values,
            } => 4 * n * n * n / 3,
            Linalg::Eigh {
                output: EighOutput::Vectors,
            } => 9 * n * n * n,
            // Householder QR and forming the thin q.
            Linalg::Qr { .. } => 4 * m * n * n.min(m),
            // Bidiagonalization and the iteration, roughly.
            Linalg::Svd { .. } => 12 * m * n * n.min(m),
            Linalg::Solve => 2 * n * n * n / 3 + 2 * n * n * k,
            Linalg::TriangularSolve { .. } => n * n * k,
            Linalg::Cholesky => n * n * n / 3,
            Linalg::Inv => 2 * n * n * n,
            Linalg::Det | Linalg::LogAbsDet => 2 * n * n * n / 3,
        };
        let bytes = ins
            .iter()
            .chain([&out])
            .map(|s| s.size_bytes().unwrap_or(0) as u64)
            .sum();
        Cost {
            flops: batch.max(1) * flops,
            bytes,
        }
    }

    fn has_ad_rules(&self) -> bool {
        true
    }

    /// JAX's rules: `solve`: `b̄ = solve(aᵀ, x̄)`, `ā = -b̄ xᵀ`; `triangular_solve`: the same
    /// with the transposed triangle, `ā` kept to `a`'s triangle; `inv`: `ā = -yᵀ ȳ yᵀ`; `det`:
    /// `ā = d̄ d a⁻ᵀ`; `logabsdet`: `ā = d̄ a⁻ᵀ`; `cholesky`: `ā = sym(l⁻ᵀ Φ(lᵀ l̄) l⁻¹)` with `Φ` the lower triangle with
    /// half its diagonal and `sym(x) = (x + xᵀ) / 2`; `eigh`: `ā = sym(v (diag(w̄) + F ⊙ vᵀ v̄)
    /// vᵀ)` with `F` the reciprocal eigenvalue gaps; `qr` (m ≥ n): `ā = (q̄ + q N) r⁻ᵀ` with
    /// `M = r̄ rᵀ - qᵀ q̄` and `N` its upper triangle mirrored below the diagonal (the transpose
    /// of JAX's forward rule).
    fn vjp(
        &self,
        g: &mut Graph,
        ins: &[NodeId],
        out: NodeId,
        ct: NodeId,
    ) -> Result<Vec<Option<NodeId>>> {
        let a = ins[0];
        Ok(match *self {
            Linalg::Solve => {
                let at = mt(g, a)?;
                let cb = apply(g, Linalg::Solve, &[at, ct])?;
                let xt = mt(g, out)?;
                let p = mm(g, cb, xt)?;
                let ca = g.try_activation(Activation::Neg, p)?;
                vec![Some(ca), Some(cb)]
            }
            Linalg::TriangularSolve { lower } => {
                let at = mt(g, a)?;
                let cb = apply(g, Linalg::TriangularSolve { lower: !lower }, &[at, ct])?;
                let xt = mt(g, out)?;
                let p = mm(g, cb, xt)?;
                let p = triangle(g, p, lower, 1.0)?;
                let ca = g.try_activation(Activation::Neg, p)?;
                vec![Some(ca), Some(cb)]
            }
            Linalg::Inv => {
                let yt = mt(g, out)?;
                let p = mm(g, yt, ct)?;
                let p = mm(g, p, yt)?;
                vec![Some(g.try_activation(Activation::Neg, p)?)]
            }
            Linalg::Det | Linalg::LogAbsDet => {
                let inv = apply(g, Linalg::Inv, &[a])?;
                let it = mt(g, inv)?;
                // d det = det a⁻ᵀ; d log|det| = a⁻ᵀ.
                let s = if *self == Linalg::Det {
                    g.try_mul(ct, out)?
                } else {
                    ct
                };
                let r = g.shape(s).rank();
                let d = g.shape(a).static_dims().unwrap_or_default();
                let mut e = d[..r].to_vec();
                e.extend([1, 1]);
                let s = g.try_op(Op::Reshape { shape: e }, &[s])?;
                vec![Some(g.try_mul(s, it)?)]
            }
            Linalg::Cholesky => {
                let l = out;
                let lt = mt(g, l)?;
                let p = mm(g, lt, ct)?;
                let p = triangle(g, p, true, 0.5)?;
                // l⁻ᵀ p, then (l⁻ᵀ (l⁻ᵀ p)ᵀ)ᵀ = l⁻ᵀ p l⁻¹.
                let y = apply(g, Linalg::TriangularSolve { lower: false }, &[lt, p])?;
                let yt = mt(g, y)?;
                let z = apply(g, Linalg::TriangularSolve { lower: false }, &[lt, yt])?;
                let zt = mt(g, z)?;
                let s = g.try_add(z, zt)?;
                let half = g.try_scalar(0.5, g.shape(s).dtype())?;
                vec![Some(g.try_mul(s, half)?)]
            }
            Linalg::Eigh { output } => {
                let (w, v) = match output {
                    EighOutput::Values => (out, self.other_eigh(g, a, EighOutput::Vectors)?),
                    EighOutput::Vectors => (self.other_eigh(g, a, EighOutput::Values)?, out),
                };
                let vt = mt(g, v)?;
                let x = match output {
                    // diag(w̄) as v's columns scaled: v diag(w̄) vᵀ.
                    EighOutput::Values => {
                        let row = as_matrix(g, ct, true)?;
                        let vs = g.try_mul(v, row)?;
                        mm(g, vs, vt)?
                    }
                    EighOutput::Vectors => {
                        let f = gaps(g, w)?;
                        let p = mm(g, vt, ct)?;
                        let p = g.try_mul(f, p)?;
                        let p = mm(g, v, p)?;
                        mm(g, p, vt)?
                    }
                };
                vec![Some(sym(g, x)?)]
            }
            Linalg::Qr { output } => {
                let (q, r) = self.qr_factors(g, a, out, output)?;
                let m = match output {
                    QrOutput::Q => {
                        let qt = mt(g, q)?;
                        let p = mm(g, qt, ct)?;
                        g.try_activation(Activation::Neg, p)?
                    }
                    QrOutput::R => {
                        let rt = mt(g, r)?;
                        mm(g, ct, rt)?
                    }
                };
                // N: M's upper triangle (with the diagonal), mirrored below it.
                let upper = triangle(g, m, false, 1.0)?;
                let strict = triangle(g, m, false, 0.0)?;
                let st = mt(g, strict)?;
                let nm = g.try_add(upper, st)?;
                let qn = mm(g, q, nm)?;
                let y = match output {
                    QrOutput::Q => g.try_add(ct, qn)?,
                    QrOutput::R => qn,
                };
                vec![Some(right_solve_upper_t(g, y, r)?)]
            }
            Linalg::Svd { output } => {
                let (u, s, vt) = self.svd_factors(g, a, out, output)?;
                let d = g.shape(a).static_dims().unwrap_or_default();
                let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
                let srow = as_matrix(g, s, true)?;
                let ca = match output {
                    // u diag(s̄) vt.
                    SvdOutput::S => {
                        let row = as_matrix(g, ct, true)?;
                        let us = g.try_mul(u, row)?;
                        mm(g, us, vt)?
                    }
                    SvdOutput::U => {
                        // X̄ = (J + Jᵀ) diag(s), J = F ⊙ uᵀ ū.
                        let s2 = g.try_mul(s, s)?;
                        let f = gaps(g, s2)?;
                        let ut = mt(g, u)?;
                        let p = mm(g, ut, ct)?;
                        let j = g.try_mul(f, p)?;
                        let jt = mt(g, j)?;
                        let x = g.try_add(j, jt)?;
                        let x = g.try_mul(x, srow)?;
                        let p = mm(g, u, x)?;
                        let mut y = mm(g, p, vt)?;
                        if m > n {
                            // (ū - u uᵀ ū) diag(1/s) vt.
                            let uu = mm(g, ut, ct)?;
                            let uu = mm(g, u, uu)?;
                            let r = g.try_sub(ct, uu)?;
                            let inv = safe_reciprocal(g, s)?;
                            let inv = as_matrix(g, inv, true)?;
                            let r = g.try_mul(r, inv)?;
                            let r = mm(g, r, vt)?;
                            y = g.try_add(y, r)?;
                        }
                        y
                    }
                    SvdOutput::Vt => {
                        // X̄ = diag(s) (J + Jᵀ), J = F ⊙ vᵀ v̄ with v̄ = v̄tᵀ.
                        let s2 = g.try_mul(s, s)?;
                        let f = gaps(g, s2)?;
                        let vbar = mt(g, ct)?;
                        let p = mm(g, vt, vbar)?;
                        let j = g.try_mul(f, p)?;
                        let jt = mt(g, j)?;
                        let x = g.try_add(j, jt)?;
                        let scol = as_matrix(g, s, false)?;
                        let x = g.try_mul(scol, x)?;
                        let p = mm(g, u, x)?;
                        let mut y = mm(g, p, vt)?;
                        if n > m {
                            // u ((v̄ - v vᵀ v̄) diag(1/s))ᵀ.
                            let v = mt(g, vt)?;
                            let vv = mm(g, vt, vbar)?;
                            let vv = mm(g, v, vv)?;
                            let r = g.try_sub(vbar, vv)?;
                            let inv = safe_reciprocal(g, s)?;
                            let inv = as_matrix(g, inv, true)?;
                            let r = g.try_mul(r, inv)?;
                            let rt = mt(g, r)?;
                            let r = mm(g, u, rt)?;
                            y = g.try_add(y, r)?;
                        }
                        y
                    }
                };
                vec![Some(ca)]
            }
        })
    }

    /// `solve`: `ẋ = solve(a, ḃ - ȧ x)`; `triangular_solve` the same with `ȧ` kept to the
    /// triangle; `inv`: `ẏ = -y ȧ y`; `det`: `ḋ = d Σ a⁻ᵀ ⊙ ȧ` (`logabsdet`: without the `d`); `cholesky`: `l̇ = l Φ(l⁻¹ sym(ȧ)
    /// l⁻ᵀ)`; `eigh` (JAX's rule): with `X = vᵀ sym(ȧ) v`, `ẇ = diag(X)`, `v̇ = v (F ⊙ X)`;
    /// `qr` (JAX's rule, m ≥ n): with `B = ȧ r⁻¹`, `C = qᵀ B`, `Ω = tril(C, -1) - tril(C,
    /// -1)ᵀ`: `q̇ = q (Ω - C) + B`, `ṙ = (C - Ω) r`; `svd` (JAX's rule): with `X = uᵀ ȧ v`,
    /// `ṡ = diag(X)`, `u̇ = u (F ⊙ (X S + S Xᵀ))`, `v̇ = v (F ⊙ (S X + Xᵀ S))` (plus the
    /// out-of-span parts for tall or wide matrices), `S = diag(s)`.
    fn jvp(
        &self,
        g: &mut Graph,
        ins: &[NodeId],
        out: NodeId,
        t: &[Option<NodeId>],
    ) -> Result<Option<NodeId>> {
        let a = ins[0];
        let ta = t[0];
        Ok(Some(match *self {
            Linalg::Solve | Linalg::TriangularSolve { .. } => {
                let mut rhs = t.get(1).copied().flatten();
                if let Some(ta) = ta {
                    let ta = match *self {
                        Linalg::TriangularSolve { lower } => triangle(g, ta, lower, 1.0)?,
                        _ => ta,
                    };
                    let p = mm(g, ta, out)?;
                    rhs = Some(match rhs {
                        Some(tb) => g.try_sub(tb, p)?,
                        None => g.try_activation(Activation::Neg, p)?,
                    });
                }
                let Some(rhs) = rhs else { return Ok(None) };
                apply(g, *self, &[a, rhs])?
            }
            Linalg::Inv => {
                let Some(ta) = ta else { return Ok(None) };
                let p = mm(g, out, ta)?;
                let p = mm(g, p, out)?;
                g.try_activation(Activation::Neg, p)?
            }
            Linalg::Det | Linalg::LogAbsDet => {
                let Some(ta) = ta else { return Ok(None) };
                let inv = apply(g, Linalg::Inv, &[a])?;
                let it = mt(g, inv)?;
                let p = g.try_mul(it, ta)?;
                let r = g.shape(p).rank();
                let s = g.try_op(
                    Op::Reduce {
                        kind: ReduceKind::Sum,
                        axes: vec![r - 2, r - 1],
                        keepdims: false,
                    },
                    &[p],
                )?;
                if *self == Linalg::Det {
                    g.try_mul(s, out)?
                } else {
                    s
                }
            }
            Linalg::Cholesky => {
                let Some(ta) = ta else { return Ok(None) };
                let tt = mt(g, ta)?;
                let s = g.try_add(ta, tt)?;
                let half = g.try_scalar(0.5, g.shape(s).dtype())?;
                let s = g.try_mul(s, half)?;
                let w = apply(g, Linalg::TriangularSolve { lower: true }, &[out, s])?;
                let wt = mt(g, w)?;
                let x = apply(g, Linalg::TriangularSolve { lower: true }, &[out, wt])?;
                let phi = triangle(g, x, true, 0.5)?;
                mm(g, out, phi)?
            }
            Linalg::Eigh { output } => {
                let Some(ta) = ta else { return Ok(None) };
                let v = match output {
                    EighOutput::Values => self.other_eigh(g, a, EighOutput::Vectors)?,
                    EighOutput::Vectors => out,
                };
                let s = sym(g, ta)?;
                let vt = mt(g, v)?;
                let x = mm(g, vt, s)?;
                let x = mm(g, x, v)?;
                match output {
                    EighOutput::Values => diagonal(g, x)?,
                    EighOutput::Vectors => {
                        let w = self.other_eigh(g, a, EighOutput::Values)?;
                        let f = gaps(g, w)?;
                        let p = g.try_mul(f, x)?;
                        mm(g, v, p)?
                    }
                }
            }
            Linalg::Qr { output } => {
                let Some(ta) = ta else { return Ok(None) };
                let (q, r) = self.qr_factors(g, a, out, output)?;
                let b = right_solve_upper(g, ta, r)?;
                let qt = mt(g, q)?;
                let c = mm(g, qt, b)?;
                let low = triangle(g, c, true, 0.0)?;
                let lt = mt(g, low)?;
                let omega = g.try_sub(low, lt)?;
                match output {
                    QrOutput::Q => {
                        let d = g.try_sub(omega, c)?;
                        let p = mm(g, q, d)?;
                        g.try_add(p, b)?
                    }
                    QrOutput::R => {
                        let d = g.try_sub(c, omega)?;
                        mm(g, d, r)?
                    }
                }
            }
            Linalg::Svd { output } => {
                let Some(ta) = ta else { return Ok(None) };
                let (u, s, vt) = self.svd_factors(g, a, out, output)?;
                let d = g.shape(a).static_dims().unwrap_or_default();
                let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
                // JAX's rule: X = uᵀ ȧ v.
                let (ut, v) = (mt(g, u)?, mt(g, vt)?);
                let x = mm(g, ut, ta)?;
                let x = mm(g, x, v)?;
                let s2 = g.try_mul(s, s)?;
                let f = gaps(g, s2)?;
                let (srow, scol) = (as_matrix(g, s, true)?, as_matrix(g, s, false)?);
                let xt = mt(g, x)?;
                let inv = safe_reciprocal(g, s)?;
                let inv = as_matrix(g, inv, true)?;
                match output {
                    SvdOutput::S => diagonal(g, x)?,
                    SvdOutput::U => {
                        // u (F ⊙ (X diag(s) + diag(s) Xᵀ)) [+ (ȧ v - u uᵀ ȧ v) / s for m > n].
                        let p = g.try_mul(x, srow)?;
                        let q = g.try_mul(scol, xt)?;
                        let p = g.try_add(p, q)?;
                        let p = g.try_mul(f, p)?;
                        let mut du = mm(g, u, p)?;
                        if m > n {
                            let av = mm(g, ta, v)?;
                            let uav = mm(g, ut, av)?;
                            let uav = mm(g, u, uav)?;
                            let r = g.try_sub(av, uav)?;
                            let r = g.try_mul(r, inv)?;
                            du = g.try_add(du, r)?;
                        }
                        du
                    }
                    SvdOutput::Vt => {
                        // (v (F ⊙ (diag(s) X + Xᵀ diag(s))) [+ (ȧᵀ u - v vᵀ ȧᵀ u) / s for
                        // n > m])ᵀ.
                        let p = g.try_mul(scol, x)?;
                        let q = g.try_mul(xt, srow)?;
                        let p = g.try_add(p, q)?;
                        let p = g.try_mul(f, p)?;
                        let mut dv = mm(g, v, p)?;
                        if n > m {
                            let at = mt(g, ta)?;
                            let au = mm(g, at, u)?;
                            let vau = mm(g, vt, au)?;
                            let vau = mm(g, v, vau)?;
                            let r = g.try_sub(au, vau)?;
                            let r = g.try_mul(r, inv)?;
                            dv = g.try_add(dv, r)?;
                        }
                        mt(g, dv)?
                    }
                }
            }
        }))
    }

    fn batchable(&self, _batched: &[bool]) -> bool {
        true
    }

    /// Every operand with the batch axis in front (the ops take leading axes as batches).
    fn batch(&self, g: &mut Graph, b: &Batched) -> Result<(NodeId, Option<usize>)> {
        let ins = (0..b.ins.len())
            .map(|i| b.front(g, i))
            .collect::<Result<Vec<_>>>()?;
        Ok((apply(g, *self, &ins)?, Some(0)))
    }

    fn precision_class(&self) -> OpClass {
        OpClass::Sensitive
    }
}
