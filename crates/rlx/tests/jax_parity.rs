//! RLX's transforms on whole graphs, checked against JAX.
//!
//! `golden/jax_parity.json` is written by `golden/gen_jax_parity.py` (regenerate with
//! `scripts/regen-goldens.sh`): for each scenario it holds the inputs and params and what JAX's
//! transforms compute (`value_and_grad`, `jvp` of `grad`, `vmap` of `grad`, repeated `grad`,
//! `jvp`), all in float64. Each test builds the same computation as an RLX graph, applies the
//! matching RLX transform (`grad_with_loss`, `hvp`, `vmap` of `grad`, `nth_order_grad`, `jvp`),
//! runs it on the CPU in f64 and compares every element.
//!
//! Tolerance: `|got - want| <= rtol * (|want| + max|want|)` per tensor, i.e. relative to the
//! element with a floor at the tensor's scale (gradients that cancel to nearly zero are compared
//! at the scale of their tensor). Both sides compute the same math in f64, so `rtol` is 1e-9.

mod common;

use common::{decode, encode};
use rlx::autodiff::{grad, grad_with_loss, hvp, jvp, nth_order_grad, tangent_name, vmap, D_OUTPUT};
use rlx::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::OnceLock;

const F: DType = DType::F64;
/// Same math in f64 on both sides: only rounding differs.
const RTOL: f64 = 1e-9;

// ------------------------------------------------------------------ golden file

struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    data: Vec<f64>,
}

struct Scenario {
    name: String,
    config: Value,
    inputs: BTreeMap<String, Tensor>,
    expected: BTreeMap<String, Tensor>,
}

impl Scenario {
    fn input(&self, name: &str) -> &Tensor {
        self.inputs.get(name).unwrap_or_else(|| {
            panic!(
                "{}: no input tensor \"{name}\" in the golden file",
                self.name
            )
        })
    }
    fn want(&self, name: &str) -> &Tensor {
        self.expected.get(name).unwrap_or_else(|| {
            panic!(
                "{}: no expected tensor \"{name}\" in the golden file",
                self.name
            )
        })
    }
    fn cfg_f64(&self, key: &str) -> f64 {
        self.config[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{}: config {key}", self.name))
    }
    fn cfg_usize(&self, key: &str) -> usize {
        self.config[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: config {key}", self.name)) as usize
    }
    /// An f32 attribute (norm eps, attention scale): the generator stores f32 values exactly.
    fn cfg_f32(&self, key: &str) -> f32 {
        let v = self.cfg_f64(key);
        assert_eq!(
            v as f32 as f64, v,
            "{}: config {key} = {v} is not an f32 value",
            self.name
        );
        v as f32
    }
}

fn tensor(v: &Value) -> Tensor {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect();
    let dtype = DType::from_name(v["dtype"].as_str().expect("dtype")).expect("known dtype");
    let data: Vec<f64> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect();
    assert_eq!(
        data.len(),
        shape.iter().product::<usize>(),
        "tensor data does not match its shape {shape:?}"
    );
    Tensor { shape, dtype, data }
}

fn golden() -> &'static Value {
    static FILE: OnceLock<Value> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/jax_parity.json");
        let text = std::fs::read_to_string(path).expect("golden file jax_parity.json");
        serde_json::from_str(&text).expect("golden json")
    })
}

fn scenario(name: &str) -> Scenario {
    let s = &golden()["scenarios"][name];
    assert!(
        s.is_object(),
        "scenario {name} missing from jax_parity.json"
    );
    let map = |v: &Value| {
        v.as_object()
            .expect("object")
            .iter()
            .map(|(k, t)| (k.clone(), tensor(t)))
            .collect()
    };
    Scenario {
        name: name.into(),
        config: s["config"].clone(),
        inputs: map(&s["inputs"]),
        expected: map(&s["expected"]),
    }
}

// ------------------------------------------------------------------ graph and run helpers

fn input(g: &mut Graph, s: &Scenario, name: &str) -> NodeId {
    let t = s.input(name);
    g.input(name, Shape::new(&t.shape, t.dtype))
}

fn param(g: &mut Graph, s: &Scenario, name: &str) -> NodeId {
    let t = s.input(name);
    g.param(name, Shape::new(&t.shape, t.dtype))
}

fn sum_all(g: &mut Graph, x: NodeId) -> NodeId {
    let axes: Vec<usize> = (0..g.shape(x).rank()).collect();
    g.sum(x, &axes, false)
}

fn mean_all(g: &mut Graph, x: NodeId) -> NodeId {
    let axes: Vec<usize> = (0..g.shape(x).rank()).collect();
    g.mean(x, &axes, false)
}

fn linear(g: &mut Graph, x: NodeId, w: NodeId, b: NodeId) -> NodeId {
    let y = g.dot(x, w);
    g.add(y, b)
}

