//! Rules of elementwise ops: Binary, Compare, Where, Activation.

use super::{require_float, same_dtype};
use crate::text::{Attr, Attrs};
use crate::{broadcast_dims, Activation, BinaryOp, DType, Error, Op, OpKind, Result, Shape};

fn broadcast(op: &str, a: &Shape, b: &Shape) -> Result<Vec<crate::Dim>> {
    broadcast_dims(a.dims(), b.dims())
        .ok_or_else(|| Error::op(op, format!("shapes do not broadcast: lhs {a} vs rhs {b}")))
}

pub(super) fn binary(b: BinaryOp, ins: &[&Shape]) -> Result<Shape> {
    let name = Op::Binary(b).name();
    same_dtype(name, ins[0], ins[1])?;
    if b == BinaryOp::Pow {
        require_float(name, ins[0])?;
    }
    if ins[0].dtype() == DType::C64 && !super::complex::binary_allowed(b) {
        return Err(Error::op(
            name,
            format!("is not defined on complex operands ({})", ins[0]),
        ));
    }
    if ins[0].dtype() == DType::Bool && !matches!(b, BinaryOp::Max | BinaryOp::Min) {
        return Err(Error::op(
            name,
            format!("is not defined on bool operands ({})", ins[0]),
        ));
    }
    Ok(Shape::with_dims(
        broadcast(name, ins[0], ins[1])?,
        ins[0].dtype(),
    ))
}

pub(super) fn compare(op: &Op, ins: &[&Shape]) -> Result<Shape> {
    same_dtype(op.name(), ins[0], ins[1])?;
    if ins[0].dtype() == DType::C64
        && !matches!(op, Op::Compare(crate::CmpOp::Eq | crate::CmpOp::Ne))
    {
        return Err(Error::op(
            op.name(),
            format!("complex numbers have no order ({})", ins[0]),
        ));
    }
    Ok(Shape::with_dims(
        broadcast(op.name(), ins[0], ins[1])?,
        DType::Bool,
    ))
}

pub(super) fn select(ins: &[&Shape]) -> Result<Shape> {
    if ins[0].dtype() != DType::Bool {
        return Err(Error::op(
            "where",
            format!("condition must be bool, got {}", ins[0]),
        ));
    }
    same_dtype("where", ins[1], ins[2])?;
    let d = broadcast("where", ins[0], ins[1])?;
    let d = broadcast("where", &Shape::with_dims(d, DType::Bool), ins[2])?;
    Ok(Shape::with_dims(d, ins[1].dtype()))
}

pub(super) fn activation(a: Activation, x: &Shape) -> Result<Shape> {
    let name = Op::Activation(a).name();
    if x.dtype() == DType::C64 {
        return super::complex::activation(a, x);
    }
    let ok = x.dtype().is_float() || (a.allows_int() && x.dtype().is_int());
    if !ok {
        return Err(Error::op(name, format!("is not defined for operand {x}")));
    }
    Ok(x.clone())
}

// ---------------------------------------------------------------- differentiation rules

use super::ad::{add_opt, differentiable, dims, fit, full_like, scalar, unbroadcast};
use crate::{CmpOp, Graph, NodeId};

/// `log(a)` with zeros replaced by one: d(a^b)/db = a^b log a is 0 at a = 0 (0^b is constant
/// in b there), where `0 * log 0` would give NaN.
fn safe_log(g: &mut Graph, a: NodeId) -> Result<NodeId> {
    let dt = g.shape(a).dtype();
    let zero = scalar(g, 0.0, dt)?;
    let one = scalar(g, 1.0, dt)?;
    let z = g.try_compare(CmpOp::Eq, a, zero)?;
    let a1 = g.try_select(z, one, a)?;
    g.try_activation(Activation::Log, a1)
}

