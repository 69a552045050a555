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

// Batching.

use super::batch::{materialize, to_front, Batched};

/// Batching rule: a batched source or batched indices alone gather along a shifted axis; both
/// batched offset each example's indices into the batch-merged source. Scatter-add likewise.
pub(super) fn batch(g: &mut Graph, op: &Op, b: &Batched) -> Result<(NodeId, Option<usize>)> {
    match op {
        Op::Gather { axis } => batch_gather(g, b.ins, b.bds, *axis, b.size),
        Op::ScatterAdd { axis } => {
            Ok((batch_scatter_add(g, b.ins, b.bds, *axis, b.size)?, Some(0)))
        }
        other => Err(Error::op(other.name(), "is not an op of this family")),
    }
}

/// `iota(size) * n` shaped `[size, 1, ..., 1]` (rank `rank`) in the index dtype of `like`.
fn offsets(g: &mut Graph, size: usize, n: usize, rank: usize, like: NodeId) -> Result<NodeId> {
    let dt = g.shape(like).dtype();
    let mut data = Vec::new();
    let mut buf = vec![0u8; dt.size_bytes()];
    for b in 0..size {
        crate::convert::f64_to_bytes((b * n) as f64, dt, &mut buf)?;
        data.extend_from_slice(&buf);
    }
    let mut d = vec![size];
    d.extend(std::iter::repeat_n(1, rank.saturating_sub(1)));
    g.try_constant_bytes(crate::Shape::new(&d, dt), data)
}

/// `x [B, ...]` with axis `axis + 1` moved to position 1 and merged with the batch axis.
fn fold_axis(g: &mut Graph, x: NodeId, axis: usize) -> Result<(NodeId, Vec<usize>)> {
    let r = g.shape(x).rank();
    let mut perm = vec![0, axis + 1];
    perm.extend((1..r).filter(|&i| i != axis + 1));
    let t = g.try_transpose(x, &perm)?;
    let td = dims(g, t);
    let mut m = vec![td[0] * td[1]];
    m.extend_from_slice(&td[2..]);
    Ok((g.try_reshape(t, &m)?, perm))
}

fn batch_gather(
    g: &mut Graph,
    ins: &[NodeId],
    bds: &[Option<usize>],
    axis: usize,
    size: usize,
) -> Result<(NodeId, Option<usize>)> {
    match (bds[0], bds[1]) {
        (Some(b), None) => {
            let x = to_front(g, ins[0], b)?;
            Ok((g.try_gather(x, ins[1], axis + 1)?, Some(0)))
        }
        (None, Some(b)) => {
            let idx = to_front(g, ins[1], b)?;
            Ok((g.try_gather(ins[0], idx, axis)?, Some(axis)))
        }
        _ => {
            // Per-example indices into per-example data: offset example b's indices by b * N
            // into the batch-merged data and gather once.
            let x = materialize(g, ins[0], bds[0], size)?;
            let idx = materialize(g, ins[1], bds[1], size)?;
            let xd = dims(g, x);
            let n = xd[axis + 1];
            let (xm, _) = fold_axis(g, x, axis)?;
            let ir = g.shape(idx).rank();
            let off = offsets(g, size, n, ir, idx)?;
            let idx = g.try_add(idx, off)?;
            let y = g.try_gather(xm, idx, 0)?; // [B, idx..., pre..., post...]
            let (k, pre) = (ir - 1, axis);
            let yr = g.shape(y).rank();
            // Reorder to [B, pre..., idx..., post...].
            let mut perm = vec![0];
            perm.extend(1 + k..1 + k + pre);
            perm.extend(1..1 + k);
            perm.extend(1 + k + pre..yr);
            Ok((g.try_transpose(y, &perm)?, Some(0)))
        }
    }
}

fn batch_scatter_add(
    g: &mut Graph,
    ins: &[NodeId],
    bds: &[Option<usize>],
    axis: usize,
    size: usize,
) -> Result<NodeId> {
    let x = materialize(g, ins[0], bds[0], size)?;
    let u = materialize(g, ins[2], bds[2], size)?;
    match bds[1] {
        None => g.try_scatter_add(x, ins[1], u, axis + 1),
        Some(b) => {
            let idx = to_front(g, ins[1], b)?; // [B, M]
            let xd = dims(g, x);
            let (xm, perm) = fold_axis(g, x, axis)?;
            let (um, _) = fold_axis(g, u, axis)?;
            let off = offsets(g, size, xd[axis + 1], 2, idx)?;
            let idx = g.try_add(idx, off)?;
            let m = dims(g, idx).iter().product::<usize>();
            let idx = g.try_reshape(idx, &[m])?;
            let y = g.try_scatter_add(xm, idx, um, 0)?;
            // Undo the fold: [B*N, rest] -> [B, N, rest] -> original axis order.
            let mut td: Vec<usize> = perm.iter().map(|&p| xd[p]).collect();
            let y = g.try_reshape(y, &td)?;
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            td.clear();
            g.try_transpose(y, &inv)
        }
    }
}
