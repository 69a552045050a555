//! Post-training quantization to int8, IR in and IR out, as TFLite's converter and ONNX
//! Runtime's static quantization do it:
//!
//! 1. [`specialize_params`]: a trained model's params become constants (the weights are then
//!    part of the graph, to be quantized).
//! 2. Calibration ([`Calibrator`], or [`calibrate`] on the reference evaluator): the float graph
//!    runs over sample inputs and every *tap* records the values it took. A tap is a value the
//!    integer graph will hold as int8 (see [`taps`]): each float input, and the end of each
//!    fusible group, a `matmul` or `conv` with a constant weight (then an optional constant
//!    bias `add` and `relu`), or an `add` of two activations (then an optional `relu`). The
//!    constant weights are taps too, quantized symmetrically per output channel. The result
//!    is a [`QuantMap`]: per tap, its range, scale and zero point ([`RangeMethod`]: min/max, a
//!    percentile, or the range of least quantization error); it serializes to JSON.
//! 3. [`insert_q_dq`]: the float graph with a `quantize → dequantize` pair after every tap (the
//!    QDQ form ONNX uses): still a float graph, which any backend runs, simulating int8.
//! 4. [`quant_propagate`]: the QDQ graph folded into integer ops (`qlinear`, `qconv2d`, `qadd`,
//!    `qpool`; reshapes stay reshapes), with int32 biases and fixed-point requantization
//!    ([`rlx_ir::quant::fixed`]), a ReLU folded into the clamp. A float input is quantized where
//!    it enters and each float output dequantized where it leaves; a value between two taps
//!    that has no integer form is a named error.

use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::ops::{Dequantize, QAdd, QConv2d, QLinear, QOut, QPool, Quantize, QADD_LEFT_SHIFT};
use rlx_ir::quant::fixed::quantize_multiplier;
use rlx_ir::{Activation, BinaryOp, DType, Error, Graph, NodeId, Op, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// How an activation's range is chosen from the values it took during calibration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum RangeMethod {
    /// The smallest and largest values seen.
    MinMax,
    /// The `p`-th and `(100 - p)`-th percentiles (`p` in `(50, 100]`), clipping rare outliers.
    Percentile(f64),
    /// The range, among 100 shrinkings of the min/max range, whose quantization error (mean
    /// squared error of the values quantized and dequantized) is least.
    Mse,
}

/// What a tap quantizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapKind {
    /// A value computed from the inputs: per tensor, with a zero point.
    Activation,
    /// A constant weight: symmetric (zero point 0), one scale per output channel along `axis`.
    Weight {
        /// The output-channel axis.
        axis: usize,
    },
}

/// One calibrated tap: its quantization parameters and the range they came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationEntry {
    /// `None` per tensor; `Some(d)` per channel along axis `d`.
    pub axis: Option<usize>,
    /// Scale per tensor (one entry) or per channel.
    pub scale: Vec<f32>,
    /// Zero point per tensor or per channel (0 for weights).
    pub zero_point: Vec<i8>,
    /// The low end of the chosen range, per tensor or channel.
    pub min: Vec<f32>,
    /// The high end.
    pub max: Vec<f32>,
}

/// Map of tap node → calibrated quantization parameters.
pub type CalibrationRecord = BTreeMap<NodeId, CalibrationEntry>;

/// A calibrated graph's quantization: the record for the graph it was computed on, identified
/// by name and node count (checked when the map is applied).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuantMap {
    /// The graph's name.
    pub graph: String,
    /// Its node count.
    pub nodes: usize,
    /// How activation ranges were chosen.
    pub method: RangeMethod,
    /// The taps, by node.
    pub taps: Vec<(NodeId, CalibrationEntry)>,
}

impl QuantMap {
    /// The taps as a map.
    pub fn record(&self) -> CalibrationRecord {
        self.taps.iter().cloned().collect()
    }

    /// The map as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// A map read from JSON (errors name what is malformed).
    pub fn from_json(s: &str) -> Result<QuantMap> {
        let m: QuantMap = serde_json::from_str(s)
            .map_err(|e| Error::Invalid(format!("quantization map: {e}")))?;
        for (id, e) in &m.taps {
            let n = e.scale.len();
            if n == 0 || e.zero_point.len() != n || e.min.len() != n || e.max.len() != n {
                return Err(Error::Invalid(format!(
                    "quantization map: tap {id} has {} scales, {} zero points, {} minima and {} maxima",
                    e.scale.len(),
                    e.zero_point.len(),
                    e.min.len(),
                    e.max.len()
                )));
            }
            if let Some(s) = e.scale.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                return Err(Error::Invalid(format!(
                    "quantization map: tap {id} has scale {s} (scales are positive and finite)"
                )));
            }
        }
        Ok(m)
    }

    fn check(&self, g: &Graph) -> Result<()> {
        if self.graph != g.name() || self.nodes != g.len() {
            return Err(Error::Invalid(format!(
                "quantization map of graph \"{}\" ({} nodes) applied to graph \"{}\" ({} nodes)",
                self.graph,
                self.nodes,
                g.name(),
                g.len()
            )));
        }
        Ok(())
    }
}

