//! Rules of indexing ops: Gather, ScatterAdd.

use super::{check_axis, same_dtype};
use crate::text::{Attr, Attrs};
use crate::{Dim, Error, Result, Shape};

fn require_index(op: &str, idx: &Shape) -> Result<()> {
    if !idx.dtype().is_int() {
        return Err(Error::op(
            op,
            format!("indices must be integers, got {idx}"),
        ));
    }
    Ok(())
}

pub(super) fn gather(axis: usize, ins: &[&Shape]) -> Result<Shape> {
    let (x, idx) = (ins[0], ins[1]);
    check_axis("gather", axis, x)?;
    require_index("gather", idx)?;
    let mut dims: Vec<Dim> = x.dims()[..axis].to_vec();
    dims.extend_from_slice(idx.dims());
    dims.extend_from_slice(&x.dims()[axis + 1..]);
    Ok(Shape::with_dims(dims, x.dtype()))
}

pub(super) fn scatter_add(axis: usize, ins: &[&Shape]) -> Result<Shape> {
    let (x, idx, upd) = (ins[0], ins[1], ins[2]);
    check_axis("scatter_add", axis, x)?;
    require_index("scatter_add", idx)?;
    same_dtype("scatter_add", x, upd)?;
    if idx.rank() != 1 {
        return Err(Error::op(
            "scatter_add",
            format!("indices must be 1-d, got {idx}"),
        ));
    }
    let mut want = x.dims().to_vec();
    want[axis] = idx.dims()[0].clone();
    if upd.dims() != want.as_slice() {
        let w = Shape::with_dims(want, x.dtype());
        return Err(Error::op(
            "scatter_add",
            format!("updates must have shape {w}, got {upd}"),
        ));
    }
    Ok(x.clone())
}

// ---------------------------------------------------------------- differentiation rules

use super::ad::{differentiable, dims, zeros_like};
use crate::{Graph, NodeId, Op};

pub(super) fn vjp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    ct: NodeId,
) -> Result<Vec<Option<NodeId>>> {
    let x = ins[0];
    if !differentiable(g.shape(x).dtype()) {
        return Ok(vec![None; ins.len()]);
    }
    Ok(match op {
        Op::Gather { axis } => {
            // Scatter the cotangent rows back; indices of any rank are flattened to one axis.
            let idx = ins[1];
            let m: usize = dims(g, idx).iter().product();
            let flat = g.try_reshape(idx, &[m])?;
            let xd = dims(g, x);
            let mut ud = xd[..*axis].to_vec();
            ud.push(m);
            ud.extend_from_slice(&xd[axis + 1..]);
            let upd = g.try_reshape(ct, &ud)?;
            let z = zeros_like(g, x)?;
            vec![Some(g.try_scatter_add(z, flat, upd, *axis)?), None]
        }
        Op::ScatterAdd { axis } => vec![Some(ct), None, Some(g.try_gather(ct, ins[1], *axis)?)],
        other => return Err(Error::op(other.name(), "is not an indexing op")),
    })
}

pub(super) fn jvp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    t: &[Option<NodeId>],
) -> Result<Option<NodeId>> {
    if !differentiable(g.shape(ins[0]).dtype()) {
        return Ok(None);
    }
    Ok(match op {
        Op::Gather { axis } => match t[0] {
            Some(tx) => Some(g.try_gather(tx, ins[1], *axis)?),
            None => None,
        },
        Op::ScatterAdd { axis } => {
            if t[0].is_none() && t[2].is_none() {
                return Ok(None);
            }
            let tx = match t[0] {
                Some(v) => v,
                None => zeros_like(g, ins[0])?,
            };
            let tu = match t[2] {
                Some(v) => v,
                None => zeros_like(g, ins[2])?,
            };
            Some(g.try_scatter_add(tx, ins[1], tu, *axis)?)
        }
        other => return Err(Error::op(other.name(), "is not an indexing op")),
    })
}

// ---------------------------------------------------------------- reference evaluation

use super::static_dims;
use crate::eval::{strides, unravel, Data, Tensor};

