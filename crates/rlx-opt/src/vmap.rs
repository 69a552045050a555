//! Vectorizing map, as in JAX: run a graph written for one example over a batch, with the batch
//! on any axis of each batched input (`in_axes`) and of each output (`out_axes`).
//!
//! A generic interpreter: each op's batching rule comes from `rlx_ir::ops::batch`, and ops whose
//! batched operands need more than a rule offers (batched norm scales, convolution weights, rope
//! positions, every dot_general) are first replaced by their decompositions.

use crate::autodiff::unbounded_while;
use crate::{rewrite, Rewrite};
use rlx_ir::{ops, Dim, Error, Graph, NodeId, Op, Result, Shape};

/// Which nodes of `g` depend on the batched leaves.
fn batched_nodes(g: &Graph, leaves: &[&str]) -> Vec<bool> {
    let mut b = vec![false; g.len()];
    for id in g.ids() {
        let n = g.node(id);
        b[id.index()] = match &n.op {
            Op::Input { name } | Op::Param { name } => leaves.contains(&name.as_str()),
            _ => n.inputs.iter().any(|i| b[i.index()]),
        };
    }
    b
}

/// Decompose the nodes whose batched-operand pattern has no rule, until none is left.
fn prepare(g: &Graph, leaves: &[&str]) -> Result<Graph> {
    let mut cur = g.clone();
    for _ in 0..8 {
        let b = batched_nodes(&cur, leaves);
        let needs = |g: &Graph, id: NodeId| {
            let n = g.node(id);
            let flags: Vec<bool> = n.inputs.iter().map(|i| b[i.index()]).collect();
            b[id.index()]
                && !n.op.is_leaf()
                && !ops::batch_supported(&n.op, &flags)
                && unbounded_while(&n.op).is_none()
        };
        if !cur.ids().any(|id| needs(&cur, id)) {
            return Ok(cur);
        }
        let mut idx = 0;
        let (next, _) = rewrite(&cur, |out, op, ins, _| {
            let id = NodeId(idx as u32);
            idx += 1;
            if !needs(&cur, id) {
                return Ok(Rewrite::Keep);
            }
            match ops::decompose(out, op, ins) {
                Some(r) => Ok(Rewrite::Replace(r.map_err(|e| e.at(id))?)),
                None => Err(Error::Op {
                    op: op.name().into(),
                    node: Some(id),
                    msg: "no batching rule and no decomposition".into(),
                }),
            }
        })?;
        cur = next;
    }
    Err(Error::Invalid("vmap preparation did not converge".into()))
}

/// Batch `g` over `batch_size` examples. `in_axes` names each batched input or param and the
/// axis its batch occupies; every other leaf is shared by all examples. Output `i` carries its
/// batch on axis `out_axes[i]` (missing entries: axis 0). Outputs that do not depend on a
/// batched input are broadcast to the batch.
pub fn vmap_axes(
    g: &Graph,
    in_axes: &[(&str, usize)],
    batch_size: usize,
    out_axes: &[usize],
) -> Result<Graph> {
    let names: Vec<&str> = in_axes.iter().map(|(n, _)| *n).collect();
    for (n, ax) in in_axes {
        let id = g
            .find_leaf(n)
            .ok_or_else(|| Error::Invalid(format!("vmap: no input or param named \"{n}\"")))?;
        if *ax > g.shape(id).rank() {
            return Err(Error::Invalid(format!(
                "vmap: in_axis {ax} is out of range for \"{n}\" of shape {}",
                g.shape(id)
            )));
        }
    }
    let src = prepare(g, &names)?;
    let mut out = Graph::new(&format!("vmap_{}", g.name()));
    let mut map: Vec<(NodeId, Option<usize>)> = Vec::with_capacity(src.len());
    for id in src.ids() {
        let n = src.node(id);
        let entry = match &n.op {
            Op::Input { name } | Op::Param { name } => {
                match in_axes.iter().find(|(m, _)| m == name) {
                    Some(&(_, ax)) => {
                        let mut dims = n.shape.dims().to_vec();
                        dims.insert(ax, Dim::Static(batch_size));
                        let s = Shape::with_dims(dims, n.shape.dtype());
                        let leaf = if matches!(n.op, Op::Input { .. }) {
                            out.try_input(name, s)?
                        } else {
                            out.try_param(name, s)?
                        };
                        (leaf, Some(ax))
                    }
                    None => (
                        out.push_unchecked(n.op.clone(), Vec::new(), n.shape.clone()),
                        None,
                    ),
                }
            }
            Op::Constant { .. } => (
                out.push_unchecked(n.op.clone(), Vec::new(), n.shape.clone()),
                None,
            ),
            op => {
                let ins: Vec<NodeId> = n.inputs.iter().map(|i| map[i.index()].0).collect();
                let bds: Vec<Option<usize>> = n.inputs.iter().map(|i| map[i.index()].1).collect();
                if bds.iter().all(Option::is_none) {
                    (out.try_op(op.clone(), &ins).map_err(|e| e.at(id))?, None)
                } else if let Some(w) = unbounded_while(op) {
                    let y =
                        while_batch(&mut out, &w, &ins, &bds, batch_size).map_err(|e| e.at(id))?;
                    (y, Some(0))
                } else {
                    ops::batch(&mut out, op, &ins, &bds, batch_size).map_err(|e| e.at(id))?
                }
            }
        };
        map.push(entry);
    }
    let mut outputs = Vec::new();
    for (i, o) in src.outputs().iter().enumerate() {
        let (y, bd) = map[o.index()];
        let ax = out_axes.get(i).copied().unwrap_or(0);
        let front = ops::batch_materialize(&mut out, y, bd, batch_size)?;
        let r = out.shape(front).rank();
        if ax >= r {
            return Err(Error::Invalid(format!(
                "vmap: out_axis {ax} is out of range for output {i} of rank {r}"
            )));
        }
        outputs.push(if ax == 0 {
            front
        } else {
            let mut perm: Vec<usize> = (1..r).collect();
            perm.insert(ax, 0);
            out.try_transpose(front, &perm)?
        });
    }
    out.try_set_outputs(outputs)?;
    Ok(out)
}

