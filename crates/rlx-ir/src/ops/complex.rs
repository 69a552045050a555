//! Complex numbers. A `c64` value holds an f32 real and imaginary part (8 bytes, real part
//! first: the layout of numpy's `complex64` and of C's `float _Complex`).
//!
//! Three primitives cross between real and complex values: [`Complex`] (`complex(re, im)`),
//! [`Real`] and [`Imag`]. Every other op over complex values (arithmetic, `matmul`,
//! `dot_general`, sums and means, the movement ops, `gather`, `scatter_add`, `where`, casts,
//! `eq` / `ne`, `neg`, `abs`, `exp`, `log`) has a *complex form* ([`split`]): the same op, or a
//! few real ops, applied to the parts and joined again by `complex`. That form is the op's
//! decomposition, so a backend needs kernels for the three primitives only (and for
//! [`crate::ops::Fft`], which has a decomposition of its own); the reference evaluator
//! evaluates complex ops through it; autodiff differentiates through it. The primitives'
//! derivative rules follow JAX's convention for complex cotangents (the cotangent of `x + iy`
//! is `dL/dx - i dL/dy`, so the transpose of `real` is `complex(t, 0)` and of `imag` is
//! `complex(0, -t)`), and the real ops' own rules then give exactly what `jax.grad` and
//! `jax.vjp` give for complex inputs.

use super::ad::unbroadcast;
use super::batch::{broadcasting, Batched};
use super::{Cost, DefinedOp, OpDef, OpRegistration};
use crate::eval::Tensor;
use crate::text::Attr;
use crate::{
    broadcast_dims, Activation, BinaryOp, CmpOp, DType, Error, Graph, NodeId, Op, ReduceKind,
    Result, Shape,
};

/// `complex(re, im)`: f32 parts (broadcast together as numpy does) to a c64 value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Complex;

/// `real(z)`: the real parts of a c64 value, f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Real;

/// `imag(z)`: the imaginary parts of a c64 value, f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Imag;

macro_rules! registration {
    ($name:ident, $text:literal, $ty:ident) => {
        pub(super) const $name: OpRegistration = OpRegistration {
            name: $text,
            from_attrs: |_| Ok(DefinedOp::new($ty)),
            examples: || vec![DefinedOp::new($ty)],
        };
    };
}
registration!(COMPLEX, "complex", Complex);
registration!(REAL, "real", Real);
registration!(IMAG, "imag", Imag);

/// The three complex primitives, which move f32 parts into and out of c64 values: a backend
/// that holds c64 values as pairs of f32 needs kernels for these only (and for [`super::Fft`],
/// or its decomposition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primitive {
    /// `complex(re, im)`.
    Complex,
    /// `real(z)`.
    Real,
    /// `imag(z)`.
    Imag,
}

/// Which complex primitive `op` is, if it is one.
pub fn primitive_of(op: &Op) -> Option<Primitive> {
    let Op::Defined(d) = op else { return None };
    if d.downcast::<Complex>().is_some() {
        Some(Primitive::Complex)
    } else if d.downcast::<Real>().is_some() {
        Some(Primitive::Real)
    } else if d.downcast::<Imag>().is_some() {
        Some(Primitive::Imag)
    } else {
        None
    }
}

/// Whether `op` is one of the complex primitives (or the FFT), which take and give complex
/// values themselves.
fn primitive(op: &Op) -> bool {
    match op {
        Op::Defined(d) => {
            d.downcast::<Complex>().is_some()
                || d.downcast::<Real>().is_some()
                || d.downcast::<Imag>().is_some()
                || d.downcast::<super::Fft>().is_some()
        }
        _ => false,
    }
}

/// Whether `op` over operands of `dtypes` runs as its complex form ([`split`]): any op with a
/// complex operand or a complex cast, except the leaves, the complex primitives and the ops
/// that carry graphs (custom functions, fused regions, control flow), whose bodies hold the
/// complex ops themselves.
pub fn splits(op: &Op, dtypes: &[DType]) -> bool {
    let carries_graphs = match op {
        Op::Custom(_) | Op::Fused(_) => true,
        Op::Defined(d) => !d.def().graphs().is_empty(),
        _ => false,
    };
    if op.is_leaf() || primitive(op) || carries_graphs {
        return false;
    }
    matches!(op, Op::Cast { to: DType::C64 }) || dtypes.contains(&DType::C64)
}

