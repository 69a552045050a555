//! Constant folding with the reference evaluator ([`rlx_ir::eval`]).

use crate::{Pass, Rule, RuleSet, Site};
use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::{Graph, NodeId, Op, OpKind, Result};
use std::collections::BTreeMap;

/// Replaces every node whose operands are all constants by a constant holding its value,
/// computed by the reference evaluator (exactly, or in f64 rounded once to the node's dtype),
/// so every backend folds to the same bytes. A broadcast (`Expand`) of a constant stays one:
/// backends read it as a view, while its folded value would be a tensor as large as the
/// result, stored in the graph (and in every compile-cache entry; a training step's gradient
/// seed `1/N` expanded over the logits was 240 KB of the GPT's 300 KB of constants).
pub struct ConstantFolding {
    /// Largest result (in elements) worth folding; bigger ones stay as computations.
    pub max_elements: usize,
}

impl ConstantFolding {
    /// The folding rule (`fold`, for every op kind) as a rule list.
    pub fn rules(&self) -> RuleSet<'_> {
        let kinds: Vec<OpKind> = OpKind::all()
            .into_iter()
            .filter(|k| !matches!(k, OpKind::Input | OpKind::Param | OpKind::Constant))
            .collect();
        RuleSet::new("const_fold").with(Rule::new(
            "fold",
            &kinds,
            move |out: &mut Graph, s: &Site| self.fold(out, s),
        ))
    }

    fn fold(&self, out: &mut Graph, s: &Site) -> Result<Option<NodeId>> {
        let foldable = !s.ins.is_empty()
            && s.ins
                .iter()
                .all(|&i| matches!(out.node(i).op, Op::Constant { .. }))
            && s.shape.numel().is_some_and(|n| n <= self.max_elements);
        if !foldable {
            return Ok(None);
        }
        if let Op::Expand { .. } = s.op {
            let grows = out.node(s.ins[0]).shape.numel() < s.shape.numel();
            if grows {
                return Ok(None);
            }
        }
        let mut tiny = Graph::new("fold");
        let mut args = Vec::with_capacity(s.ins.len());
        for &i in s.ins {
            let n = out.node(i);
            args.push(tiny.push_unchecked(n.op.clone(), Vec::new(), n.shape.clone()));
        }
        let r = tiny.push_unchecked(s.op.clone(), args, s.shape.clone());
        tiny.set_outputs_unchecked(vec![r]);
        let value: Tensor = match evaluate(&tiny, &BTreeMap::new()) {
            Ok(mut v) => v.remove(0),
            // Ops the evaluator cannot compute (c64) stay as computations.
            Err(_) => return Ok(None),
        };
        Ok(Some(
            out.try_constant_bytes(s.shape.clone(), value.to_bytes())?,
        ))
    }
}

impl Pass for ConstantFolding {
    fn name(&self) -> &str {
        "const_fold"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        self.rules().run(g)
    }

    fn run_counted(&self, g: &Graph) -> Result<(Graph, BTreeMap<String, usize>)> {
        self.rules().apply(g)
    }

    fn run_logged(
        &self,
        g: &Graph,
    ) -> Result<(
        Graph,
        std::collections::BTreeMap<String, usize>,
        Vec<crate::rewrite::RuleSite>,
    )> {
        self.rules().apply_logged(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{DType, Shape};

    /// A constant broadcast over a large tensor stays a broadcast (a view for the backends),
    /// while a computation on constants alone that does not grow is folded.
    #[test]
    fn broadcasts_of_constants_stay_views() {
        let mut g = Graph::new("seed");
        let x = g.input("x", Shape::new(&[1024, 60], DType::F32));
        let c = g.try_scalar(1.0 / 1024.0, DType::F32).unwrap();
        let two = g.try_scalar(2.0, DType::F32).unwrap();
        let c2 = g.try_mul(c, two).unwrap();
        let e = g.try_expand(c2, &[1024, 60]).unwrap();
        let y = g.try_mul(e, x).unwrap();
        g.set_outputs(vec![y]);
        let (f, _) = ConstantFolding {
            max_elements: 1 << 20,
        }
        .run(&g)
        .unwrap();
        let constants: Vec<usize> = f
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Constant { .. }))
            .map(|n| n.shape.numel().unwrap_or(0))
            .collect();
        // The folded product and the scalars it came from (dead code is another pass's).
        assert!(
            constants.iter().all(|&n| n == 1) && constants.len() == 3,
            "scalars only, no 1024 x 60 constant: {constants:?}"
        );
        assert!(f.nodes().iter().any(|n| matches!(n.op, Op::Expand { .. })));
    }
}