/// `f'(x)` of an activation as a graph value (`None` where it is zero everywhere).
fn derivative(g: &mut Graph, a: Activation, x: NodeId, y: NodeId) -> Result<Option<NodeId>> {
    let dt = g.shape(x).dtype();
    let c = |g: &mut Graph, v: f64| scalar(g, v, dt);
    let d = match a {
        Activation::Round => return Ok(None),
        Activation::Neg => full_like(g, -1.0, x)?,
        Activation::Exp => y,
        Activation::Relu | Activation::Abs => {
            let zero = c(g, 0.0)?;
            let pos = g.try_compare(CmpOp::Gt, x, zero)?;
            let pos = g.try_cast(pos, dt)?;
            if a == Activation::Relu {
                pos
            } else {
                let neg = g.try_compare(CmpOp::Lt, x, zero)?;
                let neg = g.try_cast(neg, dt)?;
                g.try_sub(pos, neg)?
            }
        }
        Activation::Sigmoid => {
            let one = c(g, 1.0)?;
            let om = g.try_sub(one, y)?;
            g.try_mul(y, om)?
        }
        Activation::Tanh => {
            let one = c(g, 1.0)?;
            let y2 = g.try_mul(y, y)?;
            g.try_sub(one, y2)?
        }
        Activation::Log => {
            let one = c(g, 1.0)?;
            g.try_div(one, x)?
        }
        Activation::Sqrt => {
            let h = c(g, 0.5)?;
            g.try_div(h, y)?
        }
        Activation::Rsqrt => {
            let h = c(g, -0.5)?;
            let t = g.try_div(y, x)?;
            g.try_mul(h, t)?
        }
        Activation::Sin => g.try_activation(Activation::Cos, x)?,
        Activation::Cos => {
            let s = g.try_activation(Activation::Sin, x)?;
            g.try_activation(Activation::Neg, s)?
        }
        Activation::Tan => {
            let one = c(g, 1.0)?;
            let y2 = g.try_mul(y, y)?;
            g.try_add(one, y2)?
        }
        Activation::Atan => {
            let one = c(g, 1.0)?;
            let x2 = g.try_mul(x, x)?;
            let den = g.try_add(one, x2)?;
            g.try_div(one, den)?
        }
        Activation::Erf => {
            // 2/sqrt(pi) * exp(-x^2)
            let k = c(g, 2.0 / std::f64::consts::PI.sqrt())?;
            let x2 = g.try_mul(x, x)?;
            let nx2 = g.try_activation(Activation::Neg, x2)?;
            let e = g.try_activation(Activation::Exp, nx2)?;
            g.try_mul(k, e)?
        }
        Activation::Gelu => {
            // Phi(x) + x * phi(x)
            let (h, r2, k) = (
                c(g, 0.5)?,
                c(g, std::f64::consts::FRAC_1_SQRT_2)?,
                c(g, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?,
            );
            let one = c(g, 1.0)?;
            let xs = g.try_mul(x, r2)?;
            let erf = g.try_activation(Activation::Erf, xs)?;
            let cdf = g.try_add(one, erf)?;
            let cdf = g.try_mul(h, cdf)?;
            let x2 = g.try_mul(x, x)?;
            let hx2 = g.try_mul(h, x2)?;
            let nhx2 = g.try_activation(Activation::Neg, hx2)?;
            let e = g.try_activation(Activation::Exp, nhx2)?;
            let pdf = g.try_mul(k, e)?;
            let xpdf = g.try_mul(x, pdf)?;
            g.try_add(cdf, xpdf)?
        }
        // One function: see `GeluApproxGrad` below for its formula.
        Activation::GeluApprox => g.try_activation(Activation::GeluApproxGrad, x)?,
        Activation::GeluApproxGrad => {
            // With 0.5 (1 + tanh(u)) = sigmoid(2u), u = k0 (x + k1 x^3) / 2: gelu = x s, s =
            // sigmoid(2u), s' = s (1 - s) d, d = (2u)' = k0 + k3 x^2, so gelu' = s + x s (1 - s) d
            // and gelu'' = s (1 - s) (2 d + x (1 - 2 s) d^2 + 2 k3 x^2).
            let k0v = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
            let k3v = k0v * 3.0 * 0.044715;
            let (one, two, k0, k1, k3, k3x2c) = (
                c(g, 1.0)?,
                c(g, 2.0)?,
                c(g, k0v)?,
                c(g, 0.044715)?,
                c(g, k3v)?,
                c(g, 2.0 * k3v)?,
            );
            let x2 = g.try_mul(x, x)?;
            let x3 = g.try_mul(x2, x)?;
            let k1x3 = g.try_mul(k1, x3)?;
            let inner = g.try_add(x, k1x3)?;
            let u2 = g.try_mul(k0, inner)?;
            let s = g.try_activation(Activation::Sigmoid, u2)?;
            let oms = g.try_sub(one, s)?;
            let q = g.try_mul(s, oms)?;
            let k3x2 = g.try_mul(k3, x2)?;
            let d = g.try_add(k0, k3x2)?;
            let twos = g.try_mul(two, s)?;
            let om2s = g.try_sub(one, twos)?;
            let d2 = g.try_mul(d, d)?;
            let t = g.try_mul(x, om2s)?;
            let t = g.try_mul(t, d2)?;
            let twod = g.try_mul(two, d)?;
            let t = g.try_add(twod, t)?;
            let e = g.try_mul(k3x2c, x2)?;
            let t = g.try_add(t, e)?;
            g.try_mul(q, t)?
        }
        Activation::Silu => {
            // s (1 + x (1 - s))
            let s = g.try_activation(Activation::Sigmoid, x)?;
            let one = c(g, 1.0)?;
            let oms = g.try_sub(one, s)?;
            let xo = g.try_mul(x, oms)?;
            let f = g.try_add(one, xo)?;
            g.try_mul(s, f)?
        }
    };
    Ok(Some(d))
}

pub(super) fn vjp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    out: NodeId,
    ct: NodeId,
) -> Result<Vec<Option<NodeId>>> {
    let float = |g: &Graph, x: NodeId| differentiable(g.shape(x).dtype());
    match op {
        Op::Binary(b) => {
            let (a, bb) = (ins[0], ins[1]);
            if !float(g, a) {
                return Ok(vec![None, None]);
            }
            let (sa, sb) = (g.shape(a).clone(), g.shape(bb).clone());
            let (ga, gb) = match b {
                BinaryOp::Add => (ct, ct),
                BinaryOp::Sub => (ct, g.try_activation(Activation::Neg, ct)?),
                BinaryOp::Mul => (g.try_mul(ct, bb)?, g.try_mul(ct, a)?),
                BinaryOp::Div => {
                    let ga = g.try_div(ct, bb)?;
                    let t = g.try_mul(ct, out)?;
                    let t = g.try_div(t, bb)?;
                    (ga, g.try_activation(Activation::Neg, t)?)
                }
                BinaryOp::Max | BinaryOp::Min => {
                    let cmp = if *b == BinaryOp::Max {
                        CmpOp::Ge
                    } else {
                        CmpOp::Le
                    };
                    let m = g.try_compare(cmp, a, bb)?;
                    let zero = scalar(g, 0.0, sa.dtype())?;
                    (g.try_select(m, ct, zero)?, g.try_select(m, zero, ct)?)
                }
                BinaryOp::Pow => {
                    let one = scalar(g, 1.0, sa.dtype())?;
                    let bm1 = g.try_sub(bb, one)?;
                    let p = g.try_pow(a, bm1)?;
                    let da = g.try_mul(bb, p)?;
                    let ga = g.try_mul(ct, da)?;
                    let la = safe_log(g, a)?;
                    let db = g.try_mul(out, la)?;
                    (ga, g.try_mul(ct, db)?)
                }
            };
            Ok(vec![
                Some(unbroadcast(g, ga, &sa)?),
                Some(unbroadcast(g, gb, &sb)?),
            ])
        }
        Op::Compare(_) => Ok(vec![None, None]),
        Op::Where => {
            let (c, a, b) = (ins[0], ins[1], ins[2]);
            if !float(g, a) {
                return Ok(vec![None, None, None]);
            }
            let zero = scalar(g, 0.0, g.shape(a).dtype())?;
            let ga = g.try_select(c, ct, zero)?;
            let gb = g.try_select(c, zero, ct)?;
            let (sa, sb) = (g.shape(a).clone(), g.shape(b).clone());
            Ok(vec![
                None,
                Some(unbroadcast(g, ga, &sa)?),
                Some(unbroadcast(g, gb, &sb)?),
            ])
        }
        Op::Activation(act) => {
            if !float(g, ins[0]) {
                return Ok(vec![None]);
            }
            Ok(vec![match derivative(g, *act, ins[0], out)? {
                Some(d) => Some(g.try_mul(ct, d)?),
                None => None,
            }])
        }
        Op::Cast { to } => {
            let from = g.shape(ins[0]).dtype();
            if differentiable(from) && differentiable(*to) {
                Ok(vec![Some(g.try_cast(ct, from)?)])
            } else {
                Ok(vec![None])
            }
        }
        other => Err(Error::op(other.name(), "is not an elementwise op")),
    }
}

