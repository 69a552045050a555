//! Automatic differentiation as graph transforms: reverse mode ([`grad_with_loss`], [`grad`]),
//! forward mode ([`jvp`]), forward-over-reverse ([`hvp`]) and repeated reverse mode
//! ([`nth_order_grad`]).
//!
//! The transforms are generic interpreters: every op's derivative comes from its rules in
//! `rlx_ir::ops` (`vjp`, `jvp`), and ops without rules of their own (attention, norms,
//! convolution, pooling, dot_general) are first replaced by their decompositions. Results are
//! ordinary graphs, so transforms compose: the gradient graph can be differentiated again.

use crate::{rewrite, Decompose, Pass, Rewrite};
use rlx_ir::{ops, Error, Graph, NodeId, Op, Result, Shape};

/// Name of the input that carries the cotangent of the loss in [`grad_with_loss`] graphs.
pub const D_OUTPUT: &str = "d_output";

/// Name of the tangent input [`jvp`] adds for the leaf `name`.
pub fn tangent_name(name: &str) -> String {
    format!("tangent_{name}")
}

/// Replace ops without differentiation rules (for both modes) by their decompositions.
pub fn prepare_for_ad(g: &Graph) -> Result<Graph> {
    prepare(g, ops::has_ad_rules)
}

/// Ops over complex values are always differentiated through their complex form (real ops on
/// the parts, joined by `complex`, `real` and `imag`, whose rules follow JAX's convention for
/// complex cotangents), so every real op's rule serves them unchanged.
fn prepare(g: &Graph, has_rule: impl Fn(&Op) -> bool) -> Result<Graph> {
    let supports = |g: &Graph, id: NodeId| {
        let n = g.node(id);
        let dtypes: Vec<rlx_ir::DType> = n.inputs.iter().map(|&i| g.shape(i).dtype()).collect();
        has_rule(&n.op) && !ops::complex::splits(&n.op, &dtypes)
    };
    Ok(Decompose {
        backend: "autodiff",
        supports: &supports,
        why: None,
    }
    .run(g)?
    .0)
}

/// Whether values of `dt` have derivatives: the real floats, and c64 (whose cotangents follow
/// JAX's convention: `dL/dx - i dL/dy` for `x + iy`, what `jax.grad` returns).
fn has_derivatives(dt: rlx_ir::DType) -> bool {
    dt.is_float() || dt == rlx_ir::DType::C64
}

/// Names of the leaves `wrt` (each an input or param of a floating-point dtype).
fn leaf_names(g: &Graph, wrt: &[NodeId]) -> Result<Vec<String>> {
    wrt.iter()
        .map(|&id| {
            let n = g.get(id).ok_or(Error::BadOutput { node: id, nodes: g.len() })?;
            match &n.op {
                Op::Input { name } | Op::Param { name } if has_derivatives(n.shape.dtype()) => Ok(name.clone()),
                Op::Input { name } | Op::Param { name } => Err(Error::Invalid(format!(
                    "cannot differentiate with respect to \"{name}\" of dtype {}: only floating-point and complex inputs and params have derivatives",
                    n.shape.dtype()
                ))),
                op => Err(Error::Invalid(format!(
                    "can only differentiate with respect to inputs and params; node {id} is a {}",
                    op.name()
                ))),
            }
        })
        .collect()
}

fn find(g: &Graph, name: &str) -> Result<NodeId> {
    g.find_leaf(name)
        .ok_or_else(|| Error::Invalid(format!("no input or param named \"{name}\"")))
}

/// Nodes that depend on any of `from`.
fn dependents(g: &Graph, from: &[NodeId]) -> Vec<bool> {
    let mut dep = vec![false; g.len()];
    for &f in from {
        dep[f.index()] = true;
    }
    for id in g.ids() {
        if g.node(id).inputs.iter().any(|i| dep[i.index()]) {
            dep[id.index()] = true;
        }
    }
    dep
}