/// Replace each param named in `values` by a constant holding its value (shapes must match);
/// other params stay.
pub fn specialize_params(g: &Graph, values: &BTreeMap<String, Tensor>) -> Result<Graph> {
    let mut out = Graph::new(g.name());
    for id in g.ids() {
        let n = g.node(id);
        let op = match &n.op {
            Op::Param { name } if values.contains_key(name) => {
                let v = &values[name];
                if v.shape() != n.shape {
                    return Err(Error::Invalid(format!(
                        "param \"{name}\" ({id}) is {} but its value is {}",
                        n.shape,
                        v.shape()
                    )));
                }
                Op::Constant { data: v.to_bytes() }
            }
            op => op.clone(),
        };
        out.push_unchecked(op, n.inputs.clone(), n.shape.clone());
    }
    out.set_outputs_unchecked(g.outputs().to_vec());
    Ok(out)
}

fn consumers(g: &Graph) -> Vec<Vec<NodeId>> {
    let mut c = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for i in &g.node(id).inputs {
            c[i.index()].push(id);
        }
    }
    c
}

fn is_const(g: &Graph, id: NodeId) -> bool {
    matches!(g.node(id).op, Op::Constant { .. })
}

fn is_float(g: &Graph, id: NodeId) -> bool {
    g.shape(id).dtype().is_float()
}

/// A node's only consumer, when it has exactly one and is not an output.
fn only_consumer(g: &Graph, cons: &[Vec<NodeId>], id: NodeId) -> Option<NodeId> {
    match cons[id.index()][..] {
        [c] if !g.outputs().contains(&id) => Some(c),
        _ => None,
    }
}

/// The operand of a constant-weight product (`matmul` or 2-D `conv`) that is its weight, with
/// its output-channel axis.
fn weight_of(g: &Graph, id: NodeId) -> Option<(NodeId, usize)> {
    let n = g.node(id);
    match &n.op {
        Op::MatMul if g.shape(n.inputs[1]).rank() == 2 => Some((n.inputs[1], 1)),
        Op::Conv(_) => Some((n.inputs[1], 0)),
        _ => None,
    }
    .filter(|(w, _)| is_const(g, *w) && is_float(g, *w))
}

/// The end of the group starting at `id`: through a constant bias `add` (for products), then a
/// `relu`, each the single consumer of the node before.
fn group_end(g: &Graph, cons: &[Vec<NodeId>], id: NodeId, product: bool) -> NodeId {
    let mut end = id;
    if product {
        if let Some(c) = only_consumer(g, cons, end) {
            let n = g.node(c);
            if matches!(n.op, Op::Binary(BinaryOp::Add)) && n.inputs.iter().any(|&i| is_const(g, i))
            {
                end = c;
            }
        }
    }
    if let Some(c) = only_consumer(g, cons, end) {
        if matches!(g.node(c).op, Op::Activation(Activation::Relu)) {
            end = c;
        }
    }
    end
}

/// The values the integer form of `g` holds as int8: float inputs, the ends of fusible groups
/// and the constant weights of products, in node order.
pub fn taps(g: &Graph) -> Vec<(NodeId, TapKind)> {
    let cons = consumers(g);
    let mut t: BTreeMap<NodeId, TapKind> = BTreeMap::new();
    for id in g.ids() {
        let n = g.node(id);
        match &n.op {
            Op::Input { .. } if is_float(g, id) => {
                t.insert(id, TapKind::Activation);
            }
            _ if weight_of(g, id).is_some() => {
                let (w, axis) = weight_of(g, id).unwrap_or((id, 0));
                t.insert(w, TapKind::Weight { axis });
                t.insert(group_end(g, &cons, id, true), TapKind::Activation);
            }
            Op::Binary(BinaryOp::Add)
                if is_float(g, id) && n.inputs.iter().all(|&i| !is_const(g, i)) =>
            {
                // A bias add is part of its product's group, not a group of its own.
                let bias = n.inputs.iter().any(|&i| weight_of(g, i).is_some());
                if !bias {
                    t.insert(group_end(g, &cons, id, false), TapKind::Activation);
                }
            }
            _ => {}
        }
    }
    t.into_iter().collect()
}