/// Compile `graph`, set `params` from the scenario, feed `inputs` (scenario tensors, renamed
/// where the pair says so) and `extra` (name, values), and run.
fn run(
    graph: Graph,
    s: &Scenario,
    params: &[&str],
    inputs: &[(&str, &str)],
    extra: &[(&str, Vec<f64>)],
) -> Vec<Vec<f64>> {
    let out_shapes: Vec<Shape> = graph
        .outputs()
        .iter()
        .map(|&o| graph.shape(o).clone())
        .collect();
    let mut c = Session::new(Device::Cpu).compile(graph);
    for p in params {
        let t = s.input(p);
        c.set_param_typed(p, &encode(&t.data, t.dtype), t.dtype);
    }
    let mut feeds: Vec<(String, Vec<u8>, DType)> = Vec::new();
    for (graph_name, tensor_name) in inputs {
        let t = s.input(tensor_name);
        feeds.push((graph_name.to_string(), encode(&t.data, t.dtype), t.dtype));
    }
    for (name, v) in extra {
        feeds.push((name.to_string(), encode(v, F), F));
    }
    let f: Vec<(&str, &[u8], DType)> = feeds
        .iter()
        .map(|(n, b, d)| (n.as_str(), b.as_slice(), *d))
        .collect();
    let outs = c.run_typed(&f);
    assert_eq!(outs.len(), out_shapes.len(), "{}: output count", s.name);
    outs.iter()
        .zip(&out_shapes)
        .map(|((bytes, dt), shape)| {
            assert_eq!(*dt, F, "{}: output dtype", s.name);
            let v = decode(bytes, *dt);
            assert_eq!(
                Some(v.len()),
                shape.numel(),
                "{}: output size vs its shape {shape}",
                s.name
            );
            v
        })
        .collect()
}

/// Compare `got` (of shape `got_shape`, when known) with the scenario's expected tensor `what`,
/// element by element; prints and returns `(max abs error, max rel error)`.
fn compare(
    s: &Scenario,
    what: &str,
    got_shape: Option<&[usize]>,
    got: &[f64],
    rtol: f64,
) -> (f64, f64) {
    compare_as(s, what, what, got_shape, got, rtol)
}

/// [`compare`], reported under `label`.
fn compare_as(
    s: &Scenario,
    what: &str,
    label: &str,
    got_shape: Option<&[usize]>,
    got: &[f64],
    rtol: f64,
) -> (f64, f64) {
    let want = s.want(what);
    if let Some(shape) = got_shape {
        assert_eq!(
            shape,
            want.shape.as_slice(),
            "{}/{label}: RLX shape vs JAX shape",
            s.name
        );
    }
    assert_eq!(
        got.len(),
        want.data.len(),
        "{}/{label}: RLX gives {} values, JAX {}",
        s.name,
        got.len(),
        want.data.len()
    );
    let scale = want.data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    let mut bad = Vec::new();
    for (i, (g, w)) in got.iter().zip(&want.data).enumerate() {
        let err = (g - w).abs();
        max_abs = max_abs.max(err);
        if *w != 0.0 {
            max_rel = max_rel.max(err / w.abs());
        }
        #[allow(clippy::neg_cmp_op_on_partial_ord)] // NaN must fail
        if !(err <= rtol * (w.abs() + scale)) {
            bad.push(format!("  [{i}] rlx {g:e} jax {w:e} (diff {err:.3e})"));
        }
    }
    eprintln!("{:<22} {label:<20} n={:<4} max_abs={max_abs:.2e} max_rel={max_rel:.2e} (scale {scale:.2e})", s.name, got.len());
    assert!(
        bad.is_empty(),
        "{}/{label}: {} of {} elements differ from JAX beyond rtol {rtol:e} (scale {scale:e}):\n{}",
        s.name,
        bad.len(),
        got.len(),
        bad.iter().take(12).cloned().collect::<Vec<_>>().join("\n")
    );
    (max_abs, max_rel)
}

fn out_dims(g: &Graph, i: usize) -> Vec<usize> {
    g.shape(g.outputs()[i])
        .static_dims()
        .expect("static output shape")
}

