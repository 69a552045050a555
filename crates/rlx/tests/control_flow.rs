//! `Graph::cond` (the `if` op): the CPU runs it natively, only the taken branch (its own
//! compiled program per branch); the GPU runs its decomposition (both branches and a select);
//! bad branches are named errors. Values against `lax.cond` are in `jax_parity.rs` and the op
//! table.

use rlx::opt::Dispatch;
use rlx::prelude::*;

fn branch(name: &str, neg: bool) -> Graph {
    let mut b = Graph::new(name);
    let x = b.input("x", Shape::new(&[3], DType::F32));
    let y = if neg {
        b.activation(rlx::ops::Activation::Neg, x)
    } else {
        b.mul(x, x)
    };
    b.set_outputs(vec![y]);
    b
}

fn graph() -> Graph {
    let mut g = Graph::new("cond");
    let p = g.input("p", Shape::new(&[], DType::Bool));
    let x = g.input("x", Shape::new(&[3], DType::F32));
    let y = g
        .cond(p, branch("square", false), branch("neg", true), &[x])
        .unwrap();
    g.set_outputs(vec![y]);
    g
}

fn run(c: &mut CompiledGraph, p: bool) -> Vec<f32> {
    let x: Vec<u8> = [1.0f32, -2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let out = c.run_typed(&[("p", &[p as u8], DType::Bool), ("x", &x, DType::F32)]);
    out[0]
        .0
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn if_dispatch(c: &CompiledGraph) -> Option<Dispatch> {
    c.dispatch_report()
        .nodes
        .iter()
        .find(|n| n.op == "if")
        .map(|n| n.dispatch.clone())
}

#[test]
fn the_cpu_runs_the_taken_branch_natively() {
    let mut c = Session::new(Device::Cpu).compile(graph());
    assert_eq!(if_dispatch(&c), Some(Dispatch::Native));
    assert_eq!(run(&mut c, true), vec![1.0, 4.0, 9.0]);
    assert_eq!(run(&mut c, false), vec![-1.0, 2.0, -3.0]);
    assert_eq!(run(&mut c, true), vec![1.0, 4.0, 9.0]);
}

#[test]
fn the_gpu_runs_the_decomposition() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let mut c = Session::new(Device::Gpu).compile(graph());
    assert_eq!(if_dispatch(&c), None, "decomposed before lowering");
    assert_eq!(c.dispatch_report().decomposed.get("decompose:if"), Some(&1));
    assert_eq!(run(&mut c, true), vec![1.0, 4.0, 9.0]);
    assert_eq!(run(&mut c, false), vec![-1.0, 2.0, -3.0]);
}

#[test]
fn bad_branches_are_named_errors() {
    let mut g = Graph::new("bad");
    let p = g.input("p", Shape::new(&[], DType::Bool));
    let x = g.input("x", Shape::new(&[4], DType::F32));
    let e = g
        .cond(p, branch("a", false), branch("b", true), &[x])
        .unwrap_err();
    assert!(e.to_string().contains("arg 0 is f32[4]"), "{e}");
    let x3 = g.input("x3", Shape::new(&[3], DType::F32));
    let e = g
        .cond(x3, branch("a", false), branch("b", true), &[x3])
        .unwrap_err();
    assert!(e.to_string().contains("predicate must be one bool"), "{e}");
    let mut two = Graph::new("two");
    let a = two.input("x", Shape::new(&[3], DType::F32));
    let b = two.input("y", Shape::new(&[3], DType::F32));
    let s = two.add(a, b);
    two.set_outputs(vec![s]);
    let e = g.cond(p, branch("a", false), two, &[x3]).unwrap_err();
    assert!(
        e.to_string()
            .contains("takes 2 inputs but the op has 1 args"),
        "{e}"
    );
    // The text form carries the branches and reads them back.
    let g = graph();
    let back = Graph::parse(&g.to_string()).unwrap();
    assert_eq!(back.to_string(), g.to_string());
}
