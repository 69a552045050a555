//! Rules of reductions along axes: Reduce, Softmax, Cumsum, TopK.

use super::{check_axis, dims_of, require_float, static_dims};
use crate::text::{Attr, Attrs};
use crate::{DType, Dim, Error, ReduceKind, Result, Shape, TopKOutput};

pub(super) fn reduce(kind: ReduceKind, axes: &[usize], keepdims: bool, x: &Shape) -> Result<Shape> {
    for w in axes.windows(2) {
        if w[0] >= w[1] {
            return Err(Error::op(
                "reduce",
                format!("axes {axes:?} must be sorted and distinct"),
            ));
        }
    }
    for &a in axes {
        check_axis("reduce", a, x)?;
    }
    if x.dtype() == DType::C64 {
        if !matches!(kind, ReduceKind::Sum | ReduceKind::Mean) {
            return Err(Error::op(
                "reduce",
                format!("{kind:?} of complex operand {x}: only sum and mean are defined"),
            ));
        }
    } else if kind == ReduceKind::Mean {
        require_float("reduce mean", x)?;
    }
    if x.dtype() == DType::Bool && matches!(kind, ReduceKind::Sum | ReduceKind::Prod) {
        return Err(Error::op(
            "reduce",
            format!("{kind:?} of bool operand {x}; cast to an integer first"),
        ));
    }
    if matches!(kind, ReduceKind::Max | ReduceKind::Min | ReduceKind::Mean) {
        for &a in axes {
            if x.dim(a) == Some(0) {
                return Err(Error::op(
                    "reduce",
                    format!("{kind:?} over empty axis {a} of {x} has no value"),
                ));
            }
        }
    }
    let dims: Vec<Dim> = x
        .dims()
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match (axes.contains(&i), keepdims) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(Dim::Static(1)),
            (true, false) => None,
        })
        .collect();
    Ok(Shape::with_dims(dims, x.dtype()))
}

pub(super) fn softmax(axis: usize, x: &Shape) -> Result<Shape> {
    check_axis("softmax", axis, x)?;
    require_float("softmax", x)?;
    Ok(x.clone())
}

pub(super) fn cumsum(axis: usize, x: &Shape) -> Result<Shape> {
    check_axis("cumsum", axis, x)?;
    if x.dtype() == DType::Bool {
        return Err(Error::op(
            "cumsum",
            format!("bool operand {x}; cast to an integer first"),
        ));
    }
    Ok(x.clone())
}

pub(super) fn topk(k: usize, output: TopKOutput, x: &Shape) -> Result<Shape> {
    let d = static_dims("topk", "operand", x)?;
    let last = *d
        .last()
        .ok_or_else(|| Error::op("topk", "operand must have rank >= 1"))?;
    if k > last {
        return Err(Error::op(
            "topk",
            format!("k = {k} exceeds the last axis of {x}"),
        ));
    }
    let mut out = d.clone();
    *out.last_mut().expect("rank checked") = k;
    let dt = match output {
        TopKOutput::Values => x.dtype(),
        TopKOutput::Indices => DType::I32,
    };
    Ok(Shape::with_dims(dims_of(&out), dt))
}

// ---------------------------------------------------------------- differentiation rules

use super::ad::{differentiable, dims, scalar};
use crate::{CmpOp, Graph, NodeId, Op};

/// `ct` (the reduced shape) reshaped to keepdims form and broadcast back to `x`'s shape.
fn expand_back(g: &mut Graph, v: NodeId, x: NodeId, axes: &[usize]) -> Result<NodeId> {
    let xd = dims(g, x);
    let keep: Vec<usize> = xd
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let v = if dims(g, v) != keep {
        g.try_reshape(v, &keep)?
    } else {
        v
    };
    g.try_expand(v, &xd)
}

/// Where `x` attains the reduced `y` (max / min), divided by how many places do.
fn chooser_weights(g: &mut Graph, x: NodeId, y: NodeId, axes: &[usize]) -> Result<NodeId> {
    let dt = g.shape(x).dtype();
    let yb = expand_back(g, y, x, axes)?;
    let m = g.try_compare(CmpOp::Eq, x, yb)?;
    let m = g.try_cast(m, dt)?;
    let cnt = g.try_sum(m, axes, true)?;
    let xd = dims(g, x);
    let cnt = g.try_expand(cnt, &xd)?;
    g.try_div(m, cnt)
}