/// `grad_with_loss` of `g` (loss = its first output) w.r.t. `wrt` (names of params or
/// inputs), run with cotangent 1 and compared with `loss` and `grad_<name>` of the scenario.
fn check_loss_and_grads(
    s: &Scenario,
    g: &Graph,
    wrt: &[&str],
    params: &[&str],
    inputs: &[&str],
    rtol: f64,
) {
    let ids: Vec<NodeId> = wrt
        .iter()
        .map(|n| g.find_leaf(n).unwrap_or_else(|| panic!("no leaf {n}")))
        .collect();
    let gg = grad_with_loss(g, &ids).expect("grad_with_loss");
    assert_eq!(gg.outputs().len(), 1 + wrt.len());
    let shapes: Vec<Vec<usize>> = (0..gg.outputs().len()).map(|i| out_dims(&gg, i)).collect();
    let feeds: Vec<(&str, &str)> = inputs.iter().map(|n| (*n, *n)).collect();
    let outs = run(gg, s, params, &feeds, &[(D_OUTPUT, vec![1.0])]);
    compare(s, "loss", Some(&shapes[0]), &outs[0], rtol);
    for (i, n) in wrt.iter().enumerate() {
        compare(
            s,
            &format!("grad_{n}"),
            Some(&shapes[1 + i]),
            &outs[1 + i],
            rtol,
        );
    }
    // The untransformed graph runs the native kernels (not the decompositions autodiff
    // differentiates): its loss must agree as well.
    let fwd = run(g.clone(), s, params, &feeds, &[]);
    compare_as(
        s,
        "loss",
        "loss (forward)",
        Some(&out_dims(g, 0)),
        &fwd[0],
        rtol,
    );
}

// ------------------------------------------------------------------ model pieces

/// 2-layer tanh MLP with MSE loss (scenarios a and f).
fn mlp_graph(s: &Scenario) -> Graph {
    let mut g = Graph::new("mlp_mse");
    let x = input(&mut g, s, "x");
    let y = input(&mut g, s, "y");
    let w1 = param(&mut g, s, "w1");
    let b1 = param(&mut g, s, "b1");
    let w2 = param(&mut g, s, "w2");
    let b2 = param(&mut g, s, "b2");
    let h = linear(&mut g, x, w1, b1);
    let h = g.activation(Activation::Tanh, h);
    let out = linear(&mut g, h, w2, b2);
    let d = g.sub(out, y);
    let sq = g.mul(d, d);
    let loss = mean_all(&mut g, sq);
    g.set_outputs(vec![loss]);
    g
}

/// `x [B, S, H*D]` -> `[B, H, S, D]`.
fn split_heads(g: &mut Graph, t: NodeId, heads: usize) -> NodeId {
    let d = g.shape(t).static_dims().unwrap();
    let r = g.reshape(t, &[d[0], d[1], heads, d[2] / heads]);
    g.transpose(r, &[0, 2, 1, 3])
}

/// `[B, H, S, D]` -> `[B, S, H*D]`.
fn merge_heads(g: &mut Graph, t: NodeId) -> NodeId {
    let d = g.shape(t).static_dims().unwrap();
    let tr = g.transpose(t, &[0, 2, 1, 3]);
    g.reshape(tr, &[d[0], d[2], d[1] * d[3]])
}

/// Causal self-attention with q/k/v projections of `x` (no output projection).
#[allow(clippy::too_many_arguments)]
fn self_attention(
    g: &mut Graph,
    x: NodeId,
    wq: NodeId,
    wk: NodeId,
    wv: NodeId,
    hq: usize,
    hkv: usize,
    scale: f32,
) -> NodeId {
    let q = g.dot(x, wq);
    let k = g.dot(x, wk);
    let v = g.dot(x, wv);
    let q = split_heads(g, q, hq);
    let k = split_heads(g, k, hkv);
    let v = split_heads(g, v, hkv);
    let a = g.attention(q, k, v, MaskKind::Causal, scale);
    merge_heads(g, a)
}

// ------------------------------------------------------------------ scenarios

/// (a) MLP + MSE: loss and grads w.r.t. all weights and biases.
#[test]
fn a_mlp_mse_grads() {
    let s = scenario("mlp_mse");
    let g = mlp_graph(&s);
    let p = ["w1", "b1", "w2", "b2"];
    check_loss_and_grads(&s, &g, &p, &p, &["x", "y"], RTOL);
}

/// (b) Softmax cross-entropy with integer labels, built from ops.
#[test]
fn b_softmax_cross_entropy_grads() {
    rlx_cpu::isa::for_each_level(|_| {
        let s = scenario("softmax_xent");
        let c = s.cfg_usize("classes");
        let n = s.input("labels").shape[0];
        assert_eq!(s.input("labels").dtype, DType::I64);
        let mut g = Graph::new("softmax_xent");
        let x = input(&mut g, &s, "x");
        let labels = input(&mut g, &s, "labels");
        let w = param(&mut g, &s, "w");
        let b = param(&mut g, &s, "b");
        let logits = linear(&mut g, x, w, b);
        // log-softmax: z - log(sum(exp(z))), z = x - max(x)
        let m = g.reduce(ReduceKind::Max, logits, &[1], true);
        let z = g.sub(logits, m);
        let e = g.activation(Activation::Exp, z);
        let se = g.sum(e, &[1], true);
        let lse = g.activation(Activation::Log, se);
        let logp = g.sub(z, lse);
        // one-hot of the labels: labels[:, None] == iota(C)
        let iota: Vec<f64> = (0..c).map(|i| i as f64).collect();
        let iota = g.constant_bytes(Shape::new(&[c], DType::I64), encode(&iota, DType::I64));
        let lab = g.reshape(labels, &[n, 1]);
        let hit = g.compare(CmpOp::Eq, lab, iota);
        let onehot = g.cast(hit, F);
        let picked = g.mul(onehot, logp);
        let picked = g.sum(picked, &[1], false);
        let nll = g.mean(picked, &[0], false);
        let loss = g.activation(Activation::Neg, nll);
        g.set_outputs(vec![loss]);
        check_loss_and_grads(
            &s,
            &g,
            &["x", "w", "b"],
            &["w", "b"],
            &["x", "labels"],
            RTOL,
        );
    });
}