/// Accumulate cotangents from `seed` (the cotangent of node `root`) back through the first
/// `n_forward` nodes of `g`, appending the backward computation to `g`. Only nodes that depend
/// on `wrt` are visited.
fn backprop(
    g: &mut Graph,
    n_forward: usize,
    root: NodeId,
    seed: NodeId,
    wrt: &[NodeId],
) -> Result<Vec<Option<NodeId>>> {
    let dep = dependents(g, wrt);
    let mut ct: Vec<Option<NodeId>> = vec![None; n_forward];
    ct[root.index()] = Some(seed);
    for i in (0..=root.index()).rev() {
        let (Some(c), true) = (ct[i], dep[i]) else {
            continue;
        };
        let node = g.node(NodeId(i as u32)).clone();
        if node.op.is_leaf() {
            continue;
        }
        let rule =
            ops::vjp(g, &node.op, &node.inputs, NodeId(i as u32), c).ok_or_else(|| Error::Op {
                op: node.op.name().into(),
                node: Some(NodeId(i as u32)),
                msg: "no reverse-mode rule (and the graph was not prepared for autodiff)".into(),
            })?;
        let cts = rule.map_err(|e| e.at(NodeId(i as u32)))?;
        for (inp, c) in node.inputs.iter().zip(cts) {
            let (Some(c), true) = (c, dep[inp.index()]) else {
                continue;
            };
            ct[inp.index()] = Some(match ct[inp.index()] {
                Some(prev) => g.try_add(prev, c)?,
                None => c,
            });
        }
    }
    Ok(ct)
}

fn zeros(g: &mut Graph, s: &Shape) -> Result<NodeId> {
    let z = g.try_scalar(0.0, s.dtype())?;
    let d = s.static_dims().unwrap_or_default();
    if d.is_empty() {
        Ok(z)
    } else {
        g.try_expand(z, &d)
    }
}

/// Reverse mode. Returns a graph with the inputs of `g`, plus an input [`D_OUTPUT`] holding the
/// cotangent of the loss (`g`'s first output; feed ones for a plain gradient), whose outputs are
/// `[loss, d loss / d wrt[0], ...]`. `wrt` are inputs or params of `g`.
pub fn grad_with_loss(g: &Graph, wrt: &[NodeId]) -> Result<Graph> {
    reverse(g, wrt, false)
}

/// JAX's `value_and_grad` (with `has_aux` when `g` has more than one output): outputs
/// `[g's outputs..., d loss / d wrt[0], ...]`, the loss being `g`'s first output and its
/// cotangent fixed to one. Every output of `g` stays (where [`grad`] keeps only gradients).
pub fn value_and_grad(g: &Graph, wrt: &[NodeId]) -> Result<Graph> {
    bake_input(&reverse(g, wrt, true)?, D_OUTPUT, 1.0)
}

/// Reverse mode: outputs `[loss, (the other outputs of g when keep_outputs), gradients...]`.
fn reverse(g: &Graph, wrt: &[NodeId], keep_outputs: bool) -> Result<Graph> {
    let names = leaf_names(g, wrt)?;
    let loss = *g.outputs().first().ok_or_else(|| {
        Error::Invalid("grad_with_loss needs the loss as the graph's first output".into())
    })?;
    if !g.shape(loss).dtype().is_float() {
        return Err(Error::Invalid(format!(
            "the loss must be floating point, got {}",
            g.shape(loss)
        )));
    }
    let mut out = prepare(g, ops::has_vjp_rule)?;
    let n = out.len();
    let loss = out.outputs()[0];
    let d_out = out.try_input(D_OUTPUT, out.shape(loss).clone())?;
    let leaves: Vec<NodeId> = names.iter().map(|n| find(&out, n)).collect::<Result<_>>()?;
    let ct = backprop(&mut out, n, loss, d_out, &leaves)?;
    let mut outputs = if keep_outputs {
        out.outputs().to_vec()
    } else {
        vec![loss]
    };
    for &l in &leaves {
        outputs.push(match ct[l.index()] {
            Some(c) => c,
            None => {
                let s = out.shape(l).clone();
                zeros(&mut out, &s)?
            }
        });
    }
    out.try_set_outputs(outputs)?;
    Ok(out)
}