/// Running statistics of one activation tap.
#[derive(Default)]
struct Stats {
    min: f32,
    max: f32,
    seen: bool,
    values: Vec<f32>,
}

/// Calibration over sample inputs run by any means: [`Calibrator::graph`] is the model with the
/// activation taps as its outputs; run it (on any backend) and hand each run's outputs to
/// [`Calibrator::observe`]; [`Calibrator::finish`] gives the map.
pub struct Calibrator {
    model: Graph,
    graph: Graph,
    activations: Vec<NodeId>,
    weights: Vec<(NodeId, usize)>,
    method: RangeMethod,
    stats: Vec<Stats>,
}

impl Calibrator {
    /// A calibrator for float graph `g` (params specialized to constants) choosing activation
    /// ranges by `method`.
    pub fn new(g: &Graph, method: RangeMethod) -> Result<Calibrator> {
        if let RangeMethod::Percentile(p) = method {
            if !(p > 50.0 && p <= 100.0) {
                return Err(Error::Invalid(format!(
                    "calibration percentile {p} must lie in (50, 100]"
                )));
            }
        }
        if let Some((name, id)) = g.params().first() {
            return Err(Error::Invalid(format!(
                "calibration: param \"{name}\" ({id}) has no value; specialize the params to constants first"
            )));
        }
        let all = taps(g);
        let activations: Vec<NodeId> = all
            .iter()
            .filter(|(_, k)| *k == TapKind::Activation)
            .map(|(id, _)| *id)
            .collect();
        let weights = all
            .iter()
            .filter_map(|(id, k)| match k {
                TapKind::Weight { axis } => Some((*id, *axis)),
                TapKind::Activation => None,
            })
            .collect();
        let mut graph = g.clone();
        graph.set_outputs_unchecked(activations.clone());
        Ok(Calibrator {
            model: g.clone(),
            stats: activations.iter().map(|_| Stats::default()).collect(),
            graph,
            activations,
            weights,
            method,
        })
    }

    /// The model with the activation taps as its outputs, in node order.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Record one run's values of the taps (the outputs of [`Calibrator::graph`], in order).
    pub fn observe(&mut self, values: &[Tensor]) -> Result<()> {
        if values.len() != self.activations.len() {
            return Err(Error::Invalid(format!(
                "calibration: {} values for {} taps",
                values.len(),
                self.activations.len()
            )));
        }
        let keep = !matches!(self.method, RangeMethod::MinMax);
        for ((v, s), id) in values.iter().zip(&mut self.stats).zip(&self.activations) {
            let want = self.graph.shape(*id);
            if v.dims().len() != want.rank() {
                return Err(Error::Invalid(format!(
                    "calibration: tap {id} is {want} but its value has dims {:?}",
                    v.dims()
                )));
            }
            for x in v.f64s() {
                let x = x as f32;
                if !x.is_finite() {
                    return Err(Error::Invalid(format!(
                        "calibration: tap {id} took the value {x}"
                    )));
                }
                if !s.seen {
                    (s.min, s.max, s.seen) = (x, x, true);
                }
                s.min = s.min.min(x);
                s.max = s.max.max(x);
                if keep {
                    s.values.push(x);
                }
            }
        }
        Ok(())
    }

    /// The quantization map: activation ranges by the method, weights by their largest
    /// magnitude per channel.
    pub fn finish(self) -> Result<QuantMap> {
        let mut taps = Vec::new();
        for (id, s) in self.activations.iter().zip(&self.stats) {
            if !s.seen {
                return Err(Error::Invalid(format!(
                    "calibration: tap {id} was never observed (run the calibration graph on at least one sample)"
                )));
            }
            let (lo, hi) = match self.method {
                RangeMethod::MinMax => (s.min, s.max),
                RangeMethod::Percentile(p) => percentile_range(&s.values, p),
                RangeMethod::Mse => mse_range(&s.values, s.min, s.max),
            };
            taps.push((*id, activation_entry(lo, hi)));
        }
        for &(id, axis) in &self.weights {
            let n = self.model.node(id);
            let Op::Constant { data } = &n.op else {
                continue;
            };
            let w = Tensor::from_bytes(&n.shape, data)?;
            taps.push((id, weight_entry(&w, axis)));
        }
        taps.sort_by_key(|(id, _)| *id);
        Ok(QuantMap {
            graph: self.model.name().to_string(),
            nodes: self.model.len(),
            method: self.method,
            taps,
        })
    }
}

