//! The verifier: checks every invariant of a graph and reports all violations at once.

use crate::{ops, Error, Graph, Op, Result};

/// Check `g`: operands defined before use, leaf names unique, constant sizes, every inferred
/// shape equal to the stored one, outputs in range. Returns every problem found.
pub fn verify(g: &Graph) -> Result<()> {
    let mut errs = Vec::new();
    let mut names = std::collections::HashSet::new();
    for id in g.ids() {
        let n = g.node(id);
        let here = format!("{id} ({})", n.op.name());
        if let Some(bad) = n.inputs.iter().find(|i| i.index() >= id.index()) {
            errs.push(format!(
                "{here}: operand {bad} is not defined before its use"
            ));
            continue;
        }
        if n.op.is_leaf() && !n.inputs.is_empty() {
            errs.push(format!("{here}: leaves take no operands"));
        }
        match &n.op {
            Op::Input { name } | Op::Param { name } => {
                if !names.insert(name.clone()) {
                    errs.push(format!("{here}: name \"{name}\" is used twice"));
                }
            }
            Op::Constant { data } => match n.shape.size_bytes() {
                Some(want) if want == data.len() => {
                    if let Some(msg) = crate::graph::bad_bool_data(&n.shape, data) {
                        errs.push(format!("{here}: {msg}"));
                    }
                }
                Some(want) => errs.push(format!(
                    "{here}: {} needs {want} bytes, holds {}",
                    n.shape,
                    data.len()
                )),
                None => errs.push(format!(
                    "{here}: shape {} must be static with a byte size that fits usize",
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
                        "{here}: the cache operand {} must be a param (it is updated in place)",
                        n.inputs[0]
                    ));
                }
                let shapes: Vec<_> = n.inputs.iter().map(|&i| g.shape(i)).collect();
                match ops::infer(op, &shapes) {
                    Ok(s) if s == n.shape => {}
                    Ok(s) => errs.push(format!(
                        "{here}: stored shape {} but operands give {s}",
                        n.shape
                    )),
                    Err(e) => errs.push(format!("{here}: {e}")),
                }
            }
        }
    }
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