/// The error of an op reached with complex values it has no complex form for.
pub(crate) fn not_split(op: &Op) -> Error {
    Error::op(op.name(), "has no complex (c64) form")
}

/// Which binary ops complex operands take.
pub(super) fn binary_allowed(b: BinaryOp) -> bool {
    matches!(
        b,
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
    )
}

/// The result of activation `a` on complex operand `x`: `abs` is real (f32), `neg`, `exp` and
/// `log` stay complex, the others are not defined.
pub(super) fn activation(a: Activation, x: &Shape) -> Result<Shape> {
    match a {
        Activation::Abs => Ok(x.with_dtype(DType::F32)),
        Activation::Neg | Activation::Exp | Activation::Log => Ok(x.clone()),
        _ => Err(Error::op(
            Op::Activation(a).name(),
            format!("is not defined for complex operand {x}"),
        )),
    }
}

/// The parts of a complex value.
fn parts(g: &mut Graph, z: NodeId) -> Result<(NodeId, NodeId)> {
    Ok((g.try_real(z)?, g.try_imag(z)?))
}

/// `op` applied to the real and to the imaginary part of operand `z` (the other operands as
/// they are), joined.
fn partwise(g: &mut Graph, op: &Op, ins: &[NodeId], z: usize) -> Result<NodeId> {
    let (re, im) = parts(g, ins[z])?;
    let mut args = ins.to_vec();
    args[z] = re;
    let r = g.try_op(op.clone(), &args)?;
    args[z] = im;
    let i = g.try_op(op.clone(), &args)?;
    g.try_complex(r, i)
}

/// `op` (a product: matmul or dot_general) of two complex values:
/// `(ar br - ai bi) + i (ar bi + ai br)`.
fn product(g: &mut Graph, op: &Op, a: NodeId, b: NodeId) -> Result<NodeId> {
    let (ar, ai) = parts(g, a)?;
    let (br, bi) = parts(g, b)?;
    let mut p = |x, y| g.try_op(op.clone(), &[x, y]);
    let (rr, ii, ri, ir) = (p(ar, br)?, p(ai, bi)?, p(ar, bi)?, p(ai, br)?);
    let re = g.try_sub(rr, ii)?;
    let im = g.try_add(ri, ir)?;
    g.try_complex(re, im)
}

/// `|z| = sqrt(re² + im²)`.
fn modulus(g: &mut Graph, re: NodeId, im: NodeId) -> Result<NodeId> {
    let r2 = g.try_mul(re, re)?;
    let i2 = g.try_mul(im, im)?;
    let s = g.try_add(r2, i2)?;
    g.try_activation(Activation::Sqrt, s)
}

/// `atan2(y, x)` in `(-π, π]` from `atan`, selected by quadrant (the quotient's divisor is
/// made nonzero first, so the branch not taken carries no infinity into a gradient).
fn atan2(g: &mut Graph, y: NodeId, x: NodeId) -> Result<NodeId> {
    let dt = g.shape(x).dtype();
    let zero = g.try_scalar(0.0, dt)?;
    let one = g.try_scalar(1.0, dt)?;
    let x_zero = g.try_compare(CmpOp::Eq, x, zero)?;
    let safe_x = g.try_op(Op::Where, &[x_zero, one, x])?;
    let q = g.try_div(y, safe_x)?;
    let base = g.try_activation(Activation::Atan, q)?;
    let pi = g.try_scalar(std::f64::consts::PI, dt)?;
    let half_pi = g.try_scalar(std::f64::consts::FRAC_PI_2, dt)?;
    let neg_half_pi = g.try_scalar(-std::f64::consts::FRAC_PI_2, dt)?;
    let up = g.try_add(base, pi)?;
    let down = g.try_sub(base, pi)?;
    let y_nonneg = g.try_compare(CmpOp::Ge, y, zero)?;
    let left = g.try_op(Op::Where, &[y_nonneg, up, down])?;
    let y_pos = g.try_compare(CmpOp::Gt, y, zero)?;
    let y_neg = g.try_compare(CmpOp::Lt, y, zero)?;
    let axis_down = g.try_op(Op::Where, &[y_neg, neg_half_pi, zero])?;
    let axis = g.try_op(Op::Where, &[y_pos, half_pi, axis_down])?;
    let x_pos = g.try_compare(CmpOp::Gt, x, zero)?;
    let x_neg = g.try_compare(CmpOp::Lt, x, zero)?;
    let off_axis = g.try_op(Op::Where, &[x_neg, left, axis])?;
    g.try_op(Op::Where, &[x_pos, base, off_axis])
}

