//! SelectiveScan: Mamba's selective state-space scan (`selective_scan_ref` of `mamba_ssm`),
//! `(u [B, D, L], delta [B, D, L], A [D, N], B [B, N, L], C [B, N, L], D? [D], z? [B, D, L])
//! -> [B, D, L]`:
//!
//! ```text
//! delta = softplus(delta)                    (with delta_softplus)
//! x = 0 [B, D, N]
//! for l: x = exp(delta_l A) x + delta_l B_l u_l;   y_l = Σ_n x C_l
//! out = y + u D;   out *= silu(z)            (when D, z are given)
//! ```
//!
//! The reference evaluator runs that recurrence in f64. The decomposition is its quadratic
//! (attention-like) form, which needs no loop: with `S = cumsum(delta)` along `L`,
//! `x_i = Σ_{j ≤ i} exp(A (S_i - S_j)) delta_j B_j u_j`, so every backend runs it and autodiff
//! and vmap differentiate and batch it (it holds `B·D·N·L²` values: backends with a native
//! kernel, the CPU's runs the recurrence, use it for long sequences). All its rules are the
//! methods of [`SelectiveScan`].

use super::{Cost, OpRegistration};
use crate::eval::Tensor;
use crate::ops::DefinedOp;
use crate::text::Attr;
use crate::{Activation, Error, Graph, NodeId, Op, ReduceKind, Result, Shape};

/// The op; `delta_softplus` applies softplus to `delta` first (Mamba's default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SelectiveScan {
    /// Apply `softplus` to `delta` first.
    pub delta_softplus: bool,
}

pub(super) const OP: OpRegistration = OpRegistration {
    name: "selective_scan",
    from_attrs: |a| {
        Ok(DefinedOp::new(SelectiveScan {
            delta_softplus: a.bool("delta_softplus")?,
        }))
    },
    examples: || {
        [false, true]
            .map(|delta_softplus| DefinedOp::new(SelectiveScan { delta_softplus }))
            .to_vec()
    },
};

