//! Dense linear algebra for RLX, as ops registered from outside the IR
//! (`rlx_ir::ops::register`): `solve`, `triangular_solve`, `cholesky`, `inv`, `det` and
//! `logabsdet`, batched over leading axes, on f32 and f64. Each op's rules are its [`OpDef`]:
//! shape inference (errors name the op and shapes), a reference evaluator in f64, JAX's
//! derivative rules for reverse and forward mode (written with these ops and the IR's, so they
//! differentiate again), batching for vmap, and a native CPU kernel on `faer` ([`register`]
//! gives it to the CPU backend). They have no decomposition: a backend without a kernel for
//! them (the GPU backends) refuses them by name.
//!
//! As in JAX and LAPACK, a singular matrix gives infinities or NaNs, and `cholesky` of a matrix
//! that is not positive definite gives NaNs (at run time there is no error to raise).

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
}

/// The registrations of the ops (`rlx_ir::ops::register` each, or call [`register`]).
pub const REGISTRATIONS: [OpRegistration; 6] = [
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
];

/// Register the ops with the IR and their kernels with the CPU backend (again is a no-op).
pub fn register() -> Result<()> {
    for r in REGISTRATIONS {
        rlx_ir::ops::register(r)?;
    }
    kernels::register();
    Ok(())
}

/// Append `op` on `ins` to `g`.
pub fn apply(g: &mut Graph, op: Linalg, ins: &[NodeId]) -> Result<NodeId> {
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

impl Linalg {
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
        }
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        match self {
            Linalg::TriangularSolve { lower } => vec![("lower", Attr::Bool(*lower))],
            Linalg::Solve | Linalg::Cholesky | Linalg::Inv | Linalg::Det | Linalg::LogAbsDet => {
                Vec::new()
            }
        }
    }

    fn arity(&self) -> (usize, usize) {
        match self {
            Linalg::Solve | Linalg::TriangularSolve { .. } => (2, 2),
            Linalg::Cholesky | Linalg::Inv | Linalg::Det | Linalg::LogAbsDet => (1, 1),
        }
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
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
            Linalg::Cholesky | Linalg::Inv => Ok(a.clone()),
            Linalg::Det | Linalg::LogAbsDet => Ok(Shape::new(batch, a.dtype())),
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
        let flops = match self {
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
    /// half its diagonal and `sym(x) = (x + xᵀ) / 2`.
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
        })
    }

    /// `solve`: `ẋ = solve(a, ḃ - ȧ x)`; `triangular_solve` the same with `ȧ` kept to the
    /// triangle; `inv`: `ẏ = -y ȧ y`; `det`: `ḋ = d Σ a⁻ᵀ ⊙ ȧ` (`logabsdet`: without the `d`); `cholesky`: `l̇ = l Φ(l⁻¹ sym(ȧ)
    /// l⁻ᵀ)`.
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
