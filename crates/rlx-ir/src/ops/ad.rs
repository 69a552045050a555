//! Helpers the differentiation rules of every family share: broadcasting undone by summation,
//! constants shaped like a value, and tangent accumulation.

use crate::{DType, Graph, NodeId, Result, Shape};

/// A rank-0 constant `v` of `dtype`.
pub(crate) fn scalar(g: &mut Graph, v: f64, dtype: DType) -> Result<NodeId> {
    g.try_scalar(v, dtype)
}

/// A constant `v` with the shape and dtype of `like`.
pub(crate) fn full_like(g: &mut Graph, v: f64, like: NodeId) -> Result<NodeId> {
    let s = g.shape(like).clone();
    let c = scalar(g, v, s.dtype())?;
    let dims = s.static_dims().unwrap_or_default();
    if dims.is_empty() {
        Ok(c)
    } else {
        g.try_expand(c, &dims)
    }
}

/// Zeros shaped like `like`.
pub(crate) fn zeros_like(g: &mut Graph, like: NodeId) -> Result<NodeId> {
    full_like(g, 0.0, like)
}

/// Sum `x` down to `target` (the inverse of numpy broadcasting): leading axes are summed away,
/// and axes where `target` has size 1 are summed with keepdims.
pub(crate) fn unbroadcast(g: &mut Graph, x: NodeId, target: &Shape) -> Result<NodeId> {
    let xs = g.shape(x).static_dims().unwrap_or_default();
    let ts = target.static_dims().unwrap_or_default();
    if xs == ts {
        return Ok(x);
    }
    let lead = xs.len() - ts.len();
    let mut cur = x;
    if lead > 0 {
        let axes: Vec<usize> = (0..lead).collect();
        cur = g.try_sum(cur, &axes, false)?;
    }
    let axes: Vec<usize> = (0..ts.len())
        .filter(|&i| ts[i] == 1 && xs[lead + i] != 1)
        .collect();
    if !axes.is_empty() {
        cur = g.try_sum(cur, &axes, true)?;
    }
    if g.shape(cur).static_dims().unwrap_or_default() != ts {
        cur = g.try_reshape(cur, &ts)?;
    }
    Ok(cur)
}

/// Broadcast a tangent to the result shape `dims` when an op's broadcasting widened it.
pub(crate) fn fit(g: &mut Graph, t: NodeId, dims: &[usize]) -> Result<NodeId> {
    if g.shape(t).static_dims().unwrap_or_default() == dims {
        Ok(t)
    } else {
        g.try_expand(t, dims)
    }
}

/// Sum of optional terms (`None` is zero).
pub(crate) fn add_opt(
    g: &mut Graph,
    a: Option<NodeId>,
    b: Option<NodeId>,
) -> Result<Option<NodeId>> {
    Ok(match (a, b) {
        (Some(a), Some(b)) => Some(g.try_add(a, b)?),
        (a, None) => a,
        (None, b) => b,
    })
}

/// Whether values of this dtype carry derivatives.
pub(crate) fn differentiable(dt: DType) -> bool {
    dt.is_float()
}

/// The permutation swapping the last two axes of a rank-`r` value.
pub(crate) fn swap_last2(r: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..r).collect();
    p.swap(r - 2, r - 1);
    p
}

/// Static dims of node `x`.
pub(crate) fn dims(g: &Graph, x: NodeId) -> Vec<usize> {
    g.shape(x).static_dims().unwrap_or_default()
}
