//! Loops: `while` (`lax.while_loop`) and `scan` (`lax.scan`, carry-only).
//!
//! - `while {cond, body, max_iterations, output}`: operands are the initial carries; while the
//!   `cond` graph (carries → one bool) is true, the `body` graph (carries → new carries) runs;
//!   the node yields carry number `output` (one node per carry the graph reads, as `top_k`'s two
//!   results are). No unrolling: the reference evaluator and the CPU loop for real, stopping
//!   early only at `max_iterations` when it is set. With `max_iterations` the op also has a
//!   decomposition — the body unrolled that many times, each step kept only while the
//!   predicate holds (the masked form JAX batches a loop with) — which backends without a loop
//!   kernel run and which autodiff and vmap transform: reverse mode therefore needs the bound,
//!   as JAX's `fori_loop` needs a static trip count. Without a bound, forward mode and
//!   batching are rules of `rlx_opt` (`jvp` and `vmap` of the body and predicate graphs), not
//!   of this file, which cannot transform graphs.
//! - `scan {body, consts}`: operands `(init, consts..., xs...)`, each `xs` with a leading axis of
//!   length `T`; the `body` graph maps `(carry, consts..., x_t...)` to the new carry; the result stacks the `T` new carries
//!   (`[T, ...]`; the last is the final carry). The evaluator and the CPU loop; the
//!   decomposition unrolls the `T` steps (static), which gives every backend, reverse and
//!   forward mode and vmap.

use super::cond::{check_inputs, eval_graph};
use super::custom::inline_for;
use super::{graph_cost, Cost, DefinedOp, OpDef, OpRegistration};
use crate::eval::Tensor;
use crate::text::Attr;
use crate::{DType, Error, Graph, NodeId, Result, Shape};
use std::sync::Arc;

fn graph_attr(g: &Graph) -> Attr {
    Attr::Graph(Box::new(g.clone()))
}

/// The `while` op (see the module docs).
#[derive(Clone, Debug)]
pub struct While {
    /// Carries → one bool: whether to run the body again.
    pub cond: Arc<Graph>,
    /// Carries → new carries.
    pub body: Arc<Graph>,
    /// At most this many iterations (`None`: until the predicate is false).
    pub max_iterations: Option<usize>,
    /// The carry this node yields.
    pub output: usize,
}

impl PartialEq for While {
    fn eq(&self, o: &While) -> bool {
        self.max_iterations == o.max_iterations
            && self.output == o.output
            && self.cond.to_string() == o.cond.to_string()
            && self.body.to_string() == o.body.to_string()
    }
}

pub(super) const WHILE: OpRegistration = OpRegistration {
    name: "while",
    from_attrs: |a| {
        let cond = a
            .graph("cond", false)?
            .ok_or_else(|| Error::op("while", "needs a `cond` graph"))?;
        let body = a
            .graph("body", false)?
            .ok_or_else(|| Error::op("while", "needs a `body` graph"))?;
        Ok(DefinedOp::new(While {
            cond: Arc::new(cond),
            body: Arc::new(body),
            max_iterations: a.opt_usize("max_iterations")?,
            output: a.usize("output")?,
        }))
    },
    examples: || {
        let mut cond = Graph::new("positive");
        let x = cond.input("x", Shape::new(&[], DType::F32));
        let z = cond.scalar(0.0, DType::F32);
        let p = cond.compare(crate::CmpOp::Gt, x, z);
        cond.set_outputs(vec![p]);
        let mut body = Graph::new("dec");
        let x = body.input("x", Shape::new(&[], DType::F32));
        let one = body.scalar(1.0, DType::F32);
        let y = body.sub(x, one);
        body.set_outputs(vec![y]);
        [None, Some(8)]
            .map(|m| {
                DefinedOp::new(While {
                    cond: Arc::new(cond.clone()),
                    body: Arc::new(body.clone()),
                    max_iterations: m,
                    output: 0,
                })
            })
            .to_vec()
    },
};