/// Batching of a `while` loop without an iteration bound, as JAX batches one: every carry
/// batched (on axis 0), the loop runs while the predicate holds for any example, and each
/// step keeps the new carries only of the examples whose predicate holds, so each example
/// stops where it would alone. Returns the carry the node yields, batched on axis 0.
fn while_batch(
    g: &mut Graph,
    w: &ops::While,
    ins: &[NodeId],
    bds: &[Option<usize>],
    n: usize,
) -> Result<NodeId> {
    let carries = ins
        .iter()
        .zip(bds)
        .map(|(&x, &bd)| ops::batch_materialize(g, x, bd, n))
        .collect::<Result<Vec<_>>>()?;
    let names =
        |h: &Graph| -> Vec<String> { h.inputs().iter().map(|(s, _)| s.to_string()).collect() };
    let (cn, bn) = (names(&w.cond), names(&w.body));
    let vc = vmap(
        &w.cond,
        &cn.iter().map(String::as_str).collect::<Vec<_>>(),
        n,
    )?;
    let vb = vmap(
        &w.body,
        &bn.iter().map(String::as_str).collect::<Vec<_>>(),
        n,
    )?;
    let leaves = |h: &mut Graph, base: &str| -> Result<Vec<NodeId>> {
        carries
            .iter()
            .enumerate()
            .map(|(j, &c)| h.try_input(&format!("{base}{j}"), g.shape(c).clone()))
            .collect()
    };
    // Predicate: any example's.
    let mut cond = Graph::new(&format!("any_{}", w.cond.name()));
    let xs = leaves(&mut cond, "c")?;
    let p = cond.try_inline(&vc, &xs)?[0];
    let pf = cond.try_cast(p, rlx_ir::DType::F32)?;
    let m = cond.try_reduce(rlx_ir::ReduceKind::Max, pf, &[0], false)?;
    let zero = cond.try_scalar(0.0, rlx_ir::DType::F32)?;
    let any = cond.try_compare(rlx_ir::CmpOp::Gt, m, zero)?;
    cond.try_set_outputs(vec![any])?;
    // Body: the new carries where the example's predicate holds, the old ones elsewhere.
    let mut body = Graph::new(&format!("masked_{}", w.body.name()));
    let xs = leaves(&mut body, "c")?;
    let p = body.try_inline(&vc, &xs)?[0];
    let new = body.try_inline(&vb, &xs)?;
    let mut outs = Vec::with_capacity(xs.len());
    for (&x, &y) in xs.iter().zip(&new) {
        let dims = body
            .shape(x)
            .static_dims()
            .ok_or_else(|| Error::op("while", "vmap of a loop needs static carry shapes"))?;
        let mut one = vec![1; dims.len()];
        one[0] = n;
        let pm = body.try_reshape(p, &one)?;
        let pm = body.try_expand(pm, &dims)?;
        outs.push(body.try_select(pm, y, x)?);
    }
    body.try_set_outputs(outs)?;
    g.define(
        ops::While {
            cond: std::sync::Arc::new(cond),
            body: std::sync::Arc::new(body),
            max_iterations: None,
            output: w.output,
        },
        &carries,
    )
}

/// Batch `g` over the leading axis of each input or param named in `batched`; outputs carry the
/// batch on axis 0.
pub fn vmap(g: &Graph, batched: &[&str], batch_size: usize) -> Result<Graph> {
    let axes: Vec<(&str, usize)> = batched.iter().map(|n| (*n, 0)).collect();
    vmap_axes(g, &axes, batch_size, &[])
}
