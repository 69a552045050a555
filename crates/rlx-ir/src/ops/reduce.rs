//! Rules of reductions along axes: Reduce, Softmax, Cumsum, TopK.

use super::{check_axis, dims_of, require_float, static_dims};
use crate::{DType, Dim, Error, ReduceKind, Result, Shape, TopKOutput};

pub(super) fn reduce(kind: ReduceKind, axes: &[usize], keepdims: bool, x: &Shape) -> Result<Shape> {
    for w in axes.windows(2) {
        if w[0] >= w[1] {
            return Err(Error::op("reduce", format!("axes {axes:?} must be sorted and distinct")));
        }
    }
    for &a in axes {
        check_axis("reduce", a, x)?;
    }
    if kind == ReduceKind::Mean {
        require_float("reduce mean", x)?;
    }
    if x.dtype() == DType::Bool && matches!(kind, ReduceKind::Sum | ReduceKind::Prod) {
        return Err(Error::op("reduce", format!("{kind:?} of bool operand {x}; cast to an integer first")));
    }
    if matches!(kind, ReduceKind::Max | ReduceKind::Min | ReduceKind::Mean) {
        for &a in axes {
            if x.dim(a) == Some(0) {
                return Err(Error::op("reduce", format!("{kind:?} over empty axis {a} of {x} has no value")));
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
        return Err(Error::op("cumsum", format!("bool operand {x}; cast to an integer first")));
    }
    Ok(x.clone())
}

pub(super) fn topk(k: usize, output: TopKOutput, x: &Shape) -> Result<Shape> {
    let d = static_dims("topk", "operand", x)?;
    let last = *d.last().ok_or_else(|| Error::op("topk", "operand must have rank >= 1"))?;
    if k > last {
        return Err(Error::op("topk", format!("k = {k} exceeds the last axis of {x}")));
    }
    let mut out = d.clone();
    *out.last_mut().expect("rank checked") = k;
    let dt = match output {
        TopKOutput::Values => x.dtype(),
        TopKOutput::Indices => DType::I32,
    };
    Ok(Shape::with_dims(dims_of(&out), dt))
}