/// Replace the input `name` by a constant filled with `value`.
pub fn bake_input(g: &Graph, name: &str, value: f64) -> Result<Graph> {
    Ok(rewrite(g, |out, op, _, shape| match op {
        Op::Input { name: n } if n == name => {
            let c = out.try_scalar(value, shape.dtype())?;
            let d = shape.static_dims().unwrap_or_default();
            Ok(Rewrite::Replace(if d.is_empty() {
                c
            } else {
                out.try_expand(c, &d)?
            }))
        }
        _ => Ok(Rewrite::Keep),
    })?
    .0)
}

/// Gradients only: outputs `[d loss / d wrt[0], ...]` with the loss cotangent fixed to ones.
pub fn grad(g: &Graph, wrt: &[NodeId]) -> Result<Graph> {
    let gl = bake_input(&grad_with_loss(g, wrt)?, D_OUTPUT, 1.0)?;
    let mut out = gl.clone();
    out.try_set_outputs(gl.outputs()[1..].to_vec())?;
    Ok(out)
}

/// Forward mode. For each leaf named in `tangent_for`, adds an input named
/// [`tangent_name`]`(name)` of the same shape; the outputs are `[primals..., tangents...]` in the
/// order of `g`'s outputs.
pub fn jvp(g: &Graph, tangent_for: &[&str]) -> Result<Graph> {
    let mut out = prepare(g, |op| {
        ops::has_jvp_rule(op) || unbounded_while(op).is_some()
    })?;
    let n = out.len();
    let mut t: Vec<Option<NodeId>> = vec![None; n];
    for name in tangent_for {
        let l = find(&out, name)?;
        let s = out.shape(l).clone();
        if !has_derivatives(s.dtype()) {
            return Err(Error::Invalid(format!(
                "cannot perturb \"{name}\" of dtype {}: tangents need a floating-point dtype",
                s.dtype()
            )));
        }
        t[l.index()] = Some(out.try_input(&tangent_name(name), s)?);
    }
    for i in 0..n {
        let node = out.node(NodeId(i as u32)).clone();
        if node.op.is_leaf() {
            continue;
        }
        let ts: Vec<Option<NodeId>> = node.inputs.iter().map(|x| t[x.index()]).collect();
        if ts.iter().all(Option::is_none) {
            continue;
        }
        if let Some(w) = unbounded_while(&node.op) {
            t[i] =
                while_jvp(&mut out, &w, &node.inputs, &ts).map_err(|e| e.at(NodeId(i as u32)))?;
            continue;
        }
        let rule =
            ops::jvp(&mut out, &node.op, &node.inputs, NodeId(i as u32), &ts).ok_or_else(|| {
                Error::Op {
                    op: node.op.name().into(),
                    node: Some(NodeId(i as u32)),
                    msg: "no forward-mode rule".into(),
                }
            })?;
        t[i] = rule.map_err(|e| e.at(NodeId(i as u32)))?;
    }
    let primals = out.outputs().to_vec();
    let mut outputs = primals.clone();
    for p in primals {
        outputs.push(match t[p.index()] {
            Some(x) => x,
            None => {
                let s = out.shape(p).clone();
                zeros(&mut out, &s)?
            }
        });
    }
    out.try_set_outputs(outputs)?;
    Ok(out)
}

/// The `while` op of `op` when it has no iteration bound. Its forward mode is a rule here (it
/// needs [`jvp`] of the body); a bounded `while` is differentiated through its decomposition,
/// which reverse mode needs anyway.
pub(crate) fn unbounded_while(op: &Op) -> Option<ops::While> {
    match op {
        Op::Defined(d) => d
            .downcast::<ops::While>()
            .filter(|w| w.max_iterations.is_none())
            .cloned(),
        _ => None,
    }
}