/// `∂y/∂x` of a reduction, elementwise in `x`'s shape (`None` for sum, where it is one):
/// `1/n` for mean, the arg-max/min indicator split among ties, `y/x` for prod.
fn reduce_factor(
    g: &mut Graph,
    kind: ReduceKind,
    x: NodeId,
    out: NodeId,
    axes: &[usize],
) -> Result<Option<NodeId>> {
    let dt = g.shape(x).dtype();
    Ok(match kind {
        ReduceKind::Sum => None,
        ReduceKind::Mean => Some(scalar(g, 1.0 / count(g, x, axes), dt)?),
        ReduceKind::Max | ReduceKind::Min => Some(chooser_weights(g, x, out, axes)?),
        ReduceKind::Prod => {
            let yb = expand_back(g, out, x, axes)?;
            Some(g.try_div(yb, x)?)
        }
    })
}

fn count(g: &Graph, x: NodeId, axes: &[usize]) -> f64 {
    let d = dims(g, x);
    axes.iter().map(|&a| d[a] as f64).product()
}

pub(super) fn vjp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    out: NodeId,
    ct: NodeId,
) -> Result<Vec<Option<NodeId>>> {
    let x = ins[0];
    let dt = g.shape(x).dtype();
    if !differentiable(dt) {
        return Ok(vec![None]);
    }
    let r = match op {
        Op::Reduce { kind, axes, .. } => {
            let cb = expand_back(g, ct, x, axes)?;
            match reduce_factor(g, *kind, x, out, axes)? {
                Some(f) => g.try_mul(cb, f)?,
                None => cb,
            }
        }
        Op::Softmax { axis } => {
            let cy = g.try_mul(ct, out)?;
            let s = g.try_sum(cy, &[*axis], true)?;
            let d = g.try_sub(ct, s)?;
            g.try_mul(out, d)?
        }
        Op::Cumsum { axis } => {
            // Reverse cumulative sum: total - cumsum + ct.
            let tot = g.try_sum(ct, &[*axis], true)?;
            let c = g.try_cumsum(ct, *axis)?;
            let r = g.try_sub(tot, c)?;
            g.try_add(r, ct)?
        }
        Op::TopK {
            k,
            output: TopKOutput::Values,
        } => {
            let oh = one_hot(g, x, *k)?; // [..., k, n]
            let cd = dims(g, ct);
            let mut e = cd.clone();
            e.push(1);
            let c = g.try_reshape(ct, &e)?;
            let p = g.try_mul(oh, c)?;
            let r = cd.len() - 1;
            g.try_sum(p, &[r], false)?
        }
        Op::TopK { .. } => return Ok(vec![None]),
        other => return Err(Error::op(other.name(), "is not a reduction")),
    };
    Ok(vec![Some(r)])
}

/// `[..., k, n]` one-hot of the top-k indices of `x [..., n]`, in `x`'s dtype.
fn one_hot(g: &mut Graph, x: NodeId, k: usize) -> Result<NodeId> {
    let xd = dims(g, x);
    let n = *xd.last().unwrap_or(&0);
    let idx = g.try_op(
        Op::TopK {
            k,
            output: TopKOutput::Indices,
        },
        &[x],
    )?;
    let mut id = dims(g, idx);
    id.push(1);
    let idx = g.try_reshape(idx, &id)?;
    let iota: Vec<u8> = (0..n as i32).flat_map(|v| v.to_le_bytes()).collect();
    let iota = g.try_constant_bytes(Shape::new(&[n], DType::I32), iota)?;
    let m = g.try_compare(CmpOp::Eq, idx, iota)?;
    g.try_cast(m, g.shape(x).dtype())
}

pub(super) fn jvp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    out: NodeId,
    t: &[Option<NodeId>],
) -> Result<Option<NodeId>> {
    let (x, Some(tx)) = (ins[0], t[0]) else {
        return Ok(None);
    };
    let dt = g.shape(x).dtype();
    if !differentiable(dt) {
        return Ok(None);
    }
    Ok(Some(match op {
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => {
            let v = match reduce_factor(g, *kind, x, out, axes)? {
                Some(f) => g.try_mul(tx, f)?,
                None => tx,
            };
            g.try_sum(v, axes, *keepdims)?
        }
        Op::Softmax { axis } => {
            let ty = g.try_mul(tx, out)?;
            let s = g.try_sum(ty, &[*axis], true)?;
            let d = g.try_sub(tx, s)?;
            g.try_mul(out, d)?
        }
        Op::Cumsum { axis } => g.try_cumsum(tx, *axis)?,
        Op::TopK {
            k,
            output: TopKOutput::Values,
        } => {
            let oh = one_hot(g, x, *k)?; // [..., k, n]
            let mut e = dims(g, tx);
            let n = e.pop().unwrap_or(0);
            e.push(1);
            e.push(n);
            let tr = g.try_reshape(tx, &e)?;
            let p = g.try_mul(oh, tr)?;
            let r = e.len() - 1;
            g.try_sum(p, &[r], false)?
        }
        Op::TopK { .. } => return Ok(None),
        other => return Err(Error::op(other.name(), "is not a reduction")),
    }))
}