/// Reference Gather (out-of-range indices clamp into the axis) and ScatterAdd (out-of-range
/// updates are dropped), JAX's defaults.
pub(super) fn eval(op: &Op, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let od = static_dims(op.name(), "result", out)?;
    let (x, idx) = (ins[0], ins[1].i64s());
    let xd = x.dims();
    let xs = strides(xd);
    Ok(match op {
        Op::Gather { axis } => {
            let ir = ins[1].dims().len();
            let n: usize = od.iter().product();
            let is = strides(ins[1].dims());
            if n > 0 && xd[*axis] == 0 {
                return Err(Error::op(
                    "gather",
                    format!("indexes an empty axis {axis} of {}", x.shape()),
                ));
            }
            let src: Vec<usize> = (0..n)
                .map(|i| {
                    let o = unravel(i, &od);
                    let k: usize = o[*axis..*axis + ir]
                        .iter()
                        .zip(&is)
                        .map(|(a, b)| a * b)
                        .sum();
                    let row = idx[k].min(xd[*axis] as i64 - 1).max(0) as usize;
                    let mut at: usize = o[..*axis].iter().zip(&xs).map(|(a, b)| a * b).sum();
                    at += row * xs[*axis];
                    at + o[*axis + ir..]
                        .iter()
                        .zip(&xs[*axis + 1..])
                        .map(|(a, b)| a * b)
                        .sum::<usize>()
                })
                .collect();
            x.pick(&od, &src)
        }
        Op::ScatterAdd { axis } => {
            let upd = ins[2];
            let mut acc = x.clone();
            let m = upd.numel();
            let mut targets = Vec::with_capacity(m);
            for i in 0..m {
                let mut u = unravel(i, upd.dims());
                let row = idx[u[*axis]];
                if row < 0 || row as usize >= xd[*axis] {
                    continue;
                }
                u[*axis] = row as usize;
                targets.push((i, u.iter().zip(&xs).map(|(a, b)| a * b).sum::<usize>()));
            }
            match (acc.data(), upd.data()) {
                (Data::Float(base), Data::Float(uv)) => {
                    let mut v = base.clone();
                    for (i, t) in targets {
                        v[t] += uv[i];
                    }
                    acc = Tensor::from_f64(&od, x.dtype(), v);
                }
                (Data::Int(base), Data::Int(uv)) => {
                    let mut v: Vec<i128> = base.iter().map(|&b| b as i128).collect();
                    for (i, t) in targets {
                        v[t] = crate::eval::wrap_int(x.dtype(), v[t] + uv[i] as i128) as i128;
                    }
                    acc = Tensor::from_i128(&od, x.dtype(), v);
                }
                _ => {
                    return Err(Error::op(
                        "scatter_add",
                        "operands of one dtype hold different element kinds",
                    ))
                }
            }
            acc
        }
        other => return Err(Error::op(other.name(), "is not an indexing op")),
    })
}

/// Cost of Gather (reads what it writes, plus the indices) and ScatterAdd (an add per update).
pub(super) fn cost(op: &Op, ins: &[&Shape], out: &Shape) -> super::Cost {
    match op {
        Op::ScatterAdd { .. } => {
            super::Cost::streaming(ins, out, 0).with_flops(super::numel(ins[2]))
        }
        _ => super::Cost {
            flops: 0,
            bytes: 2 * super::bytes(out) + super::bytes(ins[1]),
        },
    }
}

/// Text-form attributes of gather and scatter_add: the axis.
pub fn attrs(axis: usize) -> Vec<(&'static str, Attr)> {
    vec![("axis", axis.into())]
}

/// A gather or scatter_add from its text-form attributes.
pub fn from_attrs(kind: crate::OpKind, a: &mut Attrs) -> Result<crate::Op> {
    use crate::{Op, OpKind as K};
    Ok(match kind {
        K::Gather => Op::Gather {
            axis: a.usize("axis")?,
        },
        K::ScatterAdd => Op::ScatterAdd {
            axis: a.usize("axis")?,
        },
        _ => return Err(Error::op(kind.name(), "is not an indexing op")),
    })
}