/// Calibrate `g` on the reference evaluator over `samples` (each a full set of inputs).
pub fn calibrate(
    g: &Graph,
    samples: &[BTreeMap<String, Tensor>],
    method: RangeMethod,
) -> Result<QuantMap> {
    let mut c = Calibrator::new(g, method)?;
    for s in samples {
        let v = evaluate(c.graph(), s)?;
        c.observe(&v)?;
    }
    c.finish()
}

/// The asymmetric int8 parameters of range `[lo, hi]` (widened to hold 0, which must be
/// exact: zero padding and ReLU depend on it).
pub fn activation_entry(lo: f32, hi: f32) -> CalibrationEntry {
    let (lo, hi) = (lo.min(0.0), hi.max(0.0));
    let scale = if hi > lo { (hi - lo) / 255.0 } else { 1.0 };
    let zp = (-128.0 - lo / scale).round().clamp(-128.0, 127.0) as i8;
    CalibrationEntry {
        axis: None,
        scale: vec![scale],
        zero_point: vec![zp],
        min: vec![lo],
        max: vec![hi],
    }
}

/// Symmetric per-channel parameters of weight `w` along `axis`: `scale = max|w| / 127`.
pub fn weight_entry(w: &Tensor, axis: usize) -> CalibrationEntry {
    let d = w.dims();
    let c = d[axis];
    let inner: usize = d[axis + 1..].iter().product();
    let mut m = vec![0f32; c];
    for (i, v) in w.f64s().into_iter().enumerate() {
        let ch = (i / inner) % c;
        m[ch] = m[ch].max(v.abs() as f32);
    }
    CalibrationEntry {
        axis: Some(axis),
        scale: m
            .iter()
            .map(|&a| if a > 0.0 { a / 127.0 } else { 1.0 })
            .collect(),
        zero_point: vec![0; c],
        min: m.iter().map(|a| -a).collect(),
        max: m,
    }
}

fn percentile_range(values: &[f32], p: f64) -> (f32, f32) {
    let mut v = values.to_vec();
    v.sort_by(f32::total_cmp);
    let at = |q: f64| v[((q / 100.0) * (v.len() - 1) as f64).round() as usize];
    (at(100.0 - p), at(p))
}

/// The shrinking `a · [lo, hi]`, `a` in 0.01..=1, of least quantization error; the values
/// are subsampled evenly to at most 65536.
fn mse_range(values: &[f32], lo: f32, hi: f32) -> (f32, f32) {
    let step = values.len().div_ceil(65536).max(1);
    let sample: Vec<f32> = values.iter().step_by(step).copied().collect();
    let err = |lo: f32, hi: f32| -> f64 {
        let e = activation_entry(lo, hi);
        let (s, z) = (e.scale[0], e.zero_point[0] as f32);
        sample
            .iter()
            .map(|&x| {
                let q = ((x / s).round_ties_even() + z).clamp(-128.0, 127.0);
                let d = ((q - z) * s - x) as f64;
                d * d
            })
            .sum()
    };
    (1..=100)
        .map(|i| i as f32 / 100.0)
        .map(|a| (lo * a, hi * a))
        .min_by(|a, b| err(a.0, a.1).total_cmp(&err(b.0, b.1)))
        .unwrap_or((lo, hi))
}

fn params(g: &mut Graph, e: &CalibrationEntry, fdt: DType) -> Result<(NodeId, NodeId)> {
    let dims: Vec<usize> = match e.axis {
        None => vec![],
        Some(_) => vec![e.scale.len()],
    };
    let s = Tensor::from_f64(&dims, fdt, e.scale.iter().map(|&v| v as f64).collect());
    let z = Tensor::from_i64(
        &dims,
        DType::I8,
        e.zero_point.iter().map(|&v| v as i64).collect(),
    );
    let s = g.try_constant_bytes(s.shape(), s.to_bytes())?;
    let z = g.try_constant_bytes(z.shape(), z.to_bytes())?;
    Ok((s, z))
}