impl OpDef for While {
    fn name(&self) -> &'static str {
        WHILE.name
    }

    fn graphs(&self) -> Vec<(&'static str, &Graph)> {
        vec![("cond", &*self.cond), ("body", &*self.body)]
    }

    fn with_graphs(&self, graphs: Vec<Graph>) -> Result<DefinedOp> {
        let [cond, body]: [Graph; 2] = graphs.try_into().map_err(|g: Vec<Graph>| {
            Error::op("while", format!("takes 2 graphs, got {}", g.len()))
        })?;
        Ok(DefinedOp::new(While {
            cond: Arc::new(cond),
            body: Arc::new(body),
            ..self.clone()
        }))
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("cond", graph_attr(&self.cond)),
            ("body", graph_attr(&self.body)),
            ("max_iterations", self.max_iterations.into()),
            ("output", self.output.into()),
        ]
    }

    fn arity(&self) -> (usize, usize) {
        (1, usize::MAX)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        check_inputs("while", "cond", &self.cond, ins)?;
        check_inputs("while", "body", &self.body, ins)?;
        match self.cond.outputs() {
            [p] if self.cond.shape(*p).dtype() == DType::Bool
                && self.cond.shape(*p).numel() == Some(1) => {}
            _ => {
                return Err(Error::op(
                    "while",
                    "the cond graph must have one output, a single bool",
                ))
            }
        }
        let outs = self.body.outputs();
        if outs.len() != ins.len() {
            return Err(Error::op(
                "while",
                format!(
                    "the body gives {} values for {} carries",
                    outs.len(),
                    ins.len()
                ),
            ));
        }
        for (i, (o, c)) in outs.iter().zip(ins).enumerate() {
            if self.body.shape(*o) != *c {
                return Err(Error::op(
                    "while",
                    format!(
                        "carry {i} is {c} but the body gives {}",
                        self.body.shape(*o)
                    ),
                ));
            }
        }
        ins.get(self.output).map(|s| (*s).clone()).ok_or_else(|| {
            Error::op(
                "while",
                format!("output {} of {} carries", self.output, ins.len()),
            )
        })
    }

    fn eval(&self, ins: &[&Tensor], _out: &Shape) -> Result<Tensor> {
        let mut carries: Vec<Tensor> = ins.iter().map(|t| (*t).clone()).collect();
        let mut done = 0;
        while self.max_iterations.is_none_or(|m| done < m) {
            let p = eval_graph(&self.cond, &carries)?;
            if p.first()
                .is_none_or(|t| t.i64s().first().copied().unwrap_or(0) == 0)
            {
                break;
            }
            carries = eval_graph(&self.body, &carries)?;
            done += 1;
        }
        Ok(carries.swap_remove(self.output))
    }

    /// One iteration's cost (the trip count is not known).
    fn cost(&self, _ins: &[&Shape], _out: &Shape) -> Cost {
        graph_cost(&self.body) + graph_cost(&self.cond)
    }

    /// With `max_iterations`: the body unrolled, each step's result kept only while the
    /// predicate holds; without it there is none (a backend needs a loop kernel).
    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        let max = self.max_iterations?;
        Some((|| {
            let mut carries = ins.to_vec();
            let mut active = inline_for("while", g, &self.cond, &carries)?[0];
            for _ in 0..max {
                let next = inline_for("while", g, &self.body, &carries)?;
                for (c, n) in carries.iter_mut().zip(next) {
                    let dims = g.shape(n).static_dims().unwrap_or_default();
                    let a = g.try_reshape(active, &vec![1; dims.len()])?;
                    let a = g.try_expand(a, &dims)?;
                    *c = g.try_select(a, n, *c)?;
                }
                // Active while every predicate so far held: once false, stays false.
                let p = inline_for("while", g, &self.cond, &carries)?[0];
                active = g.try_select(active, p, active)?;
            }
            Ok(carries[self.output])
        })())
    }
}

/// The `scan` op (see the module docs).
#[derive(Clone, Debug)]
pub struct Scan {
    /// `(carry, consts..., x_t...)` → new carry.
    pub body: Arc<Graph>,
    /// How many operands after the carry are passed whole to every step (weights a closure
    /// would capture in JAX); the rest are scanned over.
    pub consts: usize,
}

impl PartialEq for Scan {
    fn eq(&self, o: &Scan) -> bool {
        self.consts == o.consts && self.body.to_string() == o.body.to_string()
    }
}