pub(super) fn jvp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    out: NodeId,
    t: &[Option<NodeId>],
) -> Result<Option<NodeId>> {
    let od = dims(g, out);
    let r = match op {
        Op::Binary(b) => {
            let (a, bb) = (ins[0], ins[1]);
            if !differentiable(g.shape(a).dtype()) {
                return Ok(None);
            }
            match b {
                BinaryOp::Add => add_opt(g, t[0], t[1])?,
                BinaryOp::Sub => {
                    let nb = match t[1] {
                        Some(x) => Some(g.try_activation(Activation::Neg, x)?),
                        None => None,
                    };
                    add_opt(g, t[0], nb)?
                }
                BinaryOp::Mul => {
                    let x = match t[0] {
                        Some(ta) => Some(g.try_mul(ta, bb)?),
                        None => None,
                    };
                    let y = match t[1] {
                        Some(tb) => Some(g.try_mul(a, tb)?),
                        None => None,
                    };
                    add_opt(g, x, y)?
                }
                BinaryOp::Div => {
                    let x = match t[0] {
                        Some(ta) => Some(g.try_div(ta, bb)?),
                        None => None,
                    };
                    let y = match t[1] {
                        Some(tb) => {
                            let q = g.try_mul(tb, out)?;
                            let q = g.try_div(q, bb)?;
                            Some(g.try_activation(Activation::Neg, q)?)
                        }
                        None => None,
                    };
                    add_opt(g, x, y)?
                }
                BinaryOp::Max | BinaryOp::Min => {
                    let cmp = if *b == BinaryOp::Max {
                        CmpOp::Ge
                    } else {
                        CmpOp::Le
                    };
                    let m = g.try_compare(cmp, a, bb)?;
                    let zero = scalar(g, 0.0, g.shape(a).dtype())?;
                    let ta = t[0].unwrap_or(zero);
                    let tb = t[1].unwrap_or(zero);
                    Some(g.try_select(m, ta, tb)?)
                }
                BinaryOp::Pow => {
                    let x = match t[0] {
                        Some(ta) => {
                            let one = scalar(g, 1.0, g.shape(a).dtype())?;
                            let bm1 = g.try_sub(bb, one)?;
                            let p = g.try_pow(a, bm1)?;
                            let d = g.try_mul(bb, p)?;
                            Some(g.try_mul(ta, d)?)
                        }
                        None => None,
                    };
                    let y = match t[1] {
                        Some(tb) => {
                            let la = safe_log(g, a)?;
                            let d = g.try_mul(out, la)?;
                            Some(g.try_mul(tb, d)?)
                        }
                        None => None,
                    };
                    add_opt(g, x, y)?
                }
            }
        }
        Op::Compare(_) => None,
        Op::Where => {
            if t[1].is_none() && t[2].is_none() {
                return Ok(None);
            }
            let zero = scalar(g, 0.0, g.shape(ins[1]).dtype())?;
            Some(g.try_select(ins[0], t[1].unwrap_or(zero), t[2].unwrap_or(zero))?)
        }
        Op::Activation(act) => match (t[0], differentiable(g.shape(ins[0]).dtype())) {
            (Some(tx), true) => match derivative(g, *act, ins[0], out)? {
                Some(d) => Some(g.try_mul(tx, d)?),
                None => None,
            },
            _ => None,
        },
        Op::Cast { to } => match t[0] {
            Some(tx) if differentiable(*to) => Some(g.try_cast(tx, *to)?),
            _ => None,
        },
        other => return Err(Error::op(other.name(), "is not an elementwise op")),
    };
    r.map(|x| fit(g, x, &od)).transpose()
}