/// The QDQ graph: `g` with a `quantize → dequantize` pair after every tap of `map`, whose
/// consumers read the dequantized value.
pub fn insert_q_dq(g: &Graph, map: &QuantMap) -> Result<Graph> {
    map.check(g)?;
    let record = map.record();
    let mut out = Graph::new(g.name());
    let mut new: Vec<NodeId> = Vec::with_capacity(g.len());
    for id in g.ids() {
        let n = g.node(id);
        let ins = n.inputs.iter().map(|i| new[i.index()]).collect();
        let mut y = out.push_unchecked(n.op.clone(), ins, n.shape.clone());
        if let Some(e) = record.get(&id) {
            if !is_float(g, id) {
                return Err(Error::Invalid(format!(
                    "insert_q_dq: tap {id} ({}) is {}, not a float value",
                    n.op.name(),
                    n.shape
                )));
            }
            if let Some(a) = e.axis {
                let c = n.shape.static_dims().and_then(|d| d.get(a).copied());
                if c != Some(e.scale.len()) {
                    return Err(Error::Invalid(format!(
                        "insert_q_dq: tap {id} ({}) is {} but its map entry has {} channels along axis {a}",
                        n.op.name(),
                        n.shape,
                        e.scale.len()
                    )));
                }
            }
            let (s, z) = params(&mut out, e, n.shape.dtype())?;
            let q = out.try_op(Op::defined(Quantize { axis: e.axis }), &[y, s, z])?;
            y = out.try_op(Op::defined(Dequantize { axis: e.axis }), &[q, s, z])?;
        }
        new.push(y);
    }
    out.set_outputs_unchecked(g.outputs().iter().map(|o| new[o.index()]).collect());
    rlx_ir::verify(&out)?;
    Ok(out)
}

/// An int8 value of the integer graph with its quantization.
#[derive(Clone, Copy, Debug)]
struct IntVal {
    id: NodeId,
    scale: f32,
    zero_point: i32,
}

/// The folding of a QDQ graph into the integer graph.
struct Fold<'a> {
    q: &'a Graph,
    out: Graph,
    done: HashMap<NodeId, IntVal>,
    leaves: HashMap<NodeId, NodeId>,
}

/// The constant node's value.
fn constant(g: &Graph, id: NodeId) -> Option<Tensor> {
    match &g.node(id).op {
        Op::Constant { data } => Tensor::from_bytes(g.shape(id), data).ok(),
        _ => None,
    }
}

/// `(q, scale, zero point, axis)` of a `dequantize` node.
type Dequantized = (NodeId, Vec<f64>, Vec<i64>, Option<usize>);

/// The operands of a `dequantize(q, scale, zp)` node with constant parameters.
fn dequantized(g: &Graph, id: NodeId) -> Option<Dequantized> {
    let n = g.node(id);
    let Op::Defined(d) = &n.op else { return None };
    let dq = d.downcast::<Dequantize>()?;
    let s = constant(g, n.inputs[1])?.f64s();
    let z = constant(g, n.inputs[2])?.i64s();
    Some((n.inputs[0], s, z, dq.axis))
}