/// The complex form of `op` over `ins` (see the module documentation), appended to `g`.
pub fn split(g: &mut Graph, op: &Op, ins: &[NodeId]) -> Result<NodeId> {
    let c64 = |g: &Graph, i: usize| g.shape(ins[i]).dtype() == DType::C64;
    let operands: Vec<String> = ins.iter().map(|&i| g.shape(i).to_string()).collect();
    let no_form = || {
        Error::op(
            op.name(),
            format!(
                "has no complex (c64) form (operands {})",
                operands.join(", ")
            ),
        )
    };
    match op {
        Op::Binary(b) if binary_allowed(*b) => {
            let (ar, ai) = parts(g, ins[0])?;
            let (br, bi) = parts(g, ins[1])?;
            match b {
                BinaryOp::Add | BinaryOp::Sub => {
                    let re = g.try_binary(*b, ar, br)?;
                    let im = g.try_binary(*b, ai, bi)?;
                    g.try_complex(re, im)
                }
                BinaryOp::Mul => {
                    let (rr, ii) = (g.try_mul(ar, br)?, g.try_mul(ai, bi)?);
                    let (ri, ir) = (g.try_mul(ar, bi)?, g.try_mul(ai, br)?);
                    let re = g.try_sub(rr, ii)?;
                    let im = g.try_add(ri, ir)?;
                    g.try_complex(re, im)
                }
                // (ar br + ai bi) / |b|² + i (ai br - ar bi) / |b|²
                _ => {
                    let (br2, bi2) = (g.try_mul(br, br)?, g.try_mul(bi, bi)?);
                    let den = g.try_add(br2, bi2)?;
                    let (rr, ii) = (g.try_mul(ar, br)?, g.try_mul(ai, bi)?);
                    let (ir, ri) = (g.try_mul(ai, br)?, g.try_mul(ar, bi)?);
                    let num_re = g.try_add(rr, ii)?;
                    let num_im = g.try_sub(ir, ri)?;
                    let re = g.try_div(num_re, den)?;
                    let im = g.try_div(num_im, den)?;
                    g.try_complex(re, im)
                }
            }
        }
        Op::Compare(c @ (CmpOp::Eq | CmpOp::Ne)) => {
            let (ar, ai) = parts(g, ins[0])?;
            let (br, bi) = parts(g, ins[1])?;
            let re = g.try_compare(*c, ar, br)?;
            let im = g.try_compare(*c, ai, bi)?;
            // eq: both parts equal; ne: either part differs.
            let pick = g.try_scalar((*c == CmpOp::Ne) as u8 as f64, DType::Bool)?;
            if *c == CmpOp::Eq {
                g.try_op(Op::Where, &[re, im, pick])
            } else {
                g.try_op(Op::Where, &[re, pick, im])
            }
        }
        Op::Where => {
            let (ar, ai) = parts(g, ins[1])?;
            let (br, bi) = parts(g, ins[2])?;
            let re = g.try_op(Op::Where, &[ins[0], ar, br])?;
            let im = g.try_op(Op::Where, &[ins[0], ai, bi])?;
            g.try_complex(re, im)
        }
        Op::Activation(a) => {
            let (re, im) = parts(g, ins[0])?;
            match a {
                Activation::Neg => {
                    let (r, i) = (
                        g.try_activation(Activation::Neg, re)?,
                        g.try_activation(Activation::Neg, im)?,
                    );
                    g.try_complex(r, i)
                }
                Activation::Abs => modulus(g, re, im),
                // e^re (cos im + i sin im)
                Activation::Exp => {
                    let e = g.try_activation(Activation::Exp, re)?;
                    let c = g.try_activation(Activation::Cos, im)?;
                    let s = g.try_activation(Activation::Sin, im)?;
                    let r = g.try_mul(e, c)?;
                    let i = g.try_mul(e, s)?;
                    g.try_complex(r, i)
                }
                // log |z| + i arg z
                Activation::Log => {
                    let m = modulus(g, re, im)?;
                    let r = g.try_activation(Activation::Log, m)?;
                    let i = atan2(g, im, re)?;
                    g.try_complex(r, i)
                }
                _ => Err(no_form()),
            }
        }
        Op::Cast { to } => match (c64(g, 0), *to) {
            (true, DType::C64) => {
                let (re, im) = parts(g, ins[0])?;
                g.try_complex(re, im)
            }
            // numpy and JAX keep the real part.
            (true, to) => {
                let re = g.try_real(ins[0])?;
                g.try_cast(re, to)
            }
            (false, _) => {
                let re = g.try_cast(ins[0], DType::F32)?;
                let zero = g.try_scalar(0.0, DType::F32)?;
                g.try_complex(re, zero)
            }
        },
        Op::MatMul | Op::DotGeneral(_) => product(g, op, ins[0], ins[1]),
        Op::Reduce {
            kind: ReduceKind::Sum | ReduceKind::Mean,
            ..
        }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Expand { .. }
        | Op::Cumsum { .. }
        | Op::Gather { .. } => partwise(g, op, ins, 0),
        Op::Concat { .. } => {
            let mut re = Vec::with_capacity(ins.len());
            let mut im = Vec::with_capacity(ins.len());
            for &x in ins {
                let (r, i) = parts(g, x)?;
                re.push(r);
                im.push(i);
            }
            let r = g.try_op(op.clone(), &re)?;
            let i = g.try_op(op.clone(), &im)?;
            g.try_complex(r, i)
        }
        Op::ScatterAdd { .. } => {
            let (xr, xi) = parts(g, ins[0])?;
            let (ur, ui) = parts(g, ins[2])?;
            let r = g.try_op(op.clone(), &[xr, ins[1], ur])?;
            let i = g.try_op(op.clone(), &[xi, ins[1], ui])?;
            g.try_complex(r, i)
        }
        _ => Err(no_form()),
    }
}