pub(super) const SCAN: OpRegistration = OpRegistration {
    name: "scan",
    from_attrs: |a| {
        let body = a
            .graph("body", false)?
            .ok_or_else(|| Error::op("scan", "needs a `body` graph"))?;
        Ok(DefinedOp::new(Scan {
            body: Arc::new(body),
            consts: a.usize_or("consts", 0)?,
        }))
    },
    examples: || {
        let mut body = Graph::new("cumsum");
        let c = body.input("c", Shape::new(&[2], DType::F32));
        let x = body.input("x", Shape::new(&[2], DType::F32));
        let y = body.add(c, x);
        body.set_outputs(vec![y]);
        vec![DefinedOp::new(Scan {
            body: Arc::new(body),
            consts: 0,
        })]
    },
};

impl Scan {
    /// The steps `T` and each step's body operand shapes `(carry, consts..., x_t...)`.
    fn steps(&self, ins: &[&Shape]) -> Result<(usize, Vec<Shape>)> {
        let k = self.consts;
        if ins.len() < 2 + k {
            return Err(Error::op(
                "scan",
                format!(
                    "takes a carry, {k} consts and at least one sequence; got {} operands",
                    ins.len()
                ),
            ));
        }
        let mut t = None;
        let mut per: Vec<Shape> = ins[..1 + k].iter().map(|s| (*s).clone()).collect();
        for (i, xs) in ins[1 + k..].iter().enumerate() {
            let dims = xs.static_dims().unwrap_or_default();
            let Some((&n, rest)) = dims.split_first() else {
                return Err(Error::op(
                    "scan",
                    format!("sequence {i} is {xs}: it needs a leading axis to scan over"),
                ));
            };
            if let Some(t0) = t.filter(|&t0| t0 != n) {
                return Err(Error::op(
                    "scan",
                    format!("sequence {i} has {n} steps, an earlier one {t0}"),
                ));
            }
            t = Some(n);
            per.push(Shape::new(rest, xs.dtype()));
        }
        let t = t.unwrap_or(0);
        if t == 0 {
            return Err(Error::op("scan", "the sequences have no steps"));
        }
        Ok((t, per))
    }
}

impl OpDef for Scan {
    fn name(&self) -> &'static str {
        SCAN.name
    }

    fn graphs(&self) -> Vec<(&'static str, &Graph)> {
        vec![("body", &*self.body)]
    }

    fn with_graphs(&self, graphs: Vec<Graph>) -> Result<DefinedOp> {
        let [body]: [Graph; 1] = graphs.try_into().map_err(|g: Vec<Graph>| {
            Error::op("scan", format!("takes 1 graph, got {}", g.len()))
        })?;
        Ok(DefinedOp::new(Scan {
            body: Arc::new(body),
            consts: self.consts,
        }))
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("body", graph_attr(&self.body)),
            ("consts", self.consts.into()),
        ]
    }

    fn arity(&self) -> (usize, usize) {
        (2, usize::MAX)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let (t, per) = self.steps(ins)?;
        let refs: Vec<&Shape> = per.iter().collect();
        check_inputs("scan", "body", &self.body, &refs)?;
        match self.body.outputs() {
            [o] if self.body.shape(*o) == ins[0] => {}
            _ => {
                return Err(Error::op(
                    "scan",
                    format!(
                        "the body must give one new carry of the carry's shape {}",
                        ins[0]
                    ),
                ))
            }
        }
        let mut dims = vec![t];
        dims.extend(ins[0].static_dims().unwrap_or_default());
        Ok(Shape::new(&dims, ins[0].dtype()))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let shapes: Vec<Shape> = ins.iter().map(|t| t.shape()).collect();
        let refs: Vec<&Shape> = shapes.iter().collect();
        let (t, per) = self.steps(&refs)?;
        let mut carry = ins[0].clone();
        let mut stacked = Vec::with_capacity(t * carry.numel());
        for step in 0..t {
            let mut args = vec![carry];
            args.extend(ins[1..1 + self.consts].iter().map(|c| (*c).clone()));
            for (xs, s) in ins[1 + self.consts..].iter().zip(&per[1 + self.consts..]) {
                let n: usize = s.numel().unwrap_or(0);
                let idx: Vec<usize> = (step * n..(step + 1) * n).collect();
                args.push(xs.pick(&s.static_dims().unwrap_or_default(), &idx));
            }
            carry = eval_graph(&self.body, &args)?
                .into_iter()
                .next()
                .ok_or_else(|| Error::op("scan", "the body gave no result"))?;
            stacked.extend(carry.f64s());
        }
        Ok(Tensor::from_f64(
            &out.static_dims().unwrap_or_default(),
            out.dtype(),
            stacked,
        ))
    }

    /// `T` times the body's cost.
    fn cost(&self, ins: &[&Shape], _out: &Shape) -> Cost {
        let t = self.steps(ins).map_or(1, |(t, _)| t) as u64;
        let c = graph_cost(&self.body);
        Cost {
            flops: c.flops * t,
            bytes: c.bytes * t,
        }
    }

    /// The `T` steps unrolled: each `x_t` a narrow of its sequence, the new carries stacked.
    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some((|| {
            let shapes: Vec<Shape> = ins.iter().map(|&i| g.shape(i).clone()).collect();
            let refs: Vec<&Shape> = shapes.iter().collect();
            let (t, per) = self.steps(&refs)?;
            let mut carry = ins[0];
            let cdims = shapes[0].static_dims().unwrap_or_default();
            let mut rows = Vec::with_capacity(t);
            for step in 0..t {
                let mut args = vec![carry];
                args.extend_from_slice(&ins[1..1 + self.consts]);
                for (&xs, s) in ins[1 + self.consts..].iter().zip(&per[1 + self.consts..]) {
                    let x = g.try_narrow(xs, 0, step, 1)?;
                    args.push(g.try_reshape(x, &s.static_dims().unwrap_or_default())?);
                }
                carry = inline_for("scan", g, &self.body, &args)?[0];
                let mut d = vec![1];
                d.extend(&cdims);
                rows.push(g.try_reshape(carry, &d)?);
            }
            if rows.len() == 1 {
                return Ok(rows[0]);
            }
            g.try_concat(&rows, 0)
        })())
    }
}

