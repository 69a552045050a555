//! The verifier: checks every invariant of a graph and reports all violations at once.

use crate::{ops, Error, Graph, Op, Result};

/// Check `g`: operands defined before use, leaf names unique, constant sizes, every inferred
/// shape equal to the stored one, outputs in range. Returns every problem found.
pub fn verify(g: &Graph) -> Result<()> {
    let mut errs = Vec::new();
    let mut names: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for id in g.ids() {
        let n = g.node(id);
        // Written only for a finding: a valid graph's check formats nothing.
        let here = || format!("{id} ({})", n.op.name());
        if let Some(bad) = n.inputs.iter().find(|i| i.index() >= id.index()) {
            errs.push(format!(
                "{}: operand {bad} is not defined before its use",
                here()
            ));
            continue;
        }
        if n.op.is_leaf() && !n.inputs.is_empty() {
            errs.push(format!("{}: leaves take no operands", here()));
        }
        match &n.op {
            Op::Input { name } | Op::Param { name } => {
                if !names.insert(name) {
                    errs.push(format!("{}: name \"{name}\" is used twice", here()));
                }
            }
            Op::Constant { data } => match n.shape.size_bytes() {
                Some(want) if want == data.len() => {
                    if let Some(msg) = crate::graph::bad_bool_data(&n.shape, data) {
                        errs.push(format!("{}: {msg}", here()));
                    }
                }
                Some(want) => errs.push(format!(
                    "{}: {} needs {want} bytes, holds {}",
                    here(),
                    n.shape,
                    data.len()
                )),
                None => errs.push(format!(
                    "{}: shape {} must be static with a byte size that fits usize",
                    here(),
                    n.shape
                )),
            },
            op => {
                if matches!(op, Op::CacheWrite)
                    && n.inputs
                        .first()
                        .is_some_and(|c| !matches!(g.node(*c).op, Op::Param { .. }))
                {
                    errs.push(format!(
                        "{}: the cache operand {} must be a param (it is updated in place)",
                        here(),
                        n.inputs[0]
                    ));
                }
                let shapes: Vec<_> = n.inputs.iter().map(|&i| g.shape(i)).collect();
                match ops::infer(op, &shapes) {
                    Ok(s) if s == n.shape => {}
                    Ok(s) => errs.push(format!(
                        "{}: stored shape {} but operands give {s}",
                        here(),
                        n.shape
                    )),
                    Err(e) => errs.push(format!("{}: {e}", here())),
                }
            }
        }
    }
    regions(g, &mut errs);
    for o in g.outputs() {
        if o.index() >= g.len() {
            errs.push(format!(
                "output {o} is not a node (graph has {} nodes)",
                g.len()
            ));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(Error::Verify(errs))
    }
}

/// The result nodes of each fused region with an id: one first result (output 0) before the
/// others, each output once, the same kind, operands and body.
fn regions(g: &Graph, errs: &mut Vec<String>) {
    let mut by_id: std::collections::BTreeMap<u32, Vec<crate::NodeId>> = Default::default();
    for id in g.ids() {
        if let Op::Fused(r) = &g.node(id).op {
            if let Some(k) = r.region {
                by_id.entry(k).or_default().push(id);
            }
        }
    }
    for (k, nodes) in by_id {
        let head = nodes[0];
        let Op::Fused(h) = &g.node(head).op else {
            continue;
        };
        if h.output != 0 {
            errs.push(format!(
                "{head} (fused): region {k}'s first node is result {}, not its first result",
                h.output
            ));
            continue;
        }
        let mut seen = std::collections::BTreeSet::new();
        for &id in &nodes[1..] {
            let Op::Fused(r) = &g.node(id).op else {
                continue;
            };
            if r.output == 0 || !seen.insert(r.output) {
                errs.push(format!(
                    "{id} (fused): region {k} has output {} twice",
                    r.output
                ));
            } else if g.fused_head(id) != Some(head) {
                errs.push(format!(
                    "{id} (fused): result {} of region {k} differs from its first result {head} \
                     in kind, operands or body",
                    r.output
                ));
            }
        }
    }
}
