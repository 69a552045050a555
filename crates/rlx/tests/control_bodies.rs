//! Control-flow bodies go through the session's pipeline like the graph holding them: a body
//! may use composite ops (`dot_general`), HIR blocks (`linear`) and custom functions, which the
//! CPU (running `if`, `while` and `scan` natively) gets decomposed and fused, and the GPU
//! (running their decompositions) gets inlined. Both are checked against the reference
//! evaluator.

use rlx::ir::eval::{evaluate, Tensor};
use rlx::ir::ops::Linear;
use rlx::ir::DotDims;
use rlx::opt::Dispatch;
use rlx::prelude::*;
use std::collections::BTreeMap;

fn f32s(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(40503))
                % 1000) as f32
                / 1000.0
                - 0.5
        })
        .collect()
}

/// `h_t = tanh(dot_general(h, W) + x_t)` over `T` steps: `W` passed whole to every step.
fn rnn() -> Graph {
    let (t, n) = (5, 4);
    let mut body = Graph::new("rnn_step");
    let h = body.input("h", Shape::new(&[n], DType::F32));
    let w = body.input("w", Shape::new(&[n, n], DType::F32));
    let x = body.input("x", Shape::new(&[n], DType::F32));
    let hw = body.dot_general(
        h,
        w,
        DotDims {
            lhs_contract: vec![0],
            rhs_contract: vec![0],
            lhs_batch: vec![],
            rhs_batch: vec![],
        },
    );
    let s = body.add(hw, x);
    let y = body.activation(Activation::Tanh, s);
    body.set_outputs(vec![y]);
    let mut g = Graph::new("rnn");
    let h0 = g.input("h0", Shape::new(&[n], DType::F32));
    let w = g.input("w", Shape::new(&[n, n], DType::F32));
    let xs = g.input("xs", Shape::new(&[t, n], DType::F32));
    let hs = g.scan_with(body, h0, &[w], &[xs]).unwrap();
    g.set_outputs(vec![hs]);
    g
}

/// `if p: linear(x, w, b) else: relu(x) · w` — a block in one branch.
fn branchy() -> Graph {
    let branch = |lin: bool| {
        let mut b = Graph::new(if lin { "linear" } else { "relu_product" });
        let x = b.input("x", Shape::new(&[2, 3], DType::F32));
        let w = b.input("w", Shape::new(&[3, 4], DType::F32));
        let bias = b.input("b", Shape::new(&[4], DType::F32));
        let y = if lin {
            b.define(Linear, &[x, w, bias]).unwrap()
        } else {
            let r = b.activation(Activation::Relu, x);
            let y = b.dot(r, w);
            let z = b.add(y, bias);
            b.sub(z, bias)
        };
        b.set_outputs(vec![y]);
        b
    };
    let mut g = Graph::new("branchy");
    let p = g.input("p", Shape::new(&[], DType::Bool));
    let x = g.input("x", Shape::new(&[2, 3], DType::F32));
    let w = g.input("w", Shape::new(&[3, 4], DType::F32));
    let b = g.input("b", Shape::new(&[4], DType::F32));
    let y = g.cond(p, branch(true), branch(false), &[x, w, b]).unwrap();
    g.set_outputs(vec![y]);
    g
}

/// A bounded `while` whose body multiplies its carry by a matrix with `dot_general` (batch
/// axis 0) until the count reaches 3.
fn looped() -> Graph {
    let mut cond = Graph::new("below_three");
    let _x = cond.input("x", Shape::new(&[2, 2, 2], DType::F32));
    let i = cond.input("i", Shape::new(&[], DType::F32));
    let three = cond.scalar(3.0, DType::F32);
    let p = cond.compare(CmpOp::Lt, i, three);
    cond.set_outputs(vec![p]);
    let mut body = Graph::new("step");
    let x = body.input("x", Shape::new(&[2, 2, 2], DType::F32));
    let i = body.input("i", Shape::new(&[], DType::F32));
    let y = body.dot_general(
        x,
        x,
        DotDims {
            lhs_contract: vec![2],
            rhs_contract: vec![1],
            lhs_batch: vec![0],
            rhs_batch: vec![0],
        },
    );
    let half = body.scalar(0.5, DType::F32);
    let y = body.mul(y, half);
    let one = body.scalar(1.0, DType::F32);
    let j = body.add(i, one);
    body.set_outputs(vec![y, j]);
    let mut g = Graph::new("looped");
    let x = g.input("x", Shape::new(&[2, 2, 2], DType::F32));
    let i = g.input("i", Shape::new(&[], DType::F32));
    let outs = g.while_loop_bounded(cond, body, &[x, i], Some(8)).unwrap();
    g.set_outputs(vec![outs[0]]);
    g
}

