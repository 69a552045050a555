//! Structural passes: dead-code elimination, common-subexpression elimination, and decomposition
//! of ops a backend lacks.

use crate::{rewrite, Pass, Rewrite};
use rlx_ir::{ops, Error, Graph, NodeId, Op, Result};
use std::collections::HashMap;

/// Removes nodes no output depends on. Inputs and params stay, so their names remain valid.
pub struct DeadCodeElimination;

impl Pass for DeadCodeElimination {
    fn name(&self) -> &str {
        "dce"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        let mut live = vec![false; g.len()];
        for o in g.outputs() {
            live[o.index()] = true;
        }
        for id in g.ids().rev() {
            let n = g.node(id);
            if matches!(n.op, Op::Input { .. } | Op::Param { .. }) {
                live[id.index()] = true;
            }
            if live[id.index()] {
                for i in &n.inputs {
                    live[i.index()] = true;
                }
            }
        }
        let mut out = Graph::new(g.name());
        let mut map = vec![NodeId(u32::MAX); g.len()];
        for id in g.ids().filter(|i| live[i.index()]) {
            let n = g.node(id);
            let ins = n.inputs.iter().map(|i| map[i.index()]).collect();
            map[id.index()] = out.push_unchecked(n.op.clone(), ins, n.shape.clone());
        }
        out.set_outputs_unchecked(g.outputs().iter().map(|o| map[o.index()]).collect());
        let removed = g.len() - out.len();
        Ok((out, removed))
    }
}

/// Merges structurally equal nodes (same op, attributes, operands and shape).
pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &str {
        "cse"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        let mut seen: HashMap<String, NodeId> = HashMap::new();
        rewrite(g, |out, op, ins, shape| {
            if matches!(op, Op::Input { .. } | Op::Param { .. }) {
                return Ok(Rewrite::Keep);
            }
            let key = format!("{op:?}|{ins:?}|{shape:?}");
            if let Some(&prev) = seen.get(&key) {
                return Ok(Rewrite::Replace(prev));
            }
            seen.insert(key, NodeId(out.len() as u32));
            Ok(Rewrite::Keep)
        })
    }
}

/// Replaces every node a backend cannot run by the op's decomposition, repeatedly, so that the
/// decomposition may itself use composite ops the backend does run.
pub struct Decompose<'a> {
    /// Backend name for errors.
    pub backend: &'a str,
    /// Whether the backend runs a node natively.
    pub supports: &'a dyn Fn(&Graph, NodeId) -> bool,
}

impl Pass for Decompose<'_> {
    fn name(&self) -> &str {
        "decompose"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        let mut cur = g.clone();
        let mut total = 0;
        for _ in 0..8 {
            let unsupported: Vec<bool> = cur.ids().map(|id| !(self.supports)(&cur, id)).collect();
            if !unsupported.iter().any(|&u| u) {
                return Ok((cur, total));
            }
            let mut idx = 0;
            let (next, n) = rewrite(&cur, |out, op, ins, _| {
                let bad = unsupported[idx];
                let id = NodeId(idx as u32);
                idx += 1;
                if !bad {
                    return Ok(Rewrite::Keep);
                }
                match ops::decompose(out, op, ins) {
                    Some(r) => Ok(Rewrite::Replace(r.map_err(|e| e.at(id))?)),
                    None => Err(Error::Unsupported {
                        backend: self.backend.to_string(),
                        op: op.name().to_string(),
                        node: id,
                        msg: "no kernel and no decomposition".to_string(),
                    }),
                }
            })?;
            total += n;
            cur = next;
        }
        Err(Error::Invalid(format!("decomposition for {} did not converge", self.backend)))
    }
}