impl Fold<'_> {
    fn err(&self, id: NodeId, why: &str) -> Error {
        let n = self.q.node(id);
        Error::Invalid(format!(
            "quant_propagate: {id} ({} : {}) {why}; the integer ops take quantized inputs, \
             matmul and 2-D conv with constant weights (plus a constant bias and relu), add of \
             two activations (plus relu), 2-D max/mean pooling and reshape",
            n.op.name(),
            n.shape
        ))
    }

    /// The float leaf `id` copied into the integer graph.
    fn leaf(&mut self, id: NodeId) -> NodeId {
        if let Some(&l) = self.leaves.get(&id) {
            return l;
        }
        let n = self.q.node(id);
        let l = self
            .out
            .push_unchecked(n.op.clone(), vec![], n.shape.clone());
        self.leaves.insert(id, l);
        l
    }

    fn i32s(&mut self, v: Vec<i64>) -> Result<NodeId> {
        let t = Tensor::from_i64(&[v.len()], DType::I32, v);
        self.out.try_constant_bytes(t.shape(), t.to_bytes())
    }

    /// The int8 form of float value `id` of the QDQ graph.
    fn int(&mut self, id: NodeId) -> Result<IntVal> {
        if let Some(&v) = self.done.get(&id) {
            return Ok(v);
        }
        let n = self.q.node(id).clone();
        let v = if let Some((qid, s, z, axis)) = dequantized(self.q, id) {
            let qn = self.q.node(qid);
            let src = match &qn.op {
                Op::Defined(d) if d.downcast::<Quantize>().is_some() => qn.inputs[0],
                _ => return Err(self.err(id, "dequantizes a value that no quantize made")),
            };
            if axis.is_some() {
                return Err(self.err(
                    id,
                    "is a per-channel activation (only weights are per channel)",
                ));
            }
            let (scale, zero_point) = (s[0] as f32, z[0] as i32);
            if qn.shape.dtype() != DType::I8 {
                return Err(self.err(id, "is quantized to u8 (the integer ops take int8)"));
            }
            self.produce(src, scale, zero_point)?
        } else {
            match &n.op {
                Op::Reshape { .. } => {
                    let x = self.int(n.inputs[0])?;
                    let dims = n.shape.static_dims().unwrap_or_default();
                    IntVal {
                        id: self.out.try_reshape(x.id, &dims)?,
                        ..x
                    }
                }
                Op::Pool(a) if a.kernel.len() == 2 => {
                    let x = self.int(n.inputs[0])?;
                    let pool = QPool {
                        kind: a.kind,
                        kernel: [a.kernel[0], a.kernel[1]],
                        stride: [a.stride[0], a.stride[1]],
                        padding: [a.padding[0], a.padding[1]],
                    };
                    IntVal {
                        id: self.out.try_op(Op::defined(pool), &[x.id])?,
                        ..x
                    }
                }
                _ => return Err(self.err(id, "has no int8 form")),
            }
        };
        self.done.insert(id, v);
        Ok(v)
    }

    /// The int8 value of float node `t` quantized with `(scale, zp)` (the tap's parameters).
    fn produce(&mut self, t: NodeId, scale: f32, zp: i32) -> Result<IntVal> {
        let n = self.q.node(t).clone();
        if matches!(n.op, Op::Input { .. }) {
            let x = self.leaf(t);
            let e = activation_params(scale, zp);
            let (s, z) = params(&mut self.out, &e, n.shape.dtype())?;
            let id = self
                .out
                .try_op(Op::defined(Quantize { axis: None }), &[x, s, z])?;
            return Ok(IntVal {
                id,
                scale,
                zero_point: zp,
            });
        }
        let (body, relu) = match n.op {
            Op::Activation(Activation::Relu) => (n.inputs[0], true),
            _ => (t, false),
        };
        let out = QOut {
            zero_point: zp,
            lo: if relu { zp } else { -128 },
            hi: 127,
        };
        let bn = self.q.node(body).clone();
        // A product, or a product plus a constant bias.
        let (prod, bias) = match bn.op {
            Op::Binary(BinaryOp::Add) => {
                let [a, b] = [bn.inputs[0], bn.inputs[1]];
                match (constant(self.q, a), constant(self.q, b)) {
                    (None, Some(c)) => (a, Some(c)),
                    (Some(c), None) => (b, Some(c)),
                    (None, None) => return self.qadd(body, a, b, scale, out),
                    (Some(_), Some(_)) => return Err(self.err(body, "adds two constants")),
                }
            }
            _ => (body, None),
        };
        let pn = self.q.node(prod).clone();
        let (x, w) = (pn.inputs.first().copied(), pn.inputs.get(1).copied());
        let (Some(x), Some(w)) = (x, w) else {
            return Err(self.err(prod, "has no int8 form"));
        };
        match &pn.op {
            Op::MatMul | Op::Conv(_) => {}
            _ => return Err(self.err(prod, "has no int8 form")),
        }
        let xi = self.int(x)?;
        let Some((wq, ws, _, Some(waxis))) = dequantized(self.q, w) else {
            return Err(self.err(
                w,
                "is a weight that is not a per-channel quantized constant",
            ));
        };
        // The weight's int8 values: its quantize node evaluated.
        let wn = self.q.node(wq);
        let wc = constant(self.q, wn.inputs[0])
            .ok_or_else(|| self.err(w, "is a weight that is not a constant"))?;
        let leaves: BTreeMap<String, Tensor> = BTreeMap::new();
        let mut wg = Graph::new("weight");
        let c0 = wg.try_constant_bytes(wc.shape(), wc.to_bytes())?;
        let ps: Vec<NodeId> = wn.inputs[1..]
            .iter()
            .map(|&p| {
                let v = constant(self.q, p).ok_or_else(|| self.err(p, "is not a constant"))?;
                wg.try_constant_bytes(v.shape(), v.to_bytes())
            })
            .collect::<Result<_>>()?;
        let qw = wg.try_op(wn.op.clone(), &[c0, ps[0], ps[1]])?;
        wg.set_outputs_unchecked(vec![qw]);
        let wi = evaluate(&wg, &leaves)?.remove(0);
        let channels = ws.len();
        // The int32 bias and the requantization per output channel.
        let bias_vals = match &bias {
            Some(b) if b.numel() == channels => b.f64s(),
            Some(b) => {
                return Err(self.err(
                    body,
                    &format!(
                        "has a bias of dims {:?} for {channels} output channels",
                        b.dims()
                    ),
                ))
            }
            None => vec![0.0; channels],
        };
        let mut bias_i = Vec::with_capacity(channels);
        let (mut mult, mut shift) = (Vec::with_capacity(channels), Vec::with_capacity(channels));
        for (c, &sw) in ws.iter().enumerate() {
            let acc_scale = xi.scale as f64 * sw;
            bias_i.push(
                (bias_vals[c] / acc_scale)
                    .round()
                    .clamp(i32::MIN as f64, i32::MAX as f64) as i64,
            );
            let (m, s) = quantize_multiplier(acc_scale / scale as f64).ok_or_else(|| {
                self.err(
                    prod,
                    &format!(
                        "needs a requantization factor {} out of range",
                        acc_scale / scale as f64
                    ),
                )
            })?;
            mult.push(m as i64);
            shift.push(s as i64);
        }
        let (bias_id, mult_id, shift_id) =
            (self.i32s(bias_i)?, self.i32s(mult)?, self.i32s(shift)?);
        let wdims = wi.dims().to_vec();
        let id = match &pn.op {
            Op::MatMul => {
                if waxis != 1 || wdims.len() != 2 {
                    return Err(self.err(w, "is not a [K, N] weight quantized along N"));
                }
                // [K, N] to the kernels' [N, K].
                let (k, nn) = (wdims[0], wdims[1]);
                let v = wi.i64s();
                let t: Vec<i64> = (0..nn)
                    .flat_map(|j| (0..k).map(move |i| (i, j)))
                    .map(|(i, j)| v[i * nn + j])
                    .collect();
                let wt = Tensor::from_i64(&[nn, k], DType::I8, t);
                let wid = self.out.try_constant_bytes(wt.shape(), wt.to_bytes())?;
                let op = QLinear {
                    x_zero_point: xi.zero_point,
                    out,
                };
                self.out
                    .try_op(Op::defined(op), &[xi.id, wid, bias_id, mult_id, shift_id])?
            }
            Op::Conv(a) => {
                if waxis != 0
                    || a.stride.len() != 2
                    || a.groups != 1
                    || a.dilation.iter().any(|&d| d != 1)
                {
                    return Err(
                        self.err(prod, "is not a 2-D convolution without groups or dilation")
                    );
                }
                let wid = self.out.try_constant_bytes(wi.shape(), wi.to_bytes())?;
                let op = QConv2d {
                    stride: [a.stride[0], a.stride[1]],
                    padding: [a.padding[0], a.padding[1]],
                    x_zero_point: xi.zero_point,
                    out,
                };
                self.out
                    .try_op(Op::defined(op), &[xi.id, wid, bias_id, mult_id, shift_id])?
            }
            _ => return Err(self.err(prod, "has no int8 form")),
        };
        Ok(IntVal {
            id,
            scale,
            zero_point: zp,
        })
    }

    fn qadd(&mut self, at: NodeId, a: NodeId, b: NodeId, scale: f32, out: QOut) -> Result<IntVal> {
        let (ai, bi) = (self.int(a)?, self.int(b)?);
        if self.q.shape(a) != self.q.shape(b) {
            return Err(self.err(at, "adds values of different shapes"));
        }
        let twice_max = 2.0 * (ai.scale.max(bi.scale) as f64);
        let q = |r: f64| {
            quantize_multiplier(r)
                .ok_or_else(|| self.err(at, &format!("needs a rescale factor {r} out of range")))
        };
        let op = QAdd {
            a_zero_point: ai.zero_point,
            b_zero_point: bi.zero_point,
            a_scale: q(ai.scale as f64 / twice_max)?,
            b_scale: q(bi.scale as f64 / twice_max)?,
            out_scale: q(twice_max / ((1u64 << QADD_LEFT_SHIFT) as f64 * scale as f64))?,
            out,
        };
        let id = self.out.try_op(Op::defined(op), &[ai.id, bi.id])?;
        Ok(IntVal {
            id,
            scale,
            zero_point: out.zero_point,
        })
    }
}