/// Inputs for `g`'s f32 and bool inputs (`p` is `pred`).
fn inputs(g: &Graph, pred: bool) -> Vec<(String, Shape, Vec<f64>)> {
    g.inputs()
        .into_iter()
        .enumerate()
        .map(|(k, (name, id))| {
            let shape = g.shape(id).clone();
            let n = shape.static_dims().unwrap().iter().product::<usize>();
            let vals = match (name, shape.dtype()) {
                (_, DType::Bool) => vec![pred as u8 as f64],
                ("i", _) => vec![0.0],
                _ => f32s(n, k as u32 + 1).into_iter().map(f64::from).collect(),
            };
            (name.to_string(), shape, vals)
        })
        .collect()
}

fn reference(g: &Graph, ins: &[(String, Shape, Vec<f64>)]) -> Vec<f64> {
    let leaves: BTreeMap<String, Tensor> = ins
        .iter()
        .map(|(n, s, v)| {
            let t = Tensor::from_f64(s.static_dims().unwrap().as_slice(), s.dtype(), v.clone());
            (n.clone(), t)
        })
        .collect();
    evaluate(g, &leaves).unwrap()[0].f64s()
}

fn on(device: Device, g: &Graph, ins: &[(String, Shape, Vec<f64>)]) -> (Vec<f64>, CompiledGraph) {
    let mut c = Session::new(device)
        .try_compile(g.clone())
        .unwrap_or_else(|e| {
            panic!("{device}: {e}");
        });
    let bytes: Vec<(String, Vec<u8>, DType)> = ins
        .iter()
        .map(|(n, s, v)| {
            let b = match s.dtype() {
                DType::Bool => v.iter().map(|&x| x as u8).collect(),
                _ => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
            };
            (n.clone(), b, s.dtype())
        })
        .collect();
    let refs: Vec<(&str, &[u8], DType)> = bytes
        .iter()
        .map(|(n, b, d)| (n.as_str(), b.as_slice(), *d))
        .collect();
    let out = c.run_typed(&refs);
    let vals = out[0]
        .0
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
        .collect();
    (vals, c)
}

fn close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{what}[{i}]: {a} vs {b}"
        );
    }
}

fn op_dispatch(c: &CompiledGraph, op: &str) -> Option<Dispatch> {
    c.dispatch_report()
        .nodes
        .iter()
        .find(|n| n.op == op)
        .map(|n| n.dispatch.clone())
}

fn check(device: Device, g: &Graph, op: &str, preds: &[bool]) {
    for &p in preds {
        let ins = inputs(g, p);
        let want = reference(g, &ins);
        let (got, c) = on(device, g, &ins);
        close(&format!("{} on {device} (pred {p})", g.name()), &got, &want);
        let d = op_dispatch(&c, op);
        match device {
            Device::Cpu => assert_eq!(d, Some(Dispatch::Native), "{op} runs natively"),
            _ => assert_eq!(d, None, "{op} is decomposed on {device}"),
        }
    }
}

#[test]
fn cpu_bodies_with_composites_and_blocks_are_decomposed_for_the_cpu() {
    check(Device::Cpu, &rnn(), "scan", &[true]);
    check(Device::Cpu, &branchy(), "if", &[true, false]);
    check(Device::Cpu, &looped(), "while", &[true]);
}

#[test]
fn gpu_bodies_with_composites_and_blocks_run_through_their_decomposition() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    check(Device::Gpu, &rnn(), "scan", &[true]);
    check(Device::Gpu, &branchy(), "if", &[true, false]);
    check(Device::Gpu, &looped(), "while", &[true]);
}

#[test]
fn a_body_compiled_by_the_session_is_cached_with_its_plan() {
    // Through the compile cache: a second compile of the same graph reads the entry (the
    // planned bodies and their plans) and runs the same.
    let dir = std::env::temp_dir().join(format!("rlx-bodies-{}", std::process::id()));
    let cache = rlx::runtime::CompileCache::at(&dir);
    let g = rnn();
    let ins = inputs(&g, true);
    let want = reference(&g, &ins);
    for _ in 0..2 {
        let s = Session::new(Device::Cpu).with_compile_cache(cache.clone());
        let mut c = s.try_compile(g.clone()).unwrap();
        let x: Vec<Vec<f32>> = ins
            .iter()
            .map(|(_, _, v)| v.iter().map(|&x| x as f32).collect())
            .collect();
        let named: Vec<(&str, &[f32])> = ins
            .iter()
            .zip(&x)
            .map(|((n, _, _), v)| (n.as_str(), v.as_slice()))
            .collect();
        let got: Vec<f64> = c.run(&named)[0].iter().map(|&v| v as f64).collect();
        close("cached rnn", &got, &want);
        assert!(
            !c.lowering_plan().nested.is_empty(),
            "the scan's body has a plan"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