impl Graph {
    /// `complex(re, im)`: f32 parts, broadcast together, to c64.
    pub fn try_complex(&mut self, re: NodeId, im: NodeId) -> Result<NodeId> {
        self.try_op(Op::defined(Complex), &[re, im])
    }

    /// The real parts of c64 `z` (f32).
    pub fn try_real(&mut self, z: NodeId) -> Result<NodeId> {
        self.try_op(Op::defined(Real), &[z])
    }

    /// The imaginary parts of c64 `z` (f32).
    pub fn try_imag(&mut self, z: NodeId) -> Result<NodeId> {
        self.try_op(Op::defined(Imag), &[z])
    }

    /// The complex conjugate of c64 `z`.
    pub fn try_conj(&mut self, z: NodeId) -> Result<NodeId> {
        let (re, im) = parts(self, z)?;
        let im = self.try_activation(Activation::Neg, im)?;
        self.try_complex(re, im)
    }

    /// The argument of c64 `z` in `(-π, π]` (numpy's `angle`; f32).
    pub fn try_angle(&mut self, z: NodeId) -> Result<NodeId> {
        let (re, im) = parts(self, z)?;
        atan2(self, im, re)
    }
}

/// The c64 operand of a `real` / `imag` node, checked.
fn complex_operand(name: &str, z: &Shape) -> Result<()> {
    if z.dtype() != DType::C64 {
        return Err(Error::op(name, format!("needs a c64 operand, got {z}")));
    }
    Ok(())
}