fn activation_params(scale: f32, zp: i32) -> CalibrationEntry {
    CalibrationEntry {
        axis: None,
        scale: vec![scale],
        zero_point: vec![zp as i8],
        min: vec![(-128 - zp) as f32 * scale],
        max: vec![(127 - zp) as f32 * scale],
    }
}

/// The integer graph of QDQ graph `qdq` (from [`insert_q_dq`]): every value between the
/// quantized inputs and the outputs as int8 through the integer ops; each float output is the
/// `dequantize` of its int8 value.
pub fn quant_propagate(qdq: &Graph) -> Result<Graph> {
    let mut f = Fold {
        q: qdq,
        out: Graph::new(qdq.name()),
        done: HashMap::new(),
        leaves: HashMap::new(),
    };
    let mut outs = Vec::new();
    for &o in qdq.outputs() {
        if !is_float(qdq, o) {
            return Err(f.err(o, "is an output that is not a float value"));
        }
        let v = f.int(o)?;
        let e = activation_params(v.scale, v.zero_point);
        let (s, z) = params(&mut f.out, &e, qdq.shape(o).dtype())?;
        outs.push(
            f.out
                .try_op(Op::defined(Dequantize { axis: None }), &[v.id, s, z])?,
        );
    }
    let mut out = f.out;
    out.set_outputs_unchecked(outs);
    rlx_ir::verify(&out)?;
    Ok(out)
}

