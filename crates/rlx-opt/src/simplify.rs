//! Algebraic simplification: small local rules, each never worse than its input.
//!
//! - `x + (-0.0)`, `(-0.0) + x`, `x - 0`, `x * 1`, `1 * x`, `x / 1` → `x` when no broadcasting
//!   widens `x` (for integers any zero; for floats only `-0.0` is an exact additive identity,
//!   since `-0.0 + 0.0 = +0.0`)
//! - `neg(neg(x))` → `x`
//! - `transpose(transpose(x, p), q)` → `transpose(x, p∘q)`; identity transpose → `x`
//! - `reshape(reshape(x))` → `reshape(x)`; reshape / expand to the same shape → `x`
//! - `cast(x)` to its own dtype → `x`; full-range narrow → `x`
//! - `concat(a…) + concat(b…)` along one axis → `concat(aᵢ + bᵢ)` over the common refinement of
//!   both splits, when only constant splats need cutting (the sum of narrows' cotangents, each
//!   padded with zeros, becomes one concat of the pieces)

use crate::{rewrite, Pass, Rewrite};
use rlx_ir::{convert, Activation, BinaryOp, Graph, NodeId, Op, Result, Shape};

/// The algebraic rule list as a pass, run to a fixed point by the pipeline.
pub struct AlgebraicSimplify;

/// If `id` is a constant whose elements all equal one value (or an expand of one), that value.
fn splat(g: &Graph, id: NodeId) -> Option<f64> {
    let n = g.node(id);
    if let Op::Expand { .. } = n.op {
        return splat(g, n.inputs[0]);
    }
    let Op::Constant { data } = &n.op else { return None };
    let w = n.shape.dtype().size_bytes();
    let mut chunks = data.chunks_exact(w);
    let first = chunks.next()?;
    chunks.all(|c| c == first).then(|| convert::bytes_to_f64(first, n.shape.dtype()))
}

fn simplify_node(g: &mut Graph, op: &Op, ins: &[NodeId], shape: &Shape) -> Result<Option<NodeId>> {
    let same = |g: &Graph, x: NodeId| g.shape(x) == shape;
    Ok(match op {
        Op::Binary(b) => {
            let (x, y) = (ins[0], ins[1]);
            let (sx, sy) = (splat(g, x), splat(g, y));
            let float = shape.dtype().is_float();
            // The additive identity: -0.0 for floats (x + 0.0 turns -0.0 into +0.0), 0 for ints.
            let add_id = |v: Option<f64>| v.is_some_and(|v| v == 0.0 && (!float || v.is_sign_negative()));
            match b {
                BinaryOp::Add if same(g, x) && same(g, y) && concat_axis(g, x).is_some() && concat_axis(g, x) == concat_axis(g, y) => {
                    add_concats(g, x, y, shape)?
                }
                BinaryOp::Add if add_id(sy) && same(g, x) => Some(x),
                BinaryOp::Add if add_id(sx) && same(g, y) => Some(y),
                BinaryOp::Sub if sy == Some(0.0) && same(g, x) => Some(x),
                BinaryOp::Mul if sy == Some(1.0) && same(g, x) => Some(x),
                BinaryOp::Mul if sx == Some(1.0) && same(g, y) => Some(y),
                BinaryOp::Div if sy == Some(1.0) && same(g, x) => Some(x),
                _ => None,
            }
        }
        Op::Activation(Activation::Neg) => match &g.node(ins[0]).op {
            Op::Activation(Activation::Neg) => Some(g.node(ins[0]).inputs[0]),
            _ => None,
        },
        Op::Transpose { perm } => {
            if perm.iter().enumerate().all(|(i, &p)| i == p) {
                Some(ins[0])
            } else if let Op::Transpose { perm: inner } = &g.node(ins[0]).op {
                let src = g.node(ins[0]).inputs[0];
                let composed: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
                Some(g.try_transpose(src, &composed)?)
            } else {
                None
            }
        }
        Op::Reshape { shape: dims } => {
            if same(g, ins[0]) {
                Some(ins[0])
            } else if let Op::Reshape { .. } = &g.node(ins[0]).op {
                let src = g.node(ins[0]).inputs[0];
                Some(g.try_reshape(src, dims)?)
            } else {
                None
            }
        }
        Op::Expand { .. } | Op::Cast { .. } if same(g, ins[0]) => Some(ins[0]),
        Op::Narrow { .. } if same(g, ins[0]) => Some(ins[0]),
        _ => None,
    })
}

/// The axis of a concat node.
fn concat_axis(g: &Graph, id: NodeId) -> Option<usize> {
    match g.node(id).op {
        Op::Concat { axis } => Some(axis),
        _ => None,
    }
}

/// `concat(a…) + concat(b…)` (same shape, same axis) as one concat of per-segment sums, when
/// every part that spans several segments of the common refinement is a splat (cut for free).
fn add_concats(g: &mut Graph, x: NodeId, y: NodeId, shape: &Shape) -> Result<Option<NodeId>> {
    let axis = concat_axis(g, x).expect("checked by the caller");
    let Some(dims) = shape.static_dims() else { return Ok(None) };
    let bounds = |g: &Graph, id: NodeId| -> Vec<(usize, usize, NodeId)> {
        let mut off = 0;
        g.node(id)
            .inputs
            .iter()
            .map(|&p| {
                let len = g.shape(p).dims()[axis].as_static().unwrap_or(0);
                off += len;
                (off - len, off, p)
            })
            .collect()
    };
    let (a, b) = (bounds(g, x), bounds(g, y));
    let mut cuts: Vec<usize> = a.iter().chain(&b).map(|e| e.1).collect();
    cuts.push(0);
    cuts.sort_unstable();
    cuts.dedup();
    // Each part must match one segment exactly or be a splat.
    let fits = |parts: &[(usize, usize, NodeId)], g: &Graph| {
        parts.iter().all(|&(s, e, p)| splat(g, p).is_some() || cuts.iter().filter(|&&c| c > s && c < e).count() == 0)
    };
    if !fits(&a, g) || !fits(&b, g) {
        return Ok(None);
    }
    let piece = |g: &mut Graph, parts: &[(usize, usize, NodeId)], s: usize, e: usize| -> Result<NodeId> {
        let &(ps, pe, p) = parts.iter().find(|q| q.0 <= s && e <= q.1).expect("segments refine every split");
        if ps == s && pe == e {
            return Ok(p);
        }
        let v = splat(g, p).expect("only splats are cut");
        let mut d = dims.clone();
        d[axis] = e - s;
        let c = g.try_scalar(v, shape.dtype())?;
        g.try_expand(c, &d)
    };
    let mut sums = Vec::new();
    for w in cuts.windows(2) {
        let (s, e) = (w[0], w[1]);
        let pa = piece(g, &a, s, e)?;
        let pb = piece(g, &b, s, e)?;
        let mut d = dims.clone();
        d[axis] = e - s;
        // Apply the identity rules to each segment's sum right away (padding drops out).
        let seg = match simplify_node(g, &Op::Binary(BinaryOp::Add), &[pa, pb], &Shape::new(&d, shape.dtype()))? {
            Some(r) => r,
            None => g.try_add(pa, pb)?,
        };
        sums.push(seg);
    }
    Ok(Some(g.try_concat(&sums, axis)?))
}

impl Pass for AlgebraicSimplify {
    fn name(&self) -> &str {
        "simplify"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        rewrite(g, |out, op, ins, shape| {
            Ok(match simplify_node(out, op, ins, shape)? {
                Some(r) => Rewrite::Replace(r),
                None => Rewrite::Keep,
            })
        })
    }
}