impl Graph {
    /// `lax.while_loop` over the carries `init`: while `cond` (carries → one bool) holds, the
    /// carries become `body(carries)`; returns one node per carry (their final values). Only
    /// the evaluator and backends with a loop kernel (the CPU) run it, and it has no reverse
    /// mode or batching: [`Graph::while_loop_bounded`] has both.
    pub fn while_loop(&mut self, cond: Graph, body: Graph, init: &[NodeId]) -> Result<Vec<NodeId>> {
        self.while_loop_bounded(cond, body, init, None)
    }

    /// [`Graph::while_loop`] stopping after at most `max_iterations` (when `Some`): reverse mode
    /// (a fixed trip count, as JAX's `fori_loop`), forward mode and vmap then work, through the
    /// bounded, masked unrolling.
    pub fn while_loop_bounded(
        &mut self,
        cond: Graph,
        body: Graph,
        init: &[NodeId],
        max_iterations: Option<usize>,
    ) -> Result<Vec<NodeId>> {
        let (cond, body) = (Arc::new(cond), Arc::new(body));
        (0..init.len())
            .map(|output| {
                let op = While {
                    cond: cond.clone(),
                    body: body.clone(),
                    max_iterations,
                    output,
                };
                self.define(op, init)
            })
            .collect()
    }

    /// `lax.scan` with the carry as the per-step output: `body` maps `(carry, x_t...)` to the
    /// new carry for each step `t` of the sequences `xs` (leading axis `T`); returns the `T` new
    /// carries stacked (`[T, ...]`; the last row is the final carry).
    pub fn scan(&mut self, body: Graph, init: NodeId, xs: &[NodeId]) -> Result<NodeId> {
        self.scan_with(body, init, &[], xs)
    }

    /// [`Graph::scan`] with `consts` passed whole to every step, after the carry and before
    /// the steps' slices (`body(carry, consts..., x_t...)`): the values a JAX closure captures.
    pub fn scan_with(
        &mut self,
        body: Graph,
        init: NodeId,
        consts: &[NodeId],
        xs: &[NodeId],
    ) -> Result<NodeId> {
        let mut ins = vec![init];
        ins.extend_from_slice(consts);
        ins.extend_from_slice(xs);
        self.define(
            Scan {
                body: Arc::new(body),
                consts: consts.len(),
            },
            &ins,
        )
    }
}