/// [`quant_propagate`] as a pass (a QDQ graph in, its integer graph out), for pipelines and
/// file tests. Counts the integer ops it emitted.
pub struct QuantPropagate;

impl crate::Pass for QuantPropagate {
    fn name(&self) -> &str {
        "quant_propagate"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        let out = quant_propagate(g)?;
        let n = out
            .nodes()
            .iter()
            .filter(|n| matches!(&n.op, Op::Defined(d) if ["qlinear", "qconv2d", "qadd", "qpool"].contains(&d.name())))
            .count();
        Ok((out, n))
    }
}

/// The int8 part of an integer graph, as the edge targets run it: an `i8` input (the model's
/// quantized input), the integer ops, and the `i8` output (before its dequantization), with the
/// quantization of both ends.
#[derive(Clone, Debug)]
pub struct IntegerCore {
    /// Input `i8` (named as the float input was), integer ops, one `i8` output.
    pub graph: Graph,
    /// The input's scale and zero point (`q = round(x / scale) + zero_point`).
    pub input: (f32, i32),
    /// The output's scale and zero point (`y = (q - zero_point) · scale`).
    pub output: (f32, i32),
}

/// The [`IntegerCore`] of integer graph `g` (from [`quant_propagate`]): `g` must have one float
/// input, read only by a per-tensor `quantize` to int8, and one output, the per-tensor
/// `dequantize` of an int8 value.
pub fn integer_core(g: &Graph) -> Result<IntegerCore> {
    let bad =
        |why: String| Error::Invalid(format!("integer_core of graph \"{}\": {why}", g.name()));
    let inputs = g.inputs();
    let [(name, x)] = inputs[..] else {
        return Err(bad(format!("needs one input, has {}", inputs.len())));
    };
    let cons = consumers(g);
    let quant = match cons[x.index()][..] {
        [q] => q,
        _ => {
            return Err(bad(format!(
                "input \"{name}\" ({x}) must be read by one quantize only"
            )))
        }
    };
    let per_tensor = |id: NodeId| -> Option<(f32, i32)> {
        let n = g.node(id);
        let Op::Defined(d) = &n.op else { return None };
        let axis_none = d
            .downcast::<Quantize>()
            .map(|q| q.axis.is_none())
            .or_else(|| d.downcast::<Dequantize>().map(|q| q.axis.is_none()))?;
        let s = constant(g, n.inputs[1])?.f64s();
        let z = constant(g, n.inputs[2])?.i64s();
        (axis_none && s.len() == 1 && g.shape(n.inputs[2]).dtype() == DType::I8)
            .then(|| (s[0] as f32, z[0] as i32))
    };
    let is = |id: NodeId, name: &str| g.node(id).op.name() == name;
    let input = per_tensor(quant)
        .filter(|_| is(quant, "quantize"))
        .ok_or_else(|| {
            bad(format!(
                "input \"{name}\" is read by {} ({quant}), not a per-tensor int8 quantize",
                g.node(quant).op.name()
            ))
        })?;
    let [o] = g.outputs()[..] else {
        return Err(bad(format!("needs one output, has {}", g.outputs().len())));
    };
    let output = per_tensor(o)
        .filter(|_| is(o, "dequantize"))
        .ok_or_else(|| {
            bad(format!(
                "output {o} ({}) is not a per-tensor int8 dequantize",
                g.node(o).op.name()
            ))
        })?;
    let mut out = Graph::new(g.name());
    let mut new: Vec<Option<NodeId>> = vec![None; g.len()];
    for id in g.ids() {
        let n = g.node(id);
        if id == x || id == o {
            continue;
        }
        if id == quant {
            new[id.index()] = Some(out.try_input(name, n.shape.clone())?);
            continue;
        }
        let ins: Option<Vec<NodeId>> = n.inputs.iter().map(|i| new[i.index()]).collect();
        let Some(ins) = ins else { continue };
        new[id.index()] = Some(out.push_unchecked(n.op.clone(), ins, n.shape.clone()));
    }
    let y = new[g.node(o).inputs[0].index()]
        .ok_or_else(|| bad("the output does not depend on the input".into()))?;
    out.set_outputs_unchecked(vec![y]);
    let (out, _) = crate::Pass::run(&crate::DeadCodeElimination, &out)?;
    rlx_ir::verify(&out)?;
    Ok(IntegerCore {
        graph: out,
        input,
        output,
    })
}
