//! Rules of indexing ops: Gather, ScatterAdd.

use super::{check_axis, same_dtype};
use crate::{Dim, Error, Result, Shape};

fn require_index(op: &str, idx: &Shape) -> Result<()> {
    if !idx.dtype().is_int() {
        return Err(Error::op(op, format!("indices must be integers, got {idx}")));
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
        return Err(Error::op("scatter_add", format!("indices must be 1-d, got {idx}")));
    }
    let mut want = x.dims().to_vec();
    want[axis] = idx.dims()[0].clone();
    if upd.dims() != want.as_slice() {
        let w = Shape::with_dims(want, x.dtype());
        return Err(Error::op("scatter_add", format!("updates must have shape {w}, got {upd}")));
    }
    Ok(x.clone())
}

// ---------------------------------------------------------------- differentiation rules

use super::ad::{differentiable, dims, zeros_like};
use crate::{Graph, NodeId, Op};

pub(super) fn vjp(g: &mut Graph, op: &Op, ins: &[NodeId], ct: NodeId) -> Result<Vec<Option<NodeId>>> {
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
        _ => unreachable!("not an indexing op"),
    })
}

pub(super) fn jvp(g: &mut Graph, op: &Op, ins: &[NodeId], t: &[Option<NodeId>]) -> Result<Option<NodeId>> {
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
        _ => unreachable!("not an indexing op"),
    })
}