/// (c) LayerNorm + exact GELU, loss = sum(y * r): grads w.r.t. input, gamma, beta.
#[test]
fn c_layernorm_gelu_grads() {
    rlx_cpu::isa::for_each_level(|_| {
        let s = scenario("layernorm_gelu");
        let eps = s.cfg_f32("eps");
        let mut g = Graph::new("layernorm_gelu");
        let x = input(&mut g, &s, "x");
        let r = input(&mut g, &s, "r");
        let gamma = param(&mut g, &s, "gamma");
        let beta = param(&mut g, &s, "beta");
        let y = g.layer_norm(x, gamma, beta, eps);
        let y = g.activation(Activation::Gelu, y);
        let yr = g.mul(y, r);
        let loss = sum_all(&mut g, yr);
        g.set_outputs(vec![loss]);
        check_loss_and_grads(
            &s,
            &g,
            &["x", "gamma", "beta"],
            &["gamma", "beta"],
            &["x", "r"],
            RTOL,
        );
    });
}

fn attention_case(name: &str) {
    let s = scenario(name);
    let (hq, hkv, scale) = (
        s.cfg_usize("q_heads"),
        s.cfg_usize("kv_heads"),
        s.cfg_f32("scale"),
    );
    let mut g = Graph::new(name);
    let x = input(&mut g, &s, "x");
    let r = input(&mut g, &s, "r");
    let wq = param(&mut g, &s, "wq");
    let wk = param(&mut g, &s, "wk");
    let wv = param(&mut g, &s, "wv");
    let o = self_attention(&mut g, x, wq, wk, wv, hq, hkv, scale);
    let or = g.mul(o, r);
    let loss = sum_all(&mut g, or);
    g.set_outputs(vec![loss]);
    check_loss_and_grads(
        &s,
        &g,
        &["x", "wq", "wk", "wv"],
        &["wq", "wk", "wv"],
        &["x", "r"],
        RTOL,
    );
}

/// (d) Causal self-attention (2 heads) with q/k/v projections of x: grads w.r.t. x and the
/// projection weights.
#[test]
fn d_causal_attention_grads() {
    rlx_cpu::isa::for_each_level(|_| {
        attention_case("causal_attention");
    });
}

/// (d') The same with grouped-query attention: 4 query heads sharing 2 kv heads.
#[test]
fn d_causal_attention_grouped_query_grads() {
    rlx_cpu::isa::for_each_level(|_| {
        attention_case("causal_attention_gqa");
    });
}

const TRANSFORMER_PARAMS: [&str; 9] = ["g1", "wq", "wk", "wv", "wo", "g2", "wg", "wu", "wd"];

/// Pre-norm transformer block: RMSNorm, causal attention, residual, SwiGLU MLP, residual;
/// loss = mean(out^2) (scenarios e and f').
fn transformer_graph(s: &Scenario) -> Graph {
    let (heads, eps, scale) = (s.cfg_usize("heads"), s.cfg_f32("eps"), s.cfg_f32("scale"));
    let mut g = Graph::new("transformer_block");
    let x = input(&mut g, s, "x");
    let p: BTreeMap<&str, NodeId> = TRANSFORMER_PARAMS
        .iter()
        .map(|n| (*n, param(&mut g, s, n)))
        .collect();
    let n1 = g.rms_norm(x, p["g1"], eps);
    let a = self_attention(&mut g, n1, p["wq"], p["wk"], p["wv"], heads, heads, scale);
    let a = g.dot(a, p["wo"]);
    let h = g.add(x, a);
    let n2 = g.rms_norm(h, p["g2"], eps);
    let gate = g.dot(n2, p["wg"]);
    let gate = g.activation(Activation::Silu, gate);
    let up = g.dot(n2, p["wu"]);
    let gu = g.mul(gate, up);
    let m = g.dot(gu, p["wd"]);
    let out = g.add(h, m);
    let sq = g.mul(out, out);
    let loss = mean_all(&mut g, sq);
    g.set_outputs(vec![loss]);
    g
}