/// `softplus(x) = max(x, 0) + log(1 + exp(-|x|))` in f64.
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// `(B, D, L, N)` of operands `ins`, checked.
fn dims_of(ins: &[&Shape]) -> Result<(usize, usize, usize, usize)> {
    let name = OP.name;
    let d = |i: usize, what: &str| super::static_dims(name, what, ins[i]);
    let (u, delta, a, b, c) = (
        d(0, "u")?,
        d(1, "delta")?,
        d(2, "A")?,
        d(3, "B")?,
        d(4, "C")?,
    );
    let dt = ins[0].dtype();
    if !dt.is_float() || ins.iter().any(|s| s.dtype() != dt) {
        return Err(Error::op(
            name,
            format!(
                "every operand must have u's float dtype, got {}",
                ins.iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    if u.len() != 3 || a.len() != 2 {
        return Err(Error::op(
            name,
            format!(
                "u must be [B, D, L] and A [D, N], got u {} and A {}",
                ins[0], ins[2]
            ),
        ));
    }
    let (bs, ds, ls, ns) = (u[0], u[1], u[2], a[1]);
    let ok = delta == u
        && a[0] == ds
        && b == [bs, ns, ls]
        && c == b
        && ins
            .get(5)
            .is_none_or(|s| s.static_dims().as_deref() == Some(&[ds][..]))
        && ins
            .get(6)
            .is_none_or(|s| s.static_dims().as_deref() == Some(&u[..]));
    if !ok {
        return Err(Error::op(
            name,
            format!(
                "expected u, delta [B, D, L] = [{bs}, {ds}, {ls}], A [{ds}, N], B and C [{bs}, N, {ls}], D [{ds}], z [{bs}, {ds}, {ls}]; got {}",
                ins.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    Ok((bs, ds, ls, ns))
}

impl Graph {
    /// Mamba's `selective_scan_fn(u, delta, A, B, C, D, z, delta_softplus)`: `ins` are
    /// `[u, delta, a, b, c]`; `d` (`[D]`, the skip) and `z` (`[B, D, L]`, the gate) are optional,
    /// and a gate needs the skip (pass zeros for none).
    pub fn try_selective_scan(
        &mut self,
        ins: [NodeId; 5],
        d: Option<NodeId>,
        z: Option<NodeId>,
        delta_softplus: bool,
    ) -> Result<NodeId> {
        let mut all = ins.to_vec();
        match (d, z) {
            (None, Some(_)) => {
                return Err(Error::op(
                    OP.name,
                    "the gate z needs the skip D (pass zeros of [D] for none)",
                ))
            }
            (Some(d), z) => all.extend(std::iter::once(d).chain(z)),
            (None, None) => {}
        }
        self.try_op(Op::defined(SelectiveScan { delta_softplus }), &all)
    }

    /// Short form of [`Graph::try_selective_scan`]; panics with its error.
    pub fn selective_scan(
        &mut self,
        ins: [NodeId; 5],
        d: Option<NodeId>,
        z: Option<NodeId>,
        delta_softplus: bool,
    ) -> NodeId {
        self.try_selective_scan(ins, d, z, delta_softplus)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

impl SelectiveScan {
    /// The recurrence in f64 over flat row-major operands (the reference evaluator, and the
    /// CPU's kernel through [`SelectiveScan::run`]).
    pub fn run(&self, dims: (usize, usize, usize, usize), ins: &[Vec<f64>]) -> Vec<f64> {
        let (bs, ds, ls, ns) = dims;
        let (u, delta, a, b, c) = (&ins[0], &ins[1], &ins[2], &ins[3], &ins[4]);
        let mut out = vec![0.0; bs * ds * ls];
        let mut x = vec![0.0; ns];
        for bi in 0..bs {
            for di in 0..ds {
                x.iter_mut().for_each(|v| *v = 0.0);
                for l in 0..ls {
                    let at = (bi * ds + di) * ls + l;
                    let dl = if self.delta_softplus {
                        softplus(delta[at])
                    } else {
                        delta[at]
                    };
                    let mut y = 0.0;
                    for (n, xn) in x.iter_mut().enumerate() {
                        let bc = (bi * ns + n) * ls + l;
                        *xn = (dl * a[di * ns + n]).exp() * *xn + dl * b[bc] * u[at];
                        y += *xn * c[bc];
                    }
                    if let Some(dskip) = ins.get(5) {
                        y += u[at] * dskip[di];
                    }
                    if let Some(z) = ins.get(6) {
                        y *= z[at] / (1.0 + (-z[at]).exp());
                    }
                    out[at] = y;
                }
            }
        }
        out
    }

    /// The quadratic form (see the module documentation) appended to `g`.
    fn quadratic(&self, g: &mut Graph, ins: &[NodeId]) -> Result<NodeId> {
        let shapes: Vec<Shape> = ins.iter().map(|&i| g.shape(i).clone()).collect();
        let refs: Vec<&Shape> = shapes.iter().collect();
        let (bs, ds, ls, ns) = dims_of(&refs)?;
        let dt = shapes[0].dtype();
        let (u, delta, a, b, c) = (ins[0], ins[1], ins[2], ins[3], ins[4]);
        let reshape =
            |g: &mut Graph, x: NodeId, shape: Vec<usize>| g.try_op(Op::Reshape { shape }, &[x]);
        let dl = if self.delta_softplus {
            let pos = g.try_activation(Activation::Relu, delta)?;
            let ab = g.try_activation(Activation::Abs, delta)?;
            let na = g.try_activation(Activation::Neg, ab)?;
            let e = g.try_activation(Activation::Exp, na)?;
            let one = g.try_scalar(1.0, dt)?;
            let e1 = g.try_add(e, one)?;
            let l = g.try_activation(Activation::Log, e1)?;
            g.try_add(pos, l)?
        } else {
            delta
        };
        let s = g.try_op(Op::Cumsum { axis: 2 }, &[dl])?;
        let si = reshape(g, s, vec![bs, ds, 1, ls, 1])?;
        let sj = reshape(g, s, vec![bs, ds, 1, 1, ls])?;
        let diff = g.try_sub(si, sj)?;
        let a5 = reshape(g, a, vec![1, ds, ns, 1, 1])?;
        let expo = g.try_mul(a5, diff)?;
        // Keys after the query contribute nothing: -inf before the exponential (their exponent
        // may be large and positive, so masking after it would give inf * 0).
        let tril: Vec<u8> = (0..ls * ls).map(|k| u8::from(k % ls <= k / ls)).collect();
        let mask = g.try_constant_bytes(Shape::new(&[ls, ls], crate::DType::Bool), tril)?;
        let ninf = g.try_scalar(f64::NEG_INFINITY, dt)?;
        let expo = g.try_op(Op::Where, &[mask, expo, ninf])?;
        let decay = g.try_activation(Activation::Exp, expo)?;
        let du = g.try_mul(dl, u)?;
        let du = reshape(g, du, vec![bs, ds, 1, ls])?;
        let b4 = reshape(g, b, vec![bs, 1, ns, ls])?;
        let dbu = g.try_mul(du, b4)?;
        let dbu = reshape(g, dbu, vec![bs, ds, ns, ls, 1])?;
        let x = g.try_op(Op::MatMul, &[decay, dbu])?;
        let x = reshape(g, x, vec![bs, ds, ns, ls])?;
        let c4 = reshape(g, c, vec![bs, 1, ns, ls])?;
        let xc = g.try_mul(x, c4)?;
        let mut y = g.try_op(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![2],
                keepdims: false,
            },
            &[xc],
        )?;
        if let Some(&dskip) = ins.get(5) {
            let d3 = reshape(g, dskip, vec![1, ds, 1])?;
            let ud = g.try_mul(u, d3)?;
            y = g.try_add(y, ud)?;
        }
        if let Some(&z) = ins.get(6) {
            let sz = g.try_activation(Activation::Silu, z)?;
            y = g.try_mul(y, sz)?;
        }
        Ok(y)
    }
}

impl super::OpDef for SelectiveScan {
    fn name(&self) -> &'static str {
        OP.name
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![("delta_softplus", Attr::Bool(self.delta_softplus))]
    }

    fn arity(&self) -> (usize, usize) {
        (5, 7)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        dims_of(ins)?;
        Ok(ins[0].clone())
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let shapes: Vec<Shape> = ins.iter().map(|t| t.shape()).collect();
        let refs: Vec<&Shape> = shapes.iter().collect();
        let dims = dims_of(&refs)?;
        let vals: Vec<Vec<f64>> = ins.iter().map(|t| t.f64s()).collect();
        Ok(Tensor::from_f64(
            ins[0].dims(),
            out.dtype(),
            self.run(dims, &vals),
        ))
    }

    /// Per step and channel: `N` exponentials and three multiply-adds per state.
    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        let n = ins[2].static_dims().map_or(1, |d| d[1] as u64);
        Cost::streaming(ins, out, 8 * n)
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some(self.quadratic(g, ins))
    }

    fn precision_class(&self) -> super::OpClass {
        super::OpClass::Sensitive
    }
}
