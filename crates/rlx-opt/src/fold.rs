//! Constant folding with the reference evaluator ([`rlx_ir::eval`]).

use crate::{Pass, Rule, RuleSet, Site};
use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::{Graph, NodeId, Op, OpKind, Result};
use std::collections::BTreeMap;

/// Replaces every node whose operands are all constants by a constant holding its value,
/// computed by the reference evaluator (exactly, or in f64 rounded once to the node's dtype),
/// so every backend folds to the same bytes.
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
