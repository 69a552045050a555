//! Rules of data-movement ops: Reshape, Transpose, Narrow, Concat, Expand.

use super::{check_axis, dims_of, static_dims};
use crate::text::{Attr, Attrs};
use crate::{Dim, Error, Result, Shape};

pub(super) fn reshape(target: &[usize], x: &Shape) -> Result<Shape> {
    let d = static_dims("reshape", "operand", x)?;
    let count = |v: &[usize]| v.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n));
    let (Some(a), Some(b)) = (count(&d), count(target)) else {
        return Err(Error::op(
            "reshape",
            format!("cannot reshape {x} to {target:?}: the element count overflows usize"),
        ));
    };
    if a != b {
        return Err(Error::op(
            "reshape",
            format!("cannot reshape {x} ({a} elements) to {target:?} ({b} elements)"),
        ));
    }
    Ok(Shape::with_dims(dims_of(target), x.dtype()))
}

pub(super) fn transpose(perm: &[usize], x: &Shape) -> Result<Shape> {
    let mut seen = vec![false; x.rank()];
    let valid = perm.len() == x.rank()
        && perm
            .iter()
            .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
    if !valid {
        return Err(Error::op(
            "transpose",
            format!("{perm:?} is not a permutation of the axes of {x}"),
        ));
    }
    let dims = perm.iter().map(|&p| x.dims()[p].clone()).collect();
    Ok(Shape::with_dims(dims, x.dtype()))
}

pub(super) fn narrow(axis: usize, start: usize, len: usize, x: &Shape) -> Result<Shape> {
    check_axis("narrow", axis, x)?;
    let n = x
        .dim(axis)
        .ok_or_else(|| Error::op("narrow", format!("axis {axis} of {x} is symbolic")))?;
    if start.checked_add(len).is_none_or(|e| e > n) {
        return Err(Error::op(
            "narrow",
            format!(
                "range {start}..{} is out of bounds for axis {axis} of {x} (size {n})",
                start.saturating_add(len)
            ),
        ));
    }
    let mut dims = x.dims().to_vec();
    dims[axis] = Dim::Static(len);
    Ok(Shape::with_dims(dims, x.dtype()))
}

pub(super) fn concat(axis: usize, ins: &[&Shape]) -> Result<Shape> {
    let first = ins[0];
    check_axis("concat", axis, first)?;
    let mut total = 0usize;
    for (i, s) in ins.iter().enumerate() {
        let compatible = s.rank() == first.rank()
            && s.dtype() == first.dtype()
            && s.dims()
                .iter()
                .zip(first.dims())
                .enumerate()
                .all(|(j, (a, b))| j == axis || a == b);
        if !compatible {
            return Err(Error::op(
                "concat",
                format!("operand {i} {s} does not match operand 0 {first} outside axis {axis}"),
            ));
        }
        total += s
            .dim(axis)
            .ok_or_else(|| Error::op("concat", format!("axis {axis} of {s} is symbolic")))?;
    }
    let mut dims = first.dims().to_vec();
    dims[axis] = Dim::Static(total);
    Ok(Shape::with_dims(dims, first.dtype()))
}

pub(super) fn expand(target: &[usize], x: &Shape) -> Result<Shape> {
    let d = static_dims("expand", "operand", x)?;
    let ok = d.len() <= target.len()
        && d.iter()
            .rev()
            .zip(target.iter().rev())
            .all(|(&a, &b)| a == b || a == 1);
    if !ok {
        return Err(Error::op(
            "expand",
            format!("cannot broadcast {x} to {target:?}"),
        ));
    }
    Ok(Shape::with_dims(dims_of(target), x.dtype()))
}

// ---------------------------------------------------------------- differentiation rules

use super::ad::{differentiable, dims, unbroadcast, zeros_like};
use crate::{Graph, NodeId, Op};

/// Zeros of `x`'s dtype with dims `d`, as `-0.0` for floats: the exact additive identity, so
/// when cotangents padded this way are summed, the simplifier drops the padding.
fn zeros(g: &mut Graph, d: &[usize], like: NodeId) -> Result<NodeId> {
    let dt = g.shape(like).dtype();
    let z = g.try_scalar(if dt.is_float() { -0.0 } else { 0.0 }, dt)?;
    if d.is_empty() {
        Ok(z)
    } else {
        g.try_expand(z, d)
    }
}

