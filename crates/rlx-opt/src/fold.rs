//! Constant folding through an evaluator supplied by the runtime.

use crate::{rewrite, Pass, Rewrite};
use rlx_ir::{Graph, Op, Result};

/// Evaluates a small graph of constants. The runtime implements it with a real backend, so
/// folding computes exactly what execution would.
pub trait ConstEval {
    /// Run `g` (whose leaves are all constants) and return each output's bytes.
    fn eval(&self, g: &Graph) -> Result<Vec<Vec<u8>>>;
}

/// Replaces every node whose operands are all constants by a constant holding its value.
pub struct ConstantFolding<'a> {
    /// The evaluator.
    pub eval: &'a dyn ConstEval,
    /// Largest result (in elements) worth folding; bigger ones stay as computations.
    pub max_elements: usize,
}

impl Pass for ConstantFolding<'_> {
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
            let mut vals = self.eval.eval(&tiny)?;
            let data = vals.pop().unwrap_or_default();
            Ok(Rewrite::Replace(out.try_constant_bytes(shape.clone(), data)?))
        })
    }
}