/// (e) Pre-norm transformer block (2 heads): grads w.r.t. every param.
#[test]
fn e_transformer_block_grads() {
    rlx_cpu::isa::for_each_level(|_| {
        let s = scenario("transformer_block");
        let g = transformer_graph(&s);
        check_loss_and_grads(
            &s,
            &g,
            &TRANSFORMER_PARAMS,
            &TRANSFORMER_PARAMS,
            &["x"],
            RTOL,
        );
    });
}

/// (f) Hessian-vector product of (a)'s loss w.r.t. w1 along a fixed v, vs
/// `jax.jvp(jax.grad(f), (w1,), (v,))`.
#[test]
fn f_mlp_hessian_vector_product() {
    let s = scenario("mlp_hvp");
    let g = mlp_graph(&s);
    let w1 = g.find_leaf("w1").unwrap();
    let hg = hvp(&g, &[w1]).expect("hvp");
    assert_eq!(hg.outputs().len(), 3, "hvp outputs [loss, grad, hvp]");
    let shapes: Vec<Vec<usize>> = (0..3).map(|i| out_dims(&hg, i)).collect();
    let v = s.input("v").data.clone();
    let outs = run(
        hg,
        &s,
        &["w1", "b1", "w2", "b2"],
        &[("x", "x"), ("y", "y")],
        &[(&tangent_name("w1"), v)],
    );
    compare(&s, "loss", Some(&shapes[0]), &outs[0], RTOL);
    compare(&s, "grad_w1", Some(&shapes[1]), &outs[1], RTOL);
    compare(&s, "hvp_w1", Some(&shapes[2]), &outs[2], RTOL);
}

/// (g) Per-example gradients: `vmap` over the examples of the `grad` graph of a single-example
/// loss (linear model + squared error, params shared), vs
/// `jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))`.
#[test]
fn g_per_example_grads_by_vmap_of_grad() {
    let s = scenario("per_example_grads");
    let batch = s.cfg_usize("batch");
    let (xt, yt) = (s.input("x"), s.input("y"));
    assert_eq!((xt.shape[0], yt.shape[0]), (batch, batch));
    let (d_in, d_out) = (xt.shape[1], yt.shape[1]);
    // One example: x [d_in], y [d_out].
    let mut g = Graph::new("linear_sq_err");
    let x = g.input("x", Shape::new(&[d_in], F));
    let y = g.input("y", Shape::new(&[d_out], F));
    let w = param(&mut g, &s, "w");
    let b = param(&mut g, &s, "b");
    let xr = g.reshape(x, &[1, d_in]);
    let pred = g.dot(xr, w);
    let pred = g.reshape(pred, &[d_out]);
    let pred = g.add(pred, b);
    let d = g.sub(pred, y);
    let sq = g.mul(d, d);
    let loss = g.sum(sq, &[0], false);
    g.set_outputs(vec![loss]);
    let gg = grad(&g, &[w, b]).expect("grad");
    let vg = vmap(&gg, &["x", "y"], batch).expect("vmap of the grad graph");
    assert_eq!(vg.outputs().len(), 2);
    let shapes: Vec<Vec<usize>> = (0..2).map(|i| out_dims(&vg, i)).collect();
    let outs = run(vg, &s, &["w", "b"], &[("x", "x"), ("y", "y")], &[]);
    compare(&s, "grad_w", Some(&shapes[0]), &outs[0], RTOL);
    compare(&s, "grad_b", Some(&shapes[1]), &outs[1], RTOL);
}

/// (h) Third derivatives of scalar functions at a few points by `nth_order_grad(.., 3)`, vs
/// `jax.grad(jax.grad(jax.grad(f)))`.
#[test]
fn h_third_order_derivatives() {
    let s = scenario("third_derivative");
    let points = s.input("points").data.clone();
    type Build = fn(&mut Graph, NodeId) -> NodeId;
    let fns: [(&str, Build); 2] = [
        // sin(x) * exp(x / 2) + x^4
        ("sin_exp_pow", |g, x| {
            let sx = g.activation(Activation::Sin, x);
            let half = g.scalar(0.5, F);
            let xh = g.mul(x, half);
            let ex = g.activation(Activation::Exp, xh);
            let a = g.mul(sx, ex);
            let four = g.scalar(4.0, F);
            let x4 = g.pow(x, four);
            g.add(a, x4)
        }),
        // tanh(x) * x
        ("tanh_x", |g, x| {
            let t = g.activation(Activation::Tanh, x);
            g.mul(t, x)
        }),
    ];
    for (name, build) in fns {
        let mut g = Graph::new(name);
        let x = g.input("x", Shape::new(&[], F));
        let y = build(&mut g, x);
        g.set_outputs(vec![y]);
        let d3 = nth_order_grad(&g, x, 3).expect("nth_order_grad");
        assert_eq!(d3.outputs().len(), 1);
        assert_eq!(
            out_dims(&d3, 0),
            Vec::<usize>::new(),
            "third derivative of a scalar is a scalar"
        );
        let (mut f_vals, mut d3_vals) = (Vec::new(), Vec::new());
        for &p in &points {
            f_vals.push(run(g.clone(), &s, &[], &[], &[("x", vec![p])])[0][0]);
            d3_vals.push(run(d3.clone(), &s, &[], &[], &[("x", vec![p])])[0][0]);
        }
        compare(&s, &format!("f_{name}"), None, &f_vals, RTOL);
        compare(&s, &format!("d3_{name}"), None, &d3_vals, RTOL);
    }
}