/// Forward mode of a `while` loop, as JAX's: a loop over the carries and the tangents of its
/// floating-point carries, the predicate on the carries alone, the body's [`jvp`] as the body
/// (so the loop runs as many times as the primal one). Returns the tangent of the carry the
/// node yields (`None` for a carry that is not floating-point).
fn while_jvp(
    g: &mut Graph,
    w: &ops::While,
    ins: &[NodeId],
    ts: &[Option<NodeId>],
) -> Result<Option<NodeId>> {
    let floats: Vec<usize> = (0..ins.len())
        .filter(|&j| g.shape(ins[j]).dtype().is_float())
        .collect();
    let Some(slot) = floats.iter().position(|&j| j == w.output) else {
        return Ok(None);
    };
    let body_inputs: Vec<String> = w.body.inputs().iter().map(|(n, _)| n.to_string()).collect();
    let perturbed: Vec<&str> = floats.iter().map(|&j| body_inputs[j].as_str()).collect();
    // Body: (carries, tangents) -> (new carries, their tangents), the tangents of the float
    // carries only.
    let mut body = jvp(&w.body, &perturbed)?;
    let n = ins.len();
    let outs = body.outputs().to_vec();
    let mut keep = outs[..n].to_vec();
    keep.extend(floats.iter().map(|&j| outs[n + j]));
    body.try_set_outputs(keep)?;
    // Predicate: the carries' one, the tangents read by nobody.
    let mut cond = (*w.cond).clone();
    let cond_inputs: Vec<String> = w.cond.inputs().iter().map(|(n, _)| n.to_string()).collect();
    for &j in &floats {
        cond.try_input(&tangent_name(&cond_inputs[j]), g.shape(ins[j]).clone())?;
    }
    let mut operands = ins.to_vec();
    for &j in &floats {
        operands.push(match ts[j] {
            Some(t) => t,
            None => {
                let s = g.shape(ins[j]).clone();
                zeros(g, &s)?
            }
        });
    }
    let op = ops::While {
        cond: std::sync::Arc::new(cond),
        body: std::sync::Arc::new(body),
        max_iterations: None,
        output: n + slot,
    };
    Ok(Some(g.define(op, &operands)?))
}

/// Hessian-vector products by forward-over-reverse. Adds a tangent input
/// [`tangent_name`]`(name)` for each `wrt` leaf (the vector); outputs are
/// `[loss, grads..., hvps...]` where `hvps[i] = Σ_j H[i][j] · v[j]`.
pub fn hvp(g: &Graph, wrt: &[NodeId]) -> Result<Graph> {
    let names = leaf_names(g, wrt)?;
    let gl = bake_input(&grad_with_loss(g, wrt)?, D_OUTPUT, 1.0)?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let j = jvp(&gl, &refs)?;
    let k = wrt.len();
    // jvp outputs: [loss, grads(k), t_loss, t_grads(k)]
    let o = j.outputs().to_vec();
    let mut outputs = o[..1 + k].to_vec();
    outputs.extend_from_slice(&o[2 + k..]);
    let mut out = j;
    out.try_set_outputs(outputs)?;
    Ok(out)
}

/// The `order`-th derivative of a scalar loss with respect to the scalar leaf `wrt`, by
/// repeated reverse mode. The result graph has one output.
pub fn nth_order_grad(g: &Graph, wrt: NodeId, order: usize) -> Result<Graph> {
    let name = leaf_names(g, &[wrt])?.remove(0);
    let scalar = |s: &Shape| s.numel() == Some(1);
    if !scalar(g.shape(wrt)) || g.outputs().first().is_none_or(|&l| !scalar(g.shape(l))) {
        return Err(Error::Invalid(
            "nth_order_grad differentiates a scalar loss with respect to a scalar leaf".into(),
        ));
    }
    let mut cur = g.clone();
    cur.try_set_outputs(vec![g.outputs()[0]])?;
    for _ in 0..order {
        let leaf = find(&cur, &name)?;
        let gr = grad(&cur, &[leaf])?;
        cur = gr;
    }
    Ok(cur)
}