// ---------------------------------------------------------------- reference evaluation

use super::static_dims;
use crate::eval::{Data, Tensor};

/// `f(x)` of a float activation, in f64.
fn activate(a: Activation, x: f64) -> f64 {
    const K0: f64 = 0.797_884_560_802_865_4; // sqrt(2 / pi)
    const K1: f64 = 0.044715;
    match a {
        Activation::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        Activation::GeluApprox => 0.5 * x * (1.0 + (K0 * (x + K1 * x * x * x)).tanh()),
        Activation::GeluApproxGrad => {
            let t = (K0 * (x + K1 * x * x * x)).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * K0 * (1.0 + 3.0 * K1 * x * x)
        }
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::Relu => x.max(0.0),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::Tanh => x.tanh(),
        Activation::Exp => x.exp(),
        Activation::Log => x.ln(),
        Activation::Sqrt => x.sqrt(),
        Activation::Rsqrt => 1.0 / x.sqrt(),
        Activation::Neg => -x,
        Activation::Abs => x.abs(),
        Activation::Sin => x.sin(),
        Activation::Cos => x.cos(),
        Activation::Tan => x.tan(),
        Activation::Atan => x.atan(),
        Activation::Round => x.round_ties_even(),
        Activation::Erf => libm::erf(x),
    }
}

