//! `if`: `lax.cond`. Operands `(pred, args...)`; the result is the `then` graph applied to the
//! args when the scalar bool `pred` is true, else the `else` graph's. Each branch is a graph
//! whose inputs (in declaration order) take the args and whose one output is the result; both
//! branches give the same shape and dtype. Built with [`Graph::cond`].
//!
//! The reference evaluator and the CPU backend run only the taken branch. The decomposition
//! inlines both branches and selects with `where` — what a backend without a kernel runs, what
//! autodiff differentiates (so the cotangent flows only into the taken branch's values) and what
//! vmap batches (a batched predicate becomes a per-element select of both branches, as in JAX).

use super::custom::inline_for;
use super::{graph_cost, Cost, DefinedOp, OpDef, OpRegistration};
use crate::eval::Tensor;
use crate::text::Attr;
use crate::{Activation, DType, Error, Graph, NodeId, Result, Shape};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The op: `(pred, args...) -> then(args) if pred else else(args)`.
#[derive(Clone, Debug)]
pub struct If {
    /// Applied when the predicate is true.
    pub then_branch: Arc<Graph>,
    /// Applied when it is false.
    pub else_branch: Arc<Graph>,
}

impl PartialEq for If {
    fn eq(&self, o: &If) -> bool {
        self.then_branch.to_string() == o.then_branch.to_string()
            && self.else_branch.to_string() == o.else_branch.to_string()
    }
}

pub(super) const OP: OpRegistration = OpRegistration {
    name: "if",
    from_attrs: |a| {
        let then_branch = a
            .graph("then", false)?
            .ok_or_else(|| Error::op("if", "needs a `then` graph"))?;
        let else_branch = a
            .graph("else", false)?
            .ok_or_else(|| Error::op("if", "needs an `else` graph"))?;
        Ok(DefinedOp::new(If::new(then_branch, else_branch)))
    },
    examples: || {
        let branch = |neg: bool| {
            let mut g = Graph::new(if neg { "neg" } else { "id" });
            let x = g.input("x", Shape::new(&[2], DType::F32));
            let act = if neg {
                Activation::Neg
            } else {
                Activation::Abs
            };
            let y = g.activation(act, x);
            g.set_outputs(vec![y]);
            g
        };
        vec![DefinedOp::new(If::new(branch(false), branch(true)))]
    },
};

impl If {
    /// The op for two branch graphs.
    pub fn new(then_branch: Graph, else_branch: Graph) -> If {
        If {
            then_branch: Arc::new(then_branch),
            else_branch: Arc::new(else_branch),
        }
    }