/// `v` placed at `[start, start + len)` of `axis` in zeros of length `n` (the transpose of narrow).
fn pad_axis(g: &mut Graph, v: NodeId, axis: usize, start: usize, n: usize) -> Result<NodeId> {
    let vd = dims(g, v);
    let len = vd[axis];
    let mut parts = Vec::new();
    if start > 0 {
        let mut d = vd.clone();
        d[axis] = start;
        parts.push(zeros(g, &d, v)?);
    }
    parts.push(v);
    if start + len < n {
        let mut d = vd.clone();
        d[axis] = n - start - len;
        parts.push(zeros(g, &d, v)?);
    }
    if parts.len() == 1 {
        Ok(v)
    } else {
        g.try_concat(&parts, axis)
    }
}

pub(super) fn vjp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    ct: NodeId,
) -> Result<Vec<Option<NodeId>>> {
    if !differentiable(g.shape(ins[0]).dtype()) {
        return Ok(vec![None; ins.len()]);
    }
    let x = ins[0];
    Ok(match op {
        Op::Reshape { .. } => vec![Some(g.try_reshape(ct, &dims(g, x))?)],
        Op::Transpose { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(g.try_transpose(ct, &inv)?)]
        }
        Op::Narrow { axis, start, .. } => {
            let n = dims(g, x)[*axis];
            vec![Some(pad_axis(g, ct, *axis, *start, n)?)]
        }
        Op::Concat { axis } => {
            let mut off = 0;
            let mut out = Vec::new();
            for &i in ins {
                let len = dims(g, i)[*axis];
                out.push(Some(g.try_narrow(ct, *axis, off, len)?));
                off += len;
            }
            out
        }
        Op::Expand { .. } => {
            let s = g.shape(x).clone();
            vec![Some(unbroadcast(g, ct, &s)?)]
        }
        other => return Err(Error::op(other.name(), "is not a movement op")),
    })
}

pub(super) fn jvp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    t: &[Option<NodeId>],
) -> Result<Option<NodeId>> {
    if !differentiable(g.shape(ins[0]).dtype()) || t.iter().all(Option::is_none) {
        return Ok(None);
    }
    Ok(Some(match op {
        Op::Concat { axis } => {
            let mut parts = Vec::new();
            for (i, &x) in ins.iter().enumerate() {
                parts.push(match t[i] {
                    Some(tx) => tx,
                    None => zeros_like(g, x)?,
                });
            }
            g.try_concat(&parts, *axis)?
        }
        op => {
            let tx = t[0].expect("checked above");
            g.try_op(op.clone(), &[tx])?
        }
    }))
}

// ---------------------------------------------------------------- reference evaluation

use crate::eval::{broadcast_map, strides, unravel, Tensor};

/// Reference evaluation of the movement ops: each picks elements of its operands.
pub(super) fn eval(op: &crate::Op, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let od = static_dims(op.name(), "result", out)?;
    let x = ins[0];
    let xs = strides(x.dims());
    let n: usize = od.iter().product();
    Ok(match op {
        crate::Op::Reshape { .. } => x.reshaped(&od),
        crate::Op::Transpose { perm } => {
            let src: Vec<usize> = (0..n)
                .map(|i| {
                    unravel(i, &od)
                        .iter()
                        .enumerate()
                        .map(|(a, &j)| j * xs[perm[a]])
                        .sum()
                })
                .collect();
            x.pick(&od, &src)
        }
        crate::Op::Narrow { axis, start, .. } => {
            let src: Vec<usize> = (0..n)
                .map(|i| {
                    unravel(i, &od)
                        .iter()
                        .enumerate()
                        .map(|(a, &j)| (j + if a == *axis { *start } else { 0 }) * xs[a])
                        .sum()
                })
                .collect();
            x.pick(&od, &src)
        }
        crate::Op::Expand { .. } => x.pick(&od, &broadcast_map(x.dims(), &od)),
        crate::Op::Concat { axis } => {
            // Stack the operands' elements, then pick each result element from its operand.
            let mut all = Vec::new();
            let mut base = Vec::new();
            for t in ins {
                base.push(all.len());
                all.extend(t.f64s());
            }
            let joined = match x.data() {
                crate::eval::Data::Float(_) => Tensor::from_f64(&[all.len()], x.dtype(), all),
                crate::eval::Data::Int(_) => Tensor::from_i64(
                    &[all.len()],
                    x.dtype(),
                    ins.iter().flat_map(|t| t.i64s()).collect(),
                ),
                crate::eval::Data::Complex(_) => Tensor::from_complex(
                    &[all.len()],
                    ins.iter().flat_map(|t| t.complex()).collect(),
                ),
            };
            let src: Vec<usize> = (0..n)
                .map(|i| {
                    let mut idx = unravel(i, &od);
                    let mut t = 0;
                    while idx[*axis] >= ins[t].dims()[*axis] {
                        idx[*axis] -= ins[t].dims()[*axis];
                        t += 1;
                    }
                    base[t]
                        + idx
                            .iter()
                            .zip(strides(ins[t].dims()))
                            .map(|(&j, s)| j * s)
                            .sum::<usize>()
                })
                .collect();
            joined.pick(&od, &src)
        }
        other => return Err(Error::op(other.name(), "is not a movement op")),
    })
}