/// (i) Forward mode: `jvp` of a small MLP's vector output w.r.t. its input, vs `jax.jvp`.
#[test]
fn i_mlp_jvp_wrt_input() {
    let s = scenario("mlp_jvp");
    let mut g = Graph::new("mlp_jvp");
    let x = input(&mut g, &s, "x");
    let w1 = param(&mut g, &s, "w1");
    let b1 = param(&mut g, &s, "b1");
    let w2 = param(&mut g, &s, "w2");
    let b2 = param(&mut g, &s, "b2");
    let h = linear(&mut g, x, w1, b1);
    let h = g.activation(Activation::GeluApprox, h);
    let y = linear(&mut g, h, w2, b2);
    g.set_outputs(vec![y]);
    let jg = jvp(&g, &["x"]).expect("jvp");
    assert_eq!(jg.outputs().len(), 2, "jvp outputs [primal, tangent]");
    let shapes: Vec<Vec<usize>> = (0..2).map(|i| out_dims(&jg, i)).collect();
    let tx = tangent_name("x");
    let outs = run(
        jg,
        &s,
        &["w1", "b1", "w2", "b2"],
        &[("x", "x"), (&tx, "tangent_x")],
        &[],
    );
    compare(&s, "y", Some(&shapes[0]), &outs[0], RTOL);
    compare(&s, "tangent_y", Some(&shapes[1]), &outs[1], RTOL);
}

/// (f') Hessian-vector product of (e)'s loss w.r.t. three params at once (forward-over-reverse
/// through attention, RMSNorm and SwiGLU), vs `jax.jvp` of `jax.grad`.
#[test]
fn f_transformer_hessian_vector_product() {
    let s = scenario("transformer_hvp");
    let g = transformer_graph(&s);
    let wrt = ["wq", "g2", "wd"];
    let ids: Vec<NodeId> = wrt.iter().map(|n| g.find_leaf(n).unwrap()).collect();
    let hg = hvp(&g, &ids).expect("hvp");
    assert_eq!(
        hg.outputs().len(),
        1 + 2 * wrt.len(),
        "hvp outputs [loss, grads..., hvps...]"
    );
    let shapes: Vec<Vec<usize>> = (0..hg.outputs().len()).map(|i| out_dims(&hg, i)).collect();
    let tangents: Vec<(String, String)> = wrt
        .iter()
        .map(|n| (tangent_name(n), format!("v_{n}")))
        .collect();
    let mut feeds: Vec<(&str, &str)> = vec![("x", "x")];
    feeds.extend(tangents.iter().map(|(a, b)| (a.as_str(), b.as_str())));
    let outs = run(hg, &s, &TRANSFORMER_PARAMS, &feeds, &[]);
    compare(&s, "loss", Some(&shapes[0]), &outs[0], RTOL);
    for (i, n) in wrt.iter().enumerate() {
        compare(
            &s,
            &format!("grad_{n}"),
            Some(&shapes[1 + i]),
            &outs[1 + i],
            RTOL,
        );
        compare(
            &s,
            &format!("hvp_{n}"),
            Some(&shapes[1 + wrt.len() + i]),
            &outs[1 + wrt.len() + i],
            RTOL,
        );
    }
}

/// `sum(cond(sum(x*w) > 0, u -> u*u/2, u -> -sin(u)) at u = x*w)` with `Graph::cond`.
fn cond_graph(n: usize) -> Graph {
    let branch = |name: &str, f: &dyn Fn(&mut Graph, NodeId) -> NodeId| {
        let mut b = Graph::new(name);
        let u = b.input("u", Shape::new(&[n], F));
        let y = f(&mut b, u);
        b.set_outputs(vec![y]);
        b
    };
    let then_b = branch("square", &|b, u| {
        let sq = b.mul(u, u);
        let half = b.scalar(0.5, F);
        let half = b.expand(half, &[n]);
        b.mul(sq, half)
    });
    let else_b = branch("neg_sin", &|b, u| {
        let s = b.activation(Activation::Sin, u);
        b.activation(Activation::Neg, s)
    });
    let mut g = Graph::new("cond_piecewise");
    let w = g.param("w", Shape::new(&[n], F));
    let x = g.input("x", Shape::new(&[n], F));
    let u = g.mul(x, w);
    let s = g.sum(u, &[0], false);
    let zero = g.scalar(0.0, F);
    let pred = g.compare(rlx::ops::CmpOp::Gt, s, zero);
    let y = g.cond(pred, then_b, else_b, &[u]).expect("cond");
    let loss = g.sum(y, &[0], false);
    g.set_outputs(vec![loss]);
    g
}