impl OpDef for Complex {
    fn name(&self) -> &'static str {
        COMPLEX.name
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        Vec::new()
    }

    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        if ins.iter().any(|s| s.dtype() != DType::F32) {
            return Err(Error::op(
                COMPLEX.name,
                format!(
                    "parts must be f32 (c64 holds f32 parts), got {} and {}",
                    ins[0], ins[1]
                ),
            ));
        }
        let d = broadcast_dims(ins[0].dims(), ins[1].dims()).ok_or_else(|| {
            Error::op(
                COMPLEX.name,
                format!("shapes do not broadcast: {} vs {}", ins[0], ins[1]),
            )
        })?;
        Ok(Shape::with_dims(d, DType::C64))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let od = super::static_dims(COMPLEX.name, "result", out)?;
        let re = ins[0].broadcast_to(&od).f64s();
        let im = ins[1].broadcast_to(&od).f64s();
        Ok(Tensor::from_complex(&od, re.into_iter().zip(im).collect()))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        Cost::streaming(ins, out, 0)
    }

    fn has_ad_rules(&self) -> bool {
        true
    }

    /// `re` gets `real(ct)`, `im` gets `-imag(ct)` (each summed back to its shape).
    fn vjp(
        &self,
        g: &mut Graph,
        ins: &[NodeId],
        _: NodeId,
        ct: NodeId,
    ) -> Result<Vec<Option<NodeId>>> {
        let (re, im) = parts(g, ct)?;
        let im = g.try_activation(Activation::Neg, im)?;
        let (rs, is) = (g.shape(ins[0]).clone(), g.shape(ins[1]).clone());
        Ok(vec![
            Some(unbroadcast(g, re, &rs)?),
            Some(unbroadcast(g, im, &is)?),
        ])
    }

    /// `complex(t_re, t_im)`, a missing tangent taken as zero, broadcast to the result.
    fn jvp(
        &self,
        g: &mut Graph,
        _: &[NodeId],
        out: NodeId,
        t: &[Option<NodeId>],
    ) -> Result<Option<NodeId>> {
        if t.iter().all(Option::is_none) {
            return Ok(None);
        }
        let mut part = |t: Option<NodeId>| match t {
            Some(t) => Ok(t),
            None => g.try_scalar(0.0, DType::F32),
        };
        let (r, i) = (part(t[0])?, part(t[1])?);
        let z = g.try_complex(r, i)?;
        let dims = super::ad::dims(g, out);
        super::ad::fit(g, z, &dims).map(Some)
    }

    fn batchable(&self, _: &[bool]) -> bool {
        true
    }

    fn batch(&self, g: &mut Graph, b: &Batched) -> Result<(NodeId, Option<usize>)> {
        Ok((broadcasting(g, &Op::defined(Complex), b)?, Some(0)))
    }

    fn precision_class(&self) -> super::OpClass {
        super::OpClass::Movement
    }
}

/// The rules `real` and `imag` share; `imag` differs in the part it takes and the sign of its
/// transpose.
macro_rules! part_op {
    ($ty:ident, $reg:ident, $pick:expr, $transpose:expr) => {
        impl OpDef for $ty {
            fn name(&self) -> &'static str {
                $reg.name
            }

            fn attrs(&self) -> Vec<(&'static str, Attr)> {
                Vec::new()
            }

            fn arity(&self) -> (usize, usize) {
                (1, 1)
            }

            fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
                complex_operand($reg.name, ins[0])?;
                Ok(ins[0].with_dtype(DType::F32))
            }

            fn eval(&self, ins: &[&Tensor], _: &Shape) -> Result<Tensor> {
                let pick: fn((f64, f64)) -> f64 = $pick;
                Ok(Tensor::from_f64(
                    ins[0].dims(),
                    DType::F32,
                    ins[0].complex().into_iter().map(pick).collect(),
                ))
            }

            fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
                Cost::streaming(ins, out, 0)
            }

            fn has_ad_rules(&self) -> bool {
                true
            }

            fn vjp(
                &self,
                g: &mut Graph,
                _: &[NodeId],
                _: NodeId,
                ct: NodeId,
            ) -> Result<Vec<Option<NodeId>>> {
                let transpose: fn(&mut Graph, NodeId) -> Result<NodeId> = $transpose;
                Ok(vec![Some(transpose(g, ct)?)])
            }

            fn jvp(
                &self,
                g: &mut Graph,
                _: &[NodeId],
                _: NodeId,
                t: &[Option<NodeId>],
            ) -> Result<Option<NodeId>> {
                t[0].map(|t| g.try_op(Op::defined($ty), &[t])).transpose()
            }

            fn batchable(&self, _: &[bool]) -> bool {
                true
            }

            fn batch(&self, g: &mut Graph, b: &Batched) -> Result<(NodeId, Option<usize>)> {
                Ok((g.try_op(Op::defined($ty), &[b.ins[0]])?, b.bds[0]))
            }

            fn precision_class(&self) -> super::OpClass {
                super::OpClass::Movement
            }
        }
    };
}

part_op!(Real, REAL, |(r, _)| r, |g, ct| {
    let z = g.try_scalar(0.0, DType::F32)?;
    g.try_complex(ct, z)
});
part_op!(Imag, IMAG, |(_, i)| i, |g, ct| {
    let z = g.try_scalar(0.0, DType::F32)?;
    let n = g.try_activation(Activation::Neg, ct)?;
    g.try_complex(z, n)
});