    fn branches(&self) -> [(&'static str, &Graph); 2] {
        [("then", &self.then_branch), ("else", &self.else_branch)]
    }
}

/// A branch applied to `args`: its one output.
fn inline(g: &mut Graph, branch: &Graph, args: &[NodeId]) -> Result<NodeId> {
    inline_for("if", g, branch, args)?
        .first()
        .copied()
        .ok_or_else(|| Error::op("if", format!("branch \"{}\" has no output", branch.name())))
}

/// Check that `body`'s inputs take operands of shapes `args` and that it has no params.
pub(crate) fn check_inputs(op: &str, which: &str, body: &Graph, args: &[&Shape]) -> Result<()> {
    let inputs = body.inputs();
    if inputs.len() != args.len() {
        return Err(Error::op(
            op.to_string(),
            format!(
                "the {which} graph \"{}\" takes {} inputs but the op has {} args",
                body.name(),
                inputs.len(),
                args.len()
            ),
        ));
    }
    for (i, ((name, id), a)) in inputs.iter().zip(args).enumerate() {
        if body.shape(*id) != *a {
            return Err(Error::op(
                op.to_string(),
                format!(
                    "arg {i} is {a} but the {which} graph's input \"{name}\" is {}",
                    body.shape(*id)
                ),
            ));
        }
    }
    if let Some((name, _)) = body.params().first() {
        return Err(Error::op(
            op.to_string(),
            format!("the {which} graph declares param \"{name}\"; pass it as an arg"),
        ));
    }
    Ok(())
}

/// Evaluate `body` on `args` (its inputs in declaration order) with the reference evaluator.
pub(crate) fn eval_graph(body: &Graph, args: &[Tensor]) -> Result<Vec<Tensor>> {
    let leaves: BTreeMap<String, Tensor> = body
        .inputs()
        .iter()
        .zip(args)
        .map(|((name, _), t)| (name.to_string(), t.clone()))
        .collect();
    crate::eval::evaluate(body, &leaves)
}

impl OpDef for If {
    fn name(&self) -> &'static str {
        OP.name
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("then", Attr::Graph(Box::new((*self.then_branch).clone()))),
            ("else", Attr::Graph(Box::new((*self.else_branch).clone()))),
        ]
    }

    fn graphs(&self) -> Vec<(&'static str, &Graph)> {
        self.branches().to_vec()
    }

    fn with_graphs(&self, graphs: Vec<Graph>) -> Result<DefinedOp> {
        let [then_branch, else_branch]: [Graph; 2] = graphs
            .try_into()
            .map_err(|g: Vec<Graph>| Error::op("if", format!("takes 2 graphs, got {}", g.len())))?;
        Ok(DefinedOp::new(If::new(then_branch, else_branch)))
    }

    fn arity(&self) -> (usize, usize) {
        (1, usize::MAX)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let pred = ins[0];
        if pred.dtype() != DType::Bool || pred.numel() != Some(1) {
            return Err(Error::op(
                "if",
                format!("the predicate must be one bool, got {pred}"),
            ));
        }
        let args = &ins[1..];
        let mut out: Option<Shape> = None;
        for (which, b) in self.branches() {
            check_inputs("if", which, b, args)?;
            let [o] = b.outputs() else {
                return Err(Error::op(
                    "if",
                    format!(
                        "the {which} branch must have one output, has {}",
                        b.outputs().len()
                    ),
                ));
            };
            let s = b.shape(*o).clone();
            match &out {
                Some(t) if *t != s => {
                    return Err(Error::op(
                        "if",
                        format!("the branches give different results: then {t}, else {s}"),
                    ))
                }
                _ => out = Some(s),
            }
        }
        out.ok_or_else(|| Error::op("if", "has no branches"))
    }

    fn eval(&self, ins: &[&Tensor], _out: &Shape) -> Result<Tensor> {
        let taken = if ins[0].i64s().first().copied().unwrap_or(0) != 0 {
            &self.then_branch
        } else {
            &self.else_branch
        };
        let args: Vec<Tensor> = ins[1..].iter().map(|t| (*t).clone()).collect();
        eval_graph(taken, &args)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::op("if", "the branch gave no result"))
    }

    /// The costlier branch (only one runs).
    fn cost(&self, _ins: &[&Shape], _out: &Shape) -> Cost {
        let (a, b) = (graph_cost(&self.then_branch), graph_cost(&self.else_branch));
        if a.flops >= b.flops {
            a
        } else {
            b
        }
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some((|| {
            let t = inline(g, &self.then_branch, &ins[1..])?;
            let e = inline(g, &self.else_branch, &ins[1..])?;
            let dims = g.shape(t).static_dims().unwrap_or_default();
            let p = g.try_reshape(ins[0], &vec![1; dims.len()])?;
            let p = g.try_expand(p, &dims)?;
            g.try_select(p, t, e)
        })())
    }
}

impl Graph {
    /// `lax.cond`: `then_branch(args)` when the scalar bool `pred` is true, else
    /// `else_branch(args)`. Each branch's inputs, in declaration order, take `args`; both have
    /// one output of the same shape. Only the taken branch runs (on backends with a kernel for
    /// `if`; others run its decomposition, both branches and a select).
    pub fn cond(
        &mut self,
        pred: NodeId,
        then_branch: Graph,
        else_branch: Graph,
        args: &[NodeId],
    ) -> Result<NodeId> {
        let mut ins = vec![pred];
        ins.extend_from_slice(args);
        self.define(If::new(then_branch, else_branch), &ins)
    }
}
