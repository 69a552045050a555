//! `#[rlx_model]`: the graph is built and compiled once, on first use; options and extra
//! arguments reach the model; a builder's error is kept and returned. (Misuse is refused at
//! compile time: see the `compile_fail` examples in `rlx::macros`.)

use rlx::macros::rlx_model;
use rlx::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

static BUILDS: AtomicUsize = AtomicUsize::new(0);

/// `relu(x · w)` for `rows` rows of width `k`.
#[rlx_model(threads = 1)]
fn layer(g: &mut Graph, rows: usize, k: usize) -> Result<Vec<NodeId>> {
    BUILDS.fetch_add(1, Ordering::SeqCst);
    let x = g.try_input("x", Shape::new(&[rows, k], DType::F32))?;
    let w = g.try_param("w", Shape::new(&[k, 2], DType::F32))?;
    let y = g.try_dot(x, w)?;
    Ok(vec![g.try_activation(rlx::ops::Activation::Relu, y)?])
}

#[rlx_model(precision = "auto_mixed_bf16", device = "cpu")]
fn mixed(g: &mut Graph) -> Result<NodeId> {
    let x = g.try_input("x", Shape::new(&[4, 8], DType::F32))?;
    let w = g.try_param("w", Shape::new(&[8, 3], DType::F32))?;
    g.try_dot(x, w)
}

#[rlx_model]
fn broken(g: &mut Graph) -> Result<[NodeId; 1]> {
    let x = g.try_input("x", Shape::new(&[2, 3], DType::F32))?;
    let w = g.try_param("w", Shape::new(&[4, 2], DType::F32))?;
    Ok([g.try_dot(x, w)?])
}

#[test]
fn a_model_builds_and_compiles_once_on_first_use() {
    let before = BUILDS.load(Ordering::SeqCst);
    let mut m = layer(2, 3);
    assert_eq!(m.name(), "layer");
    assert!(!m.is_compiled());
    assert_eq!(
        BUILDS.load(Ordering::SeqCst),
        before,
        "nothing runs until the model is used"
    );
    m.set_param("w", &[1.0, -1.0, 2.0, -2.0, 3.0, -3.0])
        .unwrap();
    assert!(m.is_compiled());
    let y = m.run(&[("x", &[1.0, 1.0, 1.0, -1.0, 0.0, 1.0])]).unwrap();
    assert_eq!(y, vec![vec![6.0, 0.0, 2.0, 0.0]]);
    let y = m.run(&[("x", &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0])]).unwrap();
    assert_eq!(y, vec![vec![3.0, 0.0, 1.0, 0.0]]);
    assert_eq!(
        BUILDS.load(Ordering::SeqCst),
        before + 1,
        "built once for every use"
    );
    // Another size from the same function is another model.
    let mut big = layer(4, 3);
    let g = big.graph().unwrap();
    let x = g.inputs()[0].1;
    assert_eq!(g.shape(x).static_dims().unwrap(), vec![4, 3]);
    // Run errors are the compiled graph's errors.
    let e = m.run(&[("x", &[1.0])]).unwrap_err();
    assert!(e.to_string().contains("\"x\""), "{e}");
}

#[test]
fn options_reach_the_session() {
    let mut m = mixed();
    assert_eq!(m.session().precision(), &PrecisionPolicy::AutoMixedBf16);
    let c = m.compiled().unwrap();
    let g = c.graph();
    assert!(g
        .ids()
        .any(|i| g.node(i).op.kind() == OpKind::MatMul && g.shape(i).dtype() == DType::BF16));
    // A new session drops the compiled program and compiles again with it.
    let mut m = m.with_session(Session::new(Device::Cpu));
    assert!(!m.is_compiled());
    let g = m.compiled().unwrap().graph().clone();
    assert!(g
        .ids()
        .all(|i| g.node(i).op.kind() != OpKind::MatMul || g.shape(i).dtype() == DType::F32));
}

#[test]
fn a_builder_error_is_returned_by_every_call() {
    let mut m = broken();
    let e = m.run(&[("x", &[0.0; 6])]).unwrap_err();
    assert!(e.to_string().contains("matmul"), "{e}");
    assert_eq!(m.set_param("w", &[0.0; 8]).unwrap_err(), e);
    assert_eq!(m.graph().unwrap_err(), e);
}
