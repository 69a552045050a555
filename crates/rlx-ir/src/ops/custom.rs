//! Rules of [`Op::Custom`]: a graph used as an op, with optional custom derivative graphs.

use super::ad::{differentiable, zeros_like};
use crate::text::{Attr, Attrs};
use crate::{CustomFn, Error, Graph, NodeId, Op, Result, Shape};

/// The argument leaves of a body graph, in definition order.
pub(super) fn args(body: &Graph) -> Vec<NodeId> {
    body.ids()
        .filter(|&i| matches!(body.node(i).op, Op::Input { .. }))
        .collect()
}

pub(super) fn arity(f: &CustomFn) -> usize {
    args(&f.body).len()
}

/// Check a body-like graph: no params, the expected number of inputs and outputs.
fn check_graph(f: &CustomFn, what: &str, g: &Graph, inputs: usize, outputs: usize) -> Result<()> {
    let err = |m: String| Error::op("custom", format!("\"{}\": {what} {m}", f.name));
    if g.ids().any(|i| matches!(g.node(i).op, Op::Param { .. })) {
        return Err(err("must not declare params; pass them as arguments".into()));
    }
    let n = args(g).len();
    if n != inputs || g.outputs().len() != outputs {
        return Err(err(format!(
            "needs {inputs} inputs and {outputs} outputs, has {n} and {}",
            g.outputs().len()
        )));
    }
    crate::verify(g)
}

pub(super) fn infer(f: &CustomFn, ins: &[&Shape]) -> Result<Shape> {
    let n = arity(f);
    if f.body.outputs().is_empty() {
        return Err(Error::op(
            "custom",
            format!("\"{}\": the body has no outputs", f.name),
        ));
    }
    check_graph(f, "body", &f.body, n, f.body.outputs().len())?;
    for (i, (a, s)) in args(&f.body).iter().zip(ins).enumerate() {
        if f.body.shape(*a) != *s {
            return Err(Error::op(
                "custom",
                format!(
                    "\"{}\": argument {i} is {s}, the body expects {}",
                    f.name,
                    f.body.shape(*a)
                ),
            ));
        }
    }
    if let Some(v) = &f.vjp {
        check_graph(f, "vjp", v, n + 2, n)?;
    }
    if let Some(j) = &f.jvp {
        check_graph(f, "jvp", j, 2 * n, 1)?;
    }
    Ok(f.body.shape(f.body.outputs()[0]).clone())
}

impl Graph {
    /// Copy `body` (a graph of inputs, constants and ops; no params) into this graph with its
    /// inputs bound to `args` in order; returns the body's outputs here. Argument shapes must
    /// equal the body's inputs'.
    pub fn try_inline(&mut self, body: &Graph, args: &[NodeId]) -> Result<Vec<NodeId>> {
        inline_for("inline", self, body, args)
    }
}

/// Copy `body` into `g` with its inputs bound to `bind`; returns the body's outputs in `g`.
pub(super) fn inline(g: &mut Graph, body: &Graph, bind: &[NodeId]) -> Result<Vec<NodeId>> {
    inline_for("custom", g, body, bind)
}

/// [`inline`] for the op named `op` (errors name it): custom functions, fused regions and the
/// control-flow ops' branches and bodies.
pub(super) fn inline_for(
    op: &str,
    g: &mut Graph,
    body: &Graph,
    bind: &[NodeId],
) -> Result<Vec<NodeId>> {
    let mut map = Vec::with_capacity(body.len());
    let mut next_arg = 0;
    for id in body.ids() {
        let n = body.node(id);
        let new = match &n.op {
            Op::Input { .. } => {
                let a = *bind
                    .get(next_arg)
                    .ok_or_else(|| Error::op(op.to_string(), "too few arguments for the body"))?;
                next_arg += 1;
                if *g.shape(a) != n.shape {
                    return Err(Error::op(
                        op.to_string(),
                        format!(
                            "argument {} is {}, the body expects {}",
                            next_arg - 1,
                            g.shape(a),
                            n.shape
                        ),
                    ));
                }
                a
            }
            Op::Constant { data } => g.try_constant_bytes(n.shape.clone(), data.clone())?,
            Op::Param { name } => {
                return Err(Error::op(
                    op.to_string(),
                    format!("bodies cannot declare params (\"{name}\")"),
                ))
            }
            op => {
                let ins: Vec<NodeId> = n.inputs.iter().map(|i| map[i.index()]).collect();
                g.try_op(op.clone(), &ins)?
            }
        };
        map.push(new);
    }
    Ok(body.outputs().iter().map(|o| map[o.index()]).collect())
}

pub(super) fn vjp(
    g: &mut Graph,
    f: &CustomFn,
    ins: &[NodeId],
    out: NodeId,
    ct: NodeId,
) -> Result<Vec<Option<NodeId>>> {
    let rule = f.vjp.as_ref().expect("has_vjp_rule checked");
    let mut bind = ins.to_vec();
    bind.push(out);
    bind.push(ct);
    let cts = inline(g, rule, &bind)?;
    Ok(ins
        .iter()
        .zip(cts)
        .map(|(&a, c)| differentiable(g.shape(a).dtype()).then_some(c))
        .collect())
}

pub(super) fn jvp(
    g: &mut Graph,
    f: &CustomFn,
    ins: &[NodeId],
    t: &[Option<NodeId>],
) -> Result<Option<NodeId>> {
    let rule = f.jvp.as_ref().expect("has_jvp_rule checked");
    let mut bind = ins.to_vec();
    for (i, tx) in t.iter().enumerate() {
        bind.push(match tx {
            Some(x) => *x,
            None => zeros_like(g, ins[i])?,
        });
    }
    Ok(Some(inline(g, rule, &bind)?[0]))
}

/// Cost of a custom function: the sum of its body's nodes.
pub(super) fn cost(f: &CustomFn) -> super::Cost {
    super::graph_cost(&f.body)
}

/// Text-form attributes of a custom function: its name, body and derivative graphs.
pub fn attrs(f: &CustomFn) -> Vec<(&'static str, Attr)> {
    let graph = |g: &Option<Box<Graph>>| {
        g.as_ref()
            .map_or(Attr::word("none"), |g| Attr::Graph(g.clone()))
    };
    vec![
        ("name", Attr::Str(f.name.clone())),
        ("body", Attr::Graph(f.body.clone())),
        ("vjp", graph(&f.vjp)),
        ("jvp", graph(&f.jvp)),
    ]
}

/// A custom function from its text-form attributes.
pub fn from_attrs(a: &mut Attrs) -> Result<CustomFn> {
    let name = a.string("name")?;
    let body = a
        .graph("body", false)?
        .ok_or_else(|| Error::op("custom", "missing body"))?;
    Ok(CustomFn {
        name,
        body: Box::new(body),
        vjp: a.graph("vjp", true)?.map(Box::new),
        jvp: a.graph("jvp", true)?.map(Box::new),
    })
}
