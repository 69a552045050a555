//! Structural passes: dead-code elimination, common-subexpression elimination, and decomposition
//! of ops a backend lacks.

use crate::{Pass, Rule, RuleSet, Site};
use rlx_ir::{ops, Error, Graph, NodeId, Op, OpKind, Result};

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

/// Merges structurally equal nodes (same op, attributes, operands and shape), found by a
/// structural hash ([`crate::rewrite::structural_hash`]).
pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &str {
        "cse"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        RuleSet::new("cse").with_cse().run(g)
    }
}

/// Replaces every node a backend cannot run by the op's decomposition. Decompositions go
/// through the rules again, so one may use composite ops that are themselves decomposed (or that
/// the backend runs). Each op's rule is counted as `decompose:<op>`.
pub struct Decompose<'a> {
    /// Backend name for errors.
    pub backend: &'a str,
    /// Whether the backend runs a node natively.
    pub supports: &'a dyn Fn(&Graph, NodeId) -> bool,
    /// Why the backend does not run a node (its dtypes, its shapes), for the error of a node
    /// that has no decomposition either (`None`: the error says only that).
    pub why: Option<Refusal<'a>>,
}

/// Why a backend does not run a node (`Backend::refusal`), `None` when it does.
pub type Refusal<'a> = &'a dyn Fn(&Graph, NodeId) -> Option<String>;

impl Decompose<'_> {
    /// One rule per op kind: decompose a node the backend does not run.
    pub fn rules(&self) -> RuleSet<'_> {
        let mut set = RuleSet::new("decompose");
        for kind in OpKind::all() {
            set = set.with(Rule::new(
                format!("decompose:{}", kind.name()),
                &[kind],
                move |g: &mut Graph, s: &Site| {
                    // Ask the backend about the node as it would stand, then take it back.
                    let probe = g.push_unchecked(s.op.clone(), s.ins.to_vec(), s.shape.clone());
                    let runs = (self.supports)(g, probe);
                    let why = match (runs, self.why) {
                        (false, Some(why)) => why(g, probe),
                        _ => None,
                    };
                    g.split_off(probe.index());
                    if runs {
                        return Ok(None);
                    }
                    match ops::decompose(g, s.op, s.ins) {
                        Some(r) => r.map(Some),
                        None => Err(Error::Unsupported {
                            backend: self.backend.to_string(),
                            op: s.op.name().to_string(),
                            node: s.source,
                            msg: match why {
                                Some(why) => format!("{why}; and it has no decomposition"),
                                None => "no kernel and no decomposition".to_string(),
                            },
                        }),
                    }
                },
            ));
        }
        set
    }
}

impl Pass for Decompose<'_> {
    fn name(&self) -> &str {
        "decompose"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        self.rules().run(g)
    }

    fn run_counted(&self, g: &Graph) -> Result<(Graph, std::collections::BTreeMap<String, usize>)> {
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