// ---------------------------------------------------------------- reference evaluation

use crate::eval::{reduce_groups, Data, Tensor};

/// Reference evaluation of Reduce, Softmax, Cumsum and TopK.
pub(super) fn eval(op: &Op, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let x = ins[0];
    let od = static_dims(op.name(), "result", out)?;
    let dt = out.dtype();
    let along = |axis: usize| reduce_groups(x.dims(), &[axis]);
    Ok(match op {
        Op::Reduce { kind, axes, .. } => {
            let groups = reduce_groups(x.dims(), axes);
            match x.data() {
                Data::Float(v) => Tensor::from_f64(
                    &od,
                    dt,
                    groups
                        .iter()
                        .map(|g| {
                            let it = g.iter().map(|&i| v[i]);
                            match kind {
                                ReduceKind::Sum => it.sum(),
                                ReduceKind::Mean => it.sum::<f64>() / g.len() as f64,
                                ReduceKind::Prod => it.product(),
                                // NaN wins; an empty max is -inf, an empty min +inf.
                                ReduceKind::Max => it.fold(f64::NEG_INFINITY, |a, b| {
                                    if a >= b || a.is_nan() {
                                        a
                                    } else {
                                        b
                                    }
                                }),
                                ReduceKind::Min => {
                                    it.fold(
                                        f64::INFINITY,
                                        |a, b| if a <= b || a.is_nan() { a } else { b },
                                    )
                                }
                            }
                        })
                        .collect(),
                ),
                Data::Int(v) => {
                    let (lo, hi) = int_range(x.dtype());
                    Tensor::from_i128(
                        &od,
                        dt,
                        groups
                            .iter()
                            .map(|g| {
                                let it = g.iter().map(|&i| v[i] as i128);
                                match kind {
                                    ReduceKind::Sum | ReduceKind::Mean => it.sum(),
                                    // Wrap after every step: the product of many values leaves i128.
                                    ReduceKind::Prod => it.fold(1i128, |a, b| {
                                        crate::eval::wrap_int(x.dtype(), a * b) as i128
                                    }),
                                    ReduceKind::Max => it.fold(lo, i128::max),
                                    ReduceKind::Min => it.fold(hi, i128::min),
                                }
                            })
                            .collect(),
                    )
                }
                Data::Complex(_) => return Err(super::complex::not_split(op)),
            }
        }
        Op::Softmax { axis } => {
            let v = x.f64s();
            let mut o = vec![0.0; v.len()];
            for g in along(*axis) {
                let m = g.iter().map(|&i| v[i]).fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = g.iter().map(|&i| (v[i] - m).exp()).sum();
                for &i in &g {
                    o[i] = (v[i] - m).exp() / s;
                }
            }
            Tensor::from_f64(&od, dt, o)
        }
        Op::Cumsum { axis } => {
            let groups = along(*axis);
            match x.data() {
                Data::Float(v) => {
                    let mut o = vec![0.0; v.len()];
                    for g in groups {
                        let mut acc = 0.0;
                        for &i in &g {
                            acc += v[i];
                            o[i] = acc;
                        }
                    }
                    Tensor::from_f64(&od, dt, o)
                }
                Data::Int(v) => {
                    let mut o = vec![0i128; v.len()];
                    for g in groups {
                        let mut acc = 0i128;
                        for &i in &g {
                            acc = crate::eval::wrap_int(dt, acc + v[i] as i128) as i128;
                            o[i] = acc;
                        }
                    }
                    Tensor::from_i128(&od, dt, o)
                }
                Data::Complex(_) => return Err(super::complex::not_split(op)),
            }
        }
        Op::TopK { k, output } => {
            let v = x.f64s();
            let last = x.dims().len() - 1;
            let mut src = Vec::new();
            let mut pos = Vec::new();
            for g in along(last) {
                // Descending by value (NaN first, as the largest), lower index first among ties.
                let mut order: Vec<usize> = (0..g.len()).collect();
                order.sort_by(|&a, &b| {
                    let (x, y) = (v[g[a]], v[g[b]]);
                    let key = |z: f64| if z.is_nan() { f64::INFINITY } else { z };
                    key(y)
                        .partial_cmp(&key(x))
                        .unwrap_or(std::cmp::Ordering::Equal)
                        .then(a.cmp(&b))
                });
                for &j in &order[..*k] {
                    src.push(g[j]);
                    pos.push(j as i64);
                }
            }
            match output {
                TopKOutput::Values => x.pick(&od, &src),
                TopKOutput::Indices => Tensor::from_i64(&od, DType::I32, pos),
            }
        }
        other => return Err(Error::op(other.name(), "is not a reduction")),
    })
}