/// `max`/`min` where NaN wins, as the backends compute them.
fn max_nan(a: f64, b: f64) -> f64 {
    if a >= b || a.is_nan() {
        a
    } else {
        b
    }
}

fn min_nan(a: f64, b: f64) -> f64 {
    if a <= b || a.is_nan() {
        a
    } else {
        b
    }
}

fn binary_float(b: BinaryOp, x: f64, y: f64) -> f64 {
    match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max => max_nan(x, y),
        BinaryOp::Min => min_nan(x, y),
        BinaryOp::Pow => x.powf(y),
    }
}

/// Integer arithmetic before wrapping to the dtype (`x / 0` is all bits set, i.e. -1).
fn binary_int(b: BinaryOp, x: i128, y: i128) -> i128 {
    match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div if y == 0 => -1,
        BinaryOp::Div => x / y,
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        // Rejected by shape inference (floats only); zero keeps the evaluator total.
        BinaryOp::Pow => 0,
    }
}

fn holds<T: PartialOrd>(c: CmpOp, x: T, y: T) -> bool {
    match c {
        CmpOp::Eq => x == y,
        CmpOp::Ne => x != y,
        CmpOp::Lt => x < y,
        CmpOp::Le => x <= y,
        CmpOp::Gt => x > y,
        CmpOp::Ge => x >= y,
    }
}

/// Reference evaluation of Binary, Compare, Where, Activation and Cast.
pub(super) fn eval(op: &Op, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let od = static_dims(op.name(), "result", out)?;
    let dt = out.dtype();
    let bc: Vec<Tensor> = ins
        .iter()
        .map(|t| {
            if matches!(op, Op::Activation(_) | Op::Cast { .. }) {
                (*t).clone()
            } else {
                t.broadcast_to(&od)
            }
        })
        .collect();
    Ok(match op {
        Op::Binary(b) => match (bc[0].data(), bc[1].data()) {
            (Data::Float(x), Data::Float(y)) => Tensor::from_f64(
                &od,
                dt,
                x.iter()
                    .zip(y)
                    .map(|(&x, &y)| binary_float(*b, x, y))
                    .collect(),
            ),
            (Data::Int(x), Data::Int(y)) => Tensor::from_i128(
                &od,
                dt,
                x.iter()
                    .zip(y)
                    .map(|(&x, &y)| binary_int(*b, x as i128, y as i128))
                    .collect(),
            ),
            _ => {
                return Err(Error::op(
                    op.name(),
                    "operands of one dtype hold different element kinds",
                ))
            }
        },
        Op::Compare(c) => {
            let v: Vec<i64> = match (bc[0].data(), bc[1].data()) {
                (Data::Float(x), Data::Float(y)) => x
                    .iter()
                    .zip(y)
                    .map(|(&x, &y)| holds(*c, x, y) as i64)
                    .collect(),
                (Data::Int(x), Data::Int(y)) => x
                    .iter()
                    .zip(y)
                    .map(|(&x, &y)| holds(*c, x, y) as i64)
                    .collect(),
                _ => {
                    return Err(Error::op(
                        op.name(),
                        "operands of one dtype hold different element kinds",
                    ))
                }
            };
            Tensor::from_i64(&od, DType::Bool, v)
        }
        Op::Where => {
            let cond = bc[0].i64s();
            let src: Vec<usize> = (0..cond.len())
                .map(|i| if cond[i] != 0 { i } else { cond.len() + i })
                .collect();
            let both = match (bc[1].data(), bc[2].data()) {
                (Data::Float(a), Data::Float(b)) => {
                    Tensor::from_f64(&[2 * cond.len()], dt, [a.as_slice(), b].concat())
                }
                (Data::Int(a), Data::Int(b)) => {
                    Tensor::from_i64(&[2 * cond.len()], dt, [a.as_slice(), b].concat())
                }
                _ => {
                    return Err(Error::op(
                        op.name(),
                        "operands of one dtype hold different element kinds",
                    ))
                }
            };
            both.pick(&od, &src)
        }
        Op::Activation(a) => match bc[0].data() {
            Data::Float(x) => {
                Tensor::from_f64(&od, dt, x.iter().map(|&x| activate(*a, x)).collect())
            }
            Data::Int(x) => {
                let f = |v: i64| -> i128 {
                    match a {
                        Activation::Neg => -(v as i128),
                        Activation::Abs => (v as i128).abs(),
                        _ => (v as i128).max(0),
                    }
                };
                Tensor::from_i128(&od, dt, x.iter().map(|&v| f(v)).collect())
            }
            Data::Complex(_) => return Err(super::complex::not_split(op)),
        },
        Op::Cast { .. } => match bc[0].data() {
            Data::Float(x) => Tensor::from_f64(&od, dt, x.clone()),
            Data::Int(x) => Tensor::from_i64(&od, dt, x.clone()),
            Data::Complex(_) => return Err(super::complex::not_split(op)),
        },
        other => return Err(Error::op(other.name(), "is not an elementwise op")),
    })
}