/// (j) Control flow: `Graph::cond` against `lax.cond` — value and gradient on both sides of
/// the predicate, forward mode, and vmap over a batch whose predicates differ.
#[test]
fn j_cond_against_lax_cond() {
    let s = scenario("cond");
    let n = s.input("w").shape[0];
    let g = cond_graph(n);
    let w = g.find_leaf("w").unwrap();
    let gl = grad_with_loss(&g, &[w]).expect("grad of cond");
    let jg = jvp(&g, &["w"]).expect("jvp of cond");
    let tw = tangent_name("w");
    for tag in ["pos", "neg"] {
        let xname = format!("x_{tag}");
        let v = run(g.clone(), &s, &["w"], &[("x", &xname)], &[]);
        compare(&s, &format!("loss_{tag}"), None, &v[0], RTOL);
        let outs = run(
            gl.clone(),
            &s,
            &["w"],
            &[("x", &xname)],
            &[(D_OUTPUT, vec![1.0])],
        );
        compare(&s, &format!("loss_{tag}"), None, &outs[0], RTOL);
        compare(&s, &format!("grad_w_{tag}"), None, &outs[1], RTOL);
        let outs = run(jg.clone(), &s, &["w"], &[("x", &xname), (&tw, "t_w")], &[]);
        compare(&s, &format!("jvp_{tag}"), None, &outs[1], RTOL);
    }
    let batch = s.input("xs").shape[0];
    let vg = vmap(&g, &["x"], batch).expect("vmap of cond");
    let outs = run(vg, &s, &["w"], &[("x", "xs")], &[]);
    compare(&s, "vmap_losses", None, &outs[0], RTOL);
    let gw = grad(&g, &[w]).expect("grad");
    let vgw = vmap(&gw, &["x"], batch).expect("vmap of grad of cond");
    let outs = run(vgw, &s, &["w"], &[("x", "xs")], &[]);
    compare(&s, "vmap_grads", None, &outs[0], RTOL);
}

/// Newton's square root as a `while_loop` over carries `(a, x)`: with the tolerance test
/// (`exact`: false), or always true (a fixed trip count under `max_iterations`).
fn newton_graph(max_iterations: Option<usize>, tolerance: bool) -> Graph {
    let s = Shape::new(&[], F);
    let mut cond = Graph::new("not_converged");
    let a = cond.input("a", s.clone());
    let x = cond.input("x", s.clone());
    let p = if tolerance {
        let xx = cond.mul(x, x);
        let r = cond.sub(xx, a);
        let r = cond.activation(Activation::Abs, r);
        let eps = cond.scalar(1e-12, F);
        let tol = cond.mul(eps, a);
        cond.compare(rlx::ops::CmpOp::Gt, r, tol)
    } else {
        cond.compare(rlx::ops::CmpOp::Eq, x, x)
    };
    cond.set_outputs(vec![p]);
    let mut body = Graph::new("newton_step");
    let a = body.input("a", s.clone());
    let x = body.input("x", s.clone());
    let q = body.div(a, x);
    let y = body.add(x, q);
    let half = body.scalar(0.5, F);
    let y = body.mul(half, y);
    body.set_outputs(vec![a, y]);
    let mut g = Graph::new("newton_sqrt");
    let a = g.input("a", s);
    let outs = g
        .while_loop_bounded(cond, body, &[a, a], max_iterations)
        .expect("while");
    g.set_outputs(vec![outs[1]]);
    g
}

