//! Algebraic simplification: small local rules, each never worse than its input.
//!
//! - `x + (-0.0)`, `(-0.0) + x`, `x - 0`, `x * 1`, `1 * x`, `x / 1` → `x` when no broadcasting
//!   widens `x` (for integers any zero; for floats only `-0.0` is an exact additive identity,
//!   since `-0.0 + 0.0 = +0.0`)
//! - `neg(neg(x))` → `x`
//! - `transpose(transpose(x, p), q)` → `transpose(x, p∘q)`; identity transpose → `x`
//! - `reshape(reshape(x))` → `reshape(x)`; reshape / expand to the same shape → `x`
//! - `cast(x)` to its own dtype → `x`; full-range narrow → `x`

use crate::{rewrite, Pass, Rewrite};
use rlx_ir::{convert, Activation, BinaryOp, Graph, NodeId, Op, Result, Shape};

/// The algebraic rule list as a pass, run to a fixed point by the pipeline.
pub struct AlgebraicSimplify;

/// If `id` is a constant whose elements all equal one value, that value.
fn splat(g: &Graph, id: NodeId) -> Option<f64> {
    let n = g.node(id);
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