/// Cost of a movement op: no arithmetic; a reshape moves nothing (it is a view), the others
/// read and write every result element at worst (a view costs nothing).
pub(super) fn cost(op: &crate::Op, ins: &[&Shape], out: &Shape) -> super::Cost {
    let _ = ins;
    match op {
        crate::Op::Reshape { .. } => super::Cost::default(),
        _ => super::Cost {
            flops: 0,
            bytes: 2 * super::bytes(out),
        },
    }
}

/// Text-form attributes of the movement ops.
pub fn attrs(op: &crate::Op) -> Vec<(&'static str, Attr)> {
    use crate::Op;
    match op {
        Op::Reshape { shape } | Op::Expand { shape } => vec![("shape", shape.as_slice().into())],
        Op::Transpose { perm } => vec![("perm", perm.as_slice().into())],
        Op::Narrow { axis, start, len } => vec![
            ("axis", (*axis).into()),
            ("start", (*start).into()),
            ("len", (*len).into()),
        ],
        Op::Concat { axis } => vec![("axis", (*axis).into())],
        _ => Vec::new(),
    }
}

/// A movement op of `kind` from its text-form attributes.
pub fn from_attrs(kind: crate::OpKind, a: &mut Attrs) -> Result<crate::Op> {
    use crate::{Op, OpKind as K};
    Ok(match kind {
        K::Reshape => Op::Reshape {
            shape: a.usizes("shape")?,
        },
        K::Expand => Op::Expand {
            shape: a.usizes("shape")?,
        },
        K::Transpose => Op::Transpose {
            perm: a.usizes("perm")?,
        },
        K::Narrow => Op::Narrow {
            axis: a.usize("axis")?,
            start: a.usize("start")?,
            len: a.usize("len")?,
        },
        K::Concat => Op::Concat {
            axis: a.usize("axis")?,
        },
        _ => return Err(Error::op(kind.name(), "is not a movement op")),
    })
}

// Batching.

/// Batching rule: the batch axis goes in front; shapes gain it, axes and permutations shift by
/// one (an expanded operand is first padded with unit axes to the target rank).
pub(super) fn batch(
    g: &mut Graph,
    op: &Op,
    b: &super::batch::Batched,
) -> Result<(NodeId, Option<usize>)> {
    let size = b.size;
    let y = match op {
        Op::Reshape { shape } => {
            let x = b.front(g, 0)?;
            let mut s = vec![size];
            s.extend_from_slice(shape);
            g.try_reshape(x, &s)?
        }
        Op::Transpose { perm } => {
            let x = b.front(g, 0)?;
            let mut p = vec![0];
            p.extend(perm.iter().map(|a| a + 1));
            g.try_transpose(x, &p)?
        }
        Op::Narrow { axis, start, len } => {
            let x = b.front(g, 0)?;
            g.try_narrow(x, axis + 1, *start, *len)?
        }
        Op::Expand { shape } => {
            let x = b.front(g, 0)?;
            let x = super::batch::align(g, x, shape.len())?;
            let mut s = vec![size];
            s.extend_from_slice(shape);
            g.try_expand(x, &s)?
        }
        Op::Concat { axis } => {
            let args = (0..b.ins.len())
                .map(|i| b.front(g, i))
                .collect::<Result<Vec<_>>>()?;
            g.try_concat(&args, axis + 1)?
        }
        other => return Err(Error::op(other.name(), "is not an op of this family")),
    };
    Ok((y, Some(0)))
}
