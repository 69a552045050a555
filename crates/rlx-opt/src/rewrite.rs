//! The rebuild-with-rules driver every pass uses.

use rlx_ir::{Graph, NodeId, Op, Result, Shape};

/// What a rule decides for one node.
pub enum Rewrite {
    /// Copy the node unchanged (with its operands remapped).
    Keep,
    /// Use this node of the new graph instead.
    Replace(NodeId),
}

/// Rebuild `g` node by node. `rule(new_graph, op, new_operands, shape)` may append nodes to the
/// new graph and return [`Rewrite::Replace`]. Returns the new graph and how many nodes were
/// replaced. Outputs follow their replacements.
pub fn rewrite(
    g: &Graph,
    mut rule: impl FnMut(&mut Graph, &Op, &[NodeId], &Shape) -> Result<Rewrite>,
) -> Result<(Graph, usize)> {
    let mut out = Graph::new(g.name());
    let mut map: Vec<NodeId> = Vec::with_capacity(g.len());
    let mut changed = 0;
    for id in g.ids() {
        let n = g.node(id);
        let ins: Vec<NodeId> = n.inputs.iter().map(|i| map[i.index()]).collect();
        let new = match rule(&mut out, &n.op, &ins, &n.shape)? {
            Rewrite::Keep => out.push_unchecked(n.op.clone(), ins, n.shape.clone()),
            Rewrite::Replace(r) => {
                changed += 1;
                r
            }
        };
        map.push(new);
    }
    out.set_outputs_unchecked(g.outputs().iter().map(|o| map[o.index()]).collect());
    Ok((out, changed))
}