/// (k) `while_loop` against `lax.while_loop` / `fori_loop`: the value by a real loop (no bound),
/// forward mode and vmap both of the unbounded loop (a loop over carries and tangents; a loop
/// masked per example until no predicate holds, as JAX batches one) and through the bounded
/// form, the gradient through a fixed trip count.
#[test]
fn k_while_loop_against_lax() {
    let s = scenario("while");
    let g = newton_graph(None, true);
    let v = run(g, &s, &[], &[("a", "a")], &[]);
    compare(&s, "sqrt", None, &v[0], RTOL);
    let ta = tangent_name("a");
    let n = s.input("as").shape[0];
    for max_iterations in [None, Some(50)] {
        let g = newton_graph(max_iterations, true);
        let jg = jvp(&g, &["a"]).expect("jvp of a while");
        // The unbounded loop's forward mode stays a loop (no unrolling).
        let loops = jg
            .ids()
            .filter(|&id| jg.node(id).op.name() == "while")
            .count();
        assert_eq!(loops > 0, max_iterations.is_none(), "{max_iterations:?}");
        let outs = run(jg, &s, &[], &[("a", "a"), (&ta, "t_a")], &[]);
        compare(&s, "sqrt", None, &outs[0], RTOL);
        compare(&s, "jvp", None, &outs[1], RTOL);
        let vg = vmap(&g, &["a"], n).expect("vmap of a while");
        let outs = run(vg, &s, &[], &[("a", "as")], &[]);
        compare(&s, "vmap", None, &outs[0], RTOL);
    }
    // vmap of the jvp, and jvp of the vmap, of the unbounded loop (the rules compose).
    let g = newton_graph(None, true);
    let vj = vmap(&jvp(&g, &["a"]).unwrap(), &["a", &ta], n).expect("vmap of jvp");
    let outs = run(vj, &s, &[], &[("a", "as"), (&ta, "t_as")], &[]);
    compare(&s, "vmap", None, &outs[0], RTOL);
    compare(&s, "vmap_jvp", None, &outs[1], RTOL);
    let fori = newton_graph(Some(30), false);
    let a = fori.find_leaf("a").unwrap();
    let dg = grad(&fori, &[a]).expect("grad of a fixed-trip while");
    let outs = run(dg, &s, &[], &[("a", "a")], &[]);
    compare(&s, "grad_fori", None, &outs[0], RTOL);
    // Without a bound there is no reverse mode: a named error, not a panic.
    let unbounded = newton_graph(None, true);
    let a = unbounded.find_leaf("a").unwrap();
    let e = grad(&unbounded, &[a]).unwrap_err();
    assert!(e.to_string().contains("while"), "{e}");
}

/// A tanh RNN `h_t = tanh(h_{t-1} w + x_t u)` over `xs` by `scan_with` (w, u passed whole);
/// outputs the loss `sum(hs)` and the stacked states.
fn rnn_graph(s: &Scenario, xs_name: &str) -> Graph {
    let (h, d) = (s.input("h0").shape[0], s.input("u").shape[0]);
    let mut body = Graph::new("rnn_step");
    let c = body.input("h", Shape::new(&[h], F));
    let w = body.input("w", Shape::new(&[h, h], F));
    let u = body.input("u", Shape::new(&[d, h], F));
    let x = body.input("x", Shape::new(&[d], F));
    let c2 = body.reshape(c, &[1, h]);
    let hw = body.dot(c2, w);
    let x2 = body.reshape(x, &[1, d]);
    let xu = body.dot(x2, u);
    let z = body.add(hw, xu);
    let z = body.activation(Activation::Tanh, z);
    let z = body.reshape(z, &[h]);
    body.set_outputs(vec![z]);
    let mut g = Graph::new("rnn");
    let h0 = param(&mut g, s, "h0");
    let w = param(&mut g, s, "w");
    let u = param(&mut g, s, "u");
    let xs = input(&mut g, s, xs_name);
    let hs = g.scan_with(body, h0, &[w, u], &[xs]).expect("scan");
    let loss = sum_all(&mut g, hs);
    g.set_outputs(vec![loss, hs]);
    g
}

/// (l) `scan` against `lax.scan`: the states and loss by a real loop, gradients w.r.t. the
/// initial state and both weights, jvp along `w`, vmap over a batch of sequences.
#[test]
fn l_scan_against_lax_scan() {
    let s = scenario("scan");
    let ps = ["h0", "w", "u"];
    let g = rnn_graph(&s, "xs");
    let outs = run(g.clone(), &s, &ps, &[("xs", "xs")], &[]);
    compare(&s, "loss", None, &outs[0], RTOL);
    compare(&s, "hs", None, &outs[1], RTOL);
    let mut lg = g.clone();
    let loss = lg.outputs()[0];
    lg.set_outputs(vec![loss]);
    let ids: Vec<NodeId> = ps.iter().map(|p| lg.find_leaf(p).unwrap()).collect();
    let gl = grad_with_loss(&lg, &ids).expect("grad of scan");
    let outs = run(gl, &s, &ps, &[("xs", "xs")], &[(D_OUTPUT, vec![1.0])]);
    compare(&s, "loss", None, &outs[0], RTOL);
    compare(&s, "grad_h0", None, &outs[1], RTOL);
    compare(&s, "grad_w", None, &outs[2], RTOL);
    compare(&s, "grad_u", None, &outs[3], RTOL);
    let jg = jvp(&lg, &["w"]).expect("jvp of scan");
    let tw = tangent_name("w");
    let outs = run(jg, &s, &ps, &[("xs", "xs"), (&tw, "t_w")], &[]);
    compare(&s, "jvp_w", None, &outs[1], RTOL);
    let b = s.input("batch").shape[0];
    let vg = vmap(&lg, &["xs"], b).expect("vmap of scan");
    let outs = run(vg, &s, &ps, &[("xs", "batch")], &[]);
    compare(&s, "vmap_losses", None, &outs[0], RTOL);
}
