//! What runs where: a [`KernelDispatchReport`] says, for every node of a compiled graph, whether
//! the backend runs it with its own kernel, as a fused region (and which one), or cannot run it;
//! and which ops the compiler decomposed first, by which rule, how often.

use crate::fusion::FusionReport;
use crate::pipeline::PassRecord;
use crate::rewrite::RuleSite;
use rlx_ir::{FusionKind, Graph, NodeId, Op};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// How one node runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Dispatch {
    /// An input, param or constant: storage, no kernel.
    Leaf,
    /// The backend's kernel for the op.
    Native,
    /// A fused region the backend lowers as one step: the region's index in the fusion report,
    /// its kind, which of its results this node is, and the ops of its body.
    Fused {
        /// Index into [`FusionReport::regions`] (`None` for a region the fusion report did not form).
        region: Option<usize>,
        /// The region's kind.
        kind: FusionKind,
        /// Which result of the region this node is (0: the root, computed by the step).
        output: usize,
        /// The body's ops, in order.
        ops: Vec<String>,
    },
    /// The backend has no kernel for it (compiling would have failed; kept for reports made of
    /// graphs that were not compiled).
    Unsupported {
        /// Why.
        why: String,
    },
}

/// One node of the compiled graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeDispatch {
    /// The node.
    pub node: u32,
    /// Its op.
    pub op: String,
    /// Its shape.
    pub shape: String,
    /// How it runs.
    pub dispatch: Dispatch,
}

/// What runs where on one backend (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelDispatchReport {
    /// The backend.
    pub backend: String,
    /// Every node of the compiled graph, in order.
    pub nodes: Vec<NodeDispatch>,
    /// Decomposition rule → how often it fired (`decompose:<op>`: an op the backend has no
    /// kernel for, replaced by ops it has).
    pub decomposed: BTreeMap<String, usize>,
    /// Each decomposition: the node (of the graph the decomposing pass got; the pass runs in
    /// rounds, so a later round's nodes are those of the graph after the round before), its op
    /// and the rule.
    pub decomposed_at: Vec<RuleSite>,
}

impl KernelDispatchReport {
    /// The report for `g` as compiled by backend `backend` (whose `supports` answers for its
    /// kernels), after the passes of `records` and the fusion of `fusion`.
    pub fn new(
        backend: &str,
        g: &Graph,
        supports: &dyn Fn(&Graph, NodeId) -> bool,
        records: &[PassRecord],
        fusion: &FusionReport,
    ) -> KernelDispatchReport {
        let mut decomposed = BTreeMap::new();
        let mut decomposed_at = Vec::new();
        for r in records {
            for (rule, n) in &r.fired {
                if rule.starts_with("decompose:") {
                    *decomposed.entry(rule.clone()).or_default() += n;
                }
            }
            decomposed_at.extend(
                r.sites
                    .iter()
                    .filter(|s| s.rule.starts_with("decompose:"))
                    .cloned(),
            );
        }
        let region_of: BTreeMap<u32, usize> = fusion
            .regions
            .iter()
            .enumerate()
            .map(|(i, r)| (r.fused_node, i))
            .collect();
        let nodes = g
            .ids()
            .map(|id| {
                let n = g.node(id);
                let dispatch = match &n.op {
                    _ if n.op.is_leaf() => Dispatch::Leaf,
                    _ if !supports(g, id) => Dispatch::Unsupported { why: format!("the {backend} backend has no kernel for {} and the compiler did not decompose it", n.op.name()) },
                    Op::Fused(r) => Dispatch::Fused {
                        region: g.fused_head(id).and_then(|head| region_of.get(&head.0).copied()),
                        kind: r.kind,
                        output: r.output,
                        ops: r.op_names().into_iter().map(str::to_string).collect(),
                    },
                    // Every other op the backend supports runs its own kernel (listed, so a
                    // new kind of op is placed here deliberately).
                    Op::Input { .. }
                    | Op::Param { .. }
                    | Op::Constant { .. }
                    | Op::Binary(_)
                    | Op::Compare(_)
                    | Op::Where
                    | Op::Activation(_)
                    | Op::Cast { .. }
                    | Op::MatMul
                    | Op::DotGeneral(_)
                    | Op::Reduce { .. }
                    | Op::Softmax { .. }
                    | Op::LayerNorm { .. }
                    | Op::RmsNorm { .. }
                    | Op::Reshape { .. }
                    | Op::Transpose { .. }
                    | Op::Narrow { .. }
                    | Op::Concat { .. }
                    | Op::Expand { .. }
                    | Op::Gather { .. }
                    | Op::ScatterAdd { .. }
                    | Op::Cumsum { .. }
                    | Op::TopK { .. }
                    | Op::Attention { .. }
                    | Op::Rope { .. }
                    | Op::Conv(_)
                    | Op::Pool(_)
                    | Op::Custom(_)
                    | Op::DequantMatMul { .. }
                    | Op::DequantizeRows { .. }
                    | Op::CacheWrite
                    | Op::CachedAttention { .. }
                    | Op::PagedAttention { .. }
                    | Op::Defined(_) => Dispatch::Native,
                };
                NodeDispatch { node: id.0, op: n.op.name().to_string(), shape: n.shape.to_string(), dispatch }
            })
            .collect();
        KernelDispatchReport {
            backend: backend.to_string(),
            nodes,
            decomposed,
            decomposed_at,
        }
    }

    /// How many nodes run each way: `(leaves, native, fused steps, further fused results, unsupported)`.
    pub fn counts(&self) -> (usize, usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0, 0);
        for n in &self.nodes {
            match &n.dispatch {
                Dispatch::Leaf => c.0 += 1,
                Dispatch::Native => c.1 += 1,
                Dispatch::Fused { output: 0, .. } => c.2 += 1,
                Dispatch::Fused { .. } => c.3 += 1,
                Dispatch::Unsupported { .. } => c.4 += 1,
            }
        }
        c
    }

    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports serialize")
    }
}

impl fmt::Display for KernelDispatchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (leaves, native, fused, results, unsupported) = self.counts();
        write!(
            f,
            "dispatch on {}: {} nodes: {native} native kernels, {fused} fused steps",
            self.backend,
            self.nodes.len()
        )?;
        if results > 0 {
            write!(f, " (+{results} further results)")?;
        }
        write!(f, ", {leaves} leaves")?;
        if unsupported > 0 {
            write!(f, ", {unsupported} UNSUPPORTED")?;
        }
        writeln!(f)?;
        if !self.decomposed.is_empty() {
            let d: Vec<String> = self
                .decomposed
                .iter()
                .map(|(r, n)| format!("{r} x{n}"))
                .collect();
            writeln!(f, "  decomposed first: {}", d.join(", "))?;
            for s in &self.decomposed_at {
                writeln!(f, "    %{} {} by {}", s.node, s.op, s.rule)?;
            }
        }
        for n in &self.nodes {
            let how = match &n.dispatch {
                Dispatch::Leaf => continue,
                Dispatch::Native => "native".to_string(),
                Dispatch::Fused {
                    region,
                    kind,
                    output,
                    ops,
                } => {
                    let which = region.map_or(String::new(), |r| format!(" {r}"));
                    if *output == 0 {
                        format!("fused region{which} ({}: {})", kind.name(), ops.join(" "))
                    } else {
                        format!("result {output} of fused region{which}")
                    }
                }
                Dispatch::Unsupported { why } => format!("unsupported: {why}"),
            };
            writeln!(f, "  %{} {} {}: {how}", n.node, n.op, n.shape)?;
        }
        Ok(())
    }
}
