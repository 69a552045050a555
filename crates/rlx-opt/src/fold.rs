//! Constant folding with the reference evaluator ([`rlx_ir::eval`]).

use crate::{rewrite, Pass, Rewrite};
use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::{Graph, Op, Result};
use std::collections::BTreeMap;

/// Replaces every node whose operands are all constants by a constant holding its value,
/// computed by the reference evaluator (exactly, or in f64 rounded once to the node's dtype),
/// so every backend folds to the same bytes.
pub struct ConstantFolding {
    /// Largest result (in elements) worth folding; bigger ones stay as computations.
    pub max_elements: usize,
}

impl Pass for ConstantFolding {
    fn name(&self) -> &str {
        "const_fold"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        rewrite(g, |out, op, ins, shape| {
            let foldable = !op.is_leaf()
                && !ins.is_empty()
                && ins.iter().all(|&i| matches!(out.node(i).op, Op::Constant { .. }))
                && shape.numel().is_some_and(|n| n <= self.max_elements);
            if !foldable {
                return Ok(Rewrite::Keep);
            }
            let mut tiny = Graph::new("fold");
            let mut args = Vec::with_capacity(ins.len());
            for &i in ins {
                let n = out.node(i);
                args.push(tiny.push_unchecked(n.op.clone(), Vec::new(), n.shape.clone()));
            }
            let r = tiny.push_unchecked(op.clone(), args, shape.clone());
            tiny.set_outputs_unchecked(vec![r]);
            let value: Tensor = match evaluate(&tiny, &BTreeMap::new()) {
                Ok(mut v) => v.remove(0),
                // Ops the evaluator cannot compute (c64) stay as computations.
                Err(_) => return Ok(Rewrite::Keep),
            };
            Ok(Rewrite::Replace(out.try_constant_bytes(shape.clone(), value.to_bytes())?))
        })
    }
}