/// The smallest and largest value of an integer dtype (identities of max and min).
fn int_range(dt: DType) -> (i128, i128) {
    match dt {
        DType::I8 => (i8::MIN as i128, i8::MAX as i128),
        DType::I16 => (i16::MIN as i128, i16::MAX as i128),
        DType::I32 => (i32::MIN as i128, i32::MAX as i128),
        DType::U8 => (0, u8::MAX as i128),
        DType::U32 => (0, u32::MAX as i128),
        DType::Bool => (0, 1),
        DType::I64 => (i64::MIN as i128, i64::MAX as i128),
        // Not integers: integer reductions are asked for integer dtypes only; the widest range.
        DType::F32 | DType::F16 | DType::BF16 | DType::F64 | DType::C64 => {
            (i64::MIN as i128, i64::MAX as i128)
        }
    }
}

/// Cost of a reduction, softmax (five operations per element: max, subtract, exp, sum,
/// divide), cumsum or top-k (a comparison per element and output).
pub(super) fn cost(op: &Op, ins: &[&Shape], out: &Shape) -> super::Cost {
    let n = super::numel(ins[0]);
    let flops = match op {
        Op::Softmax { .. } => 5 * n,
        Op::TopK { .. } => {
            n * (super::numel(out)
                / ins[0]
                    .dims()
                    .last()
                    .and_then(|d| d.as_static())
                    .unwrap_or(1)
                    .max(1) as u64)
                .max(1)
        }
        Op::Reduce { .. } | Op::Cumsum { .. } => n,
        other => {
            debug_assert!(false, "{} is not a reduction", other.name());
            n
        }
    };
    super::Cost::streaming(ins, out, 0).with_flops(flops)
}

const REDUCE_KINDS: [(ReduceKind, &str); 5] = [
    (ReduceKind::Sum, "sum"),
    (ReduceKind::Mean, "mean"),
    (ReduceKind::Max, "max"),
    (ReduceKind::Min, "min"),
    (ReduceKind::Prod, "prod"),
];

/// Text-form attributes of the reductions.
pub fn attrs(op: &crate::Op) -> Vec<(&'static str, Attr)> {
    use crate::Op;
    match op {
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => {
            let name = REDUCE_KINDS
                .iter()
                .find(|k| k.0 == *kind)
                .map_or("sum", |k| k.1);
            vec![
                ("kind", Attr::word(name)),
                ("axes", axes.as_slice().into()),
                ("keepdims", (*keepdims).into()),
            ]
        }
        Op::Softmax { axis } | Op::Cumsum { axis } => vec![("axis", (*axis).into())],
        Op::TopK { k, output } => {
            let out = match output {
                TopKOutput::Values => "values",
                TopKOutput::Indices => "indices",
            };
            vec![("k", (*k).into()), ("output", Attr::word(out))]
        }
        _ => Vec::new(),
    }
}

/// A reduction of `kind` from its text-form attributes.
pub fn from_attrs(kind: crate::OpKind, a: &mut Attrs) -> Result<crate::Op> {
    use crate::{Op, OpKind as K};
    Ok(match kind {
        K::Reduce => Op::Reduce {
            kind: a.word("kind", "sum, mean, max, min, prod", |w| {
                REDUCE_KINDS.iter().find(|k| k.1 == w).map(|k| k.0)
            })?,
            axes: a.usizes("axes")?,
            keepdims: a.bool("keepdims")?,
        },
        K::Softmax => Op::Softmax {
            axis: a.usize("axis")?,
        },
        K::Cumsum => Op::Cumsum {
            axis: a.usize("axis")?,
        },
        K::TopK => Op::TopK {
            k: a.usize("k")?,
            output: a.word("output", "values, indices", |w| match w {
                "values" => Some(TopKOutput::Values),
                "indices" => Some(TopKOutput::Indices),
                _ => None,
            })?,
        },
        _ => return Err(Error::op(kind.name(), "is not a reduction")),
    })
}

// Batching.

/// Batching rule: the batch axis goes in front and the reduced, softmax or cumsum axis moves
/// by one; top-k works on the last axis, so the batch is one more leading axis.
pub(super) fn batch(
    g: &mut Graph,
    op: &Op,
    b: &super::batch::Batched,
) -> Result<(NodeId, Option<usize>)> {
    let x = b.front(g, 0)?;
    let y = match op {
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => g.try_op(
            Op::Reduce {
                kind: *kind,
                axes: axes.iter().map(|a| a + 1).collect(),
                keepdims: *keepdims,
            },
            &[x],
        )?,
        Op::Softmax { axis } => g.try_softmax(x, axis + 1)?,
        Op::Cumsum { axis } => g.try_cumsum(x, axis + 1)?,
        Op::TopK { .. } => g.try_op(op.clone(), &[x])?,
        other => return Err(Error::op(other.name(), "is not an op of this family")),
    };
    Ok((y, Some(0)))
}