/// Cost of an elementwise op: one operation per result element (a transcendental function
/// counts as ten), each operand read once and the result written once.
pub(super) fn cost(op: &Op, ins: &[&Shape], out: &Shape) -> super::Cost {
    let per = match op {
        Op::Activation(a)
            if !matches!(
                a,
                Activation::Relu | Activation::Neg | Activation::Abs | Activation::Round
            ) =>
        {
            10
        }
        _ => 1,
    };
    super::Cost::streaming(ins, out, per)
}

const BINARY: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Pow,
];
const COMPARE: [crate::CmpOp; 6] = [
    crate::CmpOp::Eq,
    crate::CmpOp::Ne,
    crate::CmpOp::Lt,
    crate::CmpOp::Le,
    crate::CmpOp::Gt,
    crate::CmpOp::Ge,
];
const ACTIVATION: [Activation; 19] = [
    Activation::Gelu,
    Activation::GeluApprox,
    Activation::GeluApproxGrad,
    Activation::Silu,
    Activation::Relu,
    Activation::Sigmoid,
    Activation::Tanh,
    Activation::Exp,
    Activation::Log,
    Activation::Sqrt,
    Activation::Rsqrt,
    Activation::Neg,
    Activation::Abs,
    Activation::Sin,
    Activation::Cos,
    Activation::Tan,
    Activation::Atan,
    Activation::Round,
    Activation::Erf,
];

/// Text-form attributes: only a cast has one (its target dtype); the function is the op's name.
pub fn attrs(op: &Op) -> Vec<(&'static str, Attr)> {
    match op {
        Op::Cast { to } => vec![("to", Attr::word(to.name()))],
        _ => Vec::new(),
    }
}

/// The elementwise op of `kind` from its text-form attributes.
pub fn from_attrs(kind: OpKind, a: &mut Attrs) -> Result<Op> {
    match kind {
        OpKind::Cast => return Ok(Op::Cast { to: a.dtype("to")? }),
        OpKind::Where => return Ok(Op::Where),
        _ => {}
    }
    let ops = BINARY
        .map(Op::Binary)
        .into_iter()
        .chain(COMPARE.map(Op::Compare))
        .chain(ACTIVATION.map(Op::Activation));
    ops.into_iter()
        .find(|op| op.kind() == kind)
        .ok_or_else(|| Error::op(kind.name(), "is not an elementwise op"))
}

// Batching.

use super::batch::{broadcasting, Batched};

/// Batching rule: binary ops, comparisons and `Where` broadcast (see [`broadcasting`]);
/// functions of one operand keep its batch axis where it is.
pub(super) fn batch(g: &mut Graph, op: &Op, b: &Batched) -> Result<(NodeId, Option<usize>)> {
    match op {
        Op::Activation(_) | Op::Cast { .. } => Ok((g.try_op(op.clone(), b.ins)?, b.bds[0])),
        _ => Ok((broadcasting(g, op, b)?, Some(0))),
    }
}
