//! `CustomFn`: a graph used as an op, run inlined, differentiated through its body unless it
//! carries its own VJP / JVP graphs, and batched by vmap.

use rlx::autodiff::{grad, jvp, tangent_name, vmap};
use rlx::ir::CustomFn;
use rlx::prelude::*;

fn f32s(d: &[usize]) -> Shape {
    Shape::new(d, DType::F32)
}

/// softplus(x) = log(1 + exp(x)), as a body graph.
fn softplus_body() -> Graph {
    let mut b = Graph::new("softplus");
    let x = b.input("x", f32s(&[4]));
    let e = b.activation(Activation::Exp, x);
    let one = b.scalar(1.0, DType::F32);
    let s = b.add(e, one);
    let y = b.activation(Activation::Log, s);
    b.set_outputs(vec![y]);
    b
}

/// A VJP graph returning `k * sigmoid(x) * ct` (k = 1 is the true derivative).
fn softplus_vjp(k: f64) -> Graph {
    let mut v = Graph::new("softplus_vjp");
    let x = v.input("x", f32s(&[4]));
    let _y = v.input("y", f32s(&[4]));
    let ct = v.input("ct", f32s(&[4]));
    let s = v.activation(Activation::Sigmoid, x);
    let kk = v.scalar(k, DType::F32);
    let s = v.mul(s, kk);
    let d = v.mul(s, ct);
    v.set_outputs(vec![d]);
    v
}

/// A JVP graph returning `k * sigmoid(x) * t`.
fn softplus_jvp(k: f64) -> Graph {
    let mut j = Graph::new("softplus_jvp");
    let x = j.input("x", f32s(&[4]));
    let t = j.input("t", f32s(&[4]));
    let s = j.activation(Activation::Sigmoid, x);
    let kk = j.scalar(k, DType::F32);
    let s = j.mul(s, kk);
    let d = j.mul(s, t);
    j.set_outputs(vec![d]);
    j
}

fn loss_graph(f: CustomFn) -> Graph {
    let mut g = Graph::new("use");
    let x = g.param("x", f32s(&[4]));
    let y = g.custom(f, &[x]);
    let l = g.sum(y, &[0], false);
    g.set_outputs(vec![l]);
    g
}

const X: [f32; 4] = [-2.0, -0.5, 0.3, 1.7];

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

fn grad_of(f: CustomFn) -> Vec<f32> {
    let g = loss_graph(f);
    let x = g.find_leaf("x").unwrap();
    let mut c = Session::new(Device::Cpu).compile(grad(&g, &[x]).unwrap());
    c.set_param("x", &X);
    c.run(&[]).remove(0)
}

#[test]
fn runs_as_its_inlined_body() {
    let f = CustomFn {
        name: "softplus".into(),
        body: Box::new(softplus_body()),
        vjp: None,
        jvp: None,
    };
    let mut c = Session::new(Device::Cpu).compile(loss_graph(f));
    c.set_param("x", &X);
    let want: f32 = X.iter().map(|v| (1.0 + v.exp()).ln()).sum();
    assert!((c.run(&[])[0][0] - want).abs() < 1e-5);
    assert!(
        c.graph().nodes().iter().all(|n| n.op.name() != "custom"),
        "the CPU runs the inlined body"
    );
}

#[test]
fn differentiates_through_the_body_without_a_rule_and_uses_a_given_rule() {
    let plain = CustomFn {
        name: "softplus".into(),
        body: Box::new(softplus_body()),
        vjp: None,
        jvp: None,
    };
    let through = grad_of(plain);
    for (g, x) in through.iter().zip(X) {
        assert!((g - sigmoid(x)).abs() < 1e-5, "{through:?}");
    }
    // A rule scaled by 3 shows the rule, not the body, was differentiated.
    let ruled = CustomFn {
        name: "softplus".into(),
        body: Box::new(softplus_body()),
        vjp: Some(Box::new(softplus_vjp(3.0))),
        jvp: None,
    };
    let by_rule = grad_of(ruled);
    for (g, x) in by_rule.iter().zip(X) {
        assert!((g - 3.0 * sigmoid(x)).abs() < 1e-5, "{by_rule:?}");
    }
}

#[test]
fn forward_mode_uses_the_jvp_rule() {
    for (rule, k) in [(None, 1.0f32), (Some(Box::new(softplus_jvp(2.0))), 2.0)] {
        let f = CustomFn {
            name: "softplus".into(),
            body: Box::new(softplus_body()),
            vjp: None,
            jvp: rule,
        };
        let j = jvp(&loss_graph(f), &["x"]).unwrap();
        let mut c = Session::new(Device::Cpu).compile(j);
        c.set_param("x", &X);
        let v = [1.0f32, -1.0, 0.5, 2.0];
        let out = c.run(&[(tangent_name("x").as_str(), &v)]);
        let want: f32 = X.iter().zip(v).map(|(x, t)| k * sigmoid(*x) * t).sum();
        assert!(
            (out[1][0] - want).abs() < 1e-5,
            "k={k}: {} vs {want}",
            out[1][0]
        );
    }
}

#[test]
fn vmap_batches_a_custom_fn() {
    let f = CustomFn {
        name: "softplus".into(),
        body: Box::new(softplus_body()),
        vjp: None,
        jvp: None,
    };
    let mut g = Graph::new("one");
    let x = g.input("x", f32s(&[4]));
    let y = g.custom(f, &[x]);
    g.set_outputs(vec![y]);
    let mut c = Session::new(Device::Cpu).compile(vmap(&g, &["x"], 2).unwrap());
    let xs: Vec<f32> = X
        .iter()
        .chain(X.iter().map(|v| v * 2.0).collect::<Vec<_>>().iter())
        .copied()
        .collect();
    let out = c.run(&[("x", &xs)]);
    for (o, x) in out[0].iter().zip(&xs) {
        assert!((o - (1.0 + x.exp()).ln()).abs() < 1e-5);
    }
}

#[test]
fn malformed_custom_fns_are_errors() {
    let mut g = Graph::new("bad");
    let x = g.input("x", f32s(&[3]));
    let f = CustomFn {
        name: "softplus".into(),
        body: Box::new(softplus_body()),
        vjp: None,
        jvp: None,
    };
    let e = g.try_custom(f, &[x]).unwrap_err().to_string();
    assert!(
        e.contains("argument 0 is f32[3]") && e.contains("f32[4]"),
        "{e}"
    );
    let mut body = Graph::new("with_param");
    let a = body.input("a", f32s(&[4]));
    let w = body.param("w", f32s(&[4]));
    let y = body.mul(a, w);
    body.set_outputs(vec![y]);
    let x4 = g.input("x4", f32s(&[4]));
    let e = g
        .try_custom(
            CustomFn {
                name: "p".into(),
                body: Box::new(body),
                vjp: None,
                jvp: None,
            },
            &[x4],
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("must not declare params"), "{e}");
    let e = g
        .try_custom(
            CustomFn {
                name: "v".into(),
                body: Box::new(softplus_body()),
                vjp: Some(Box::new(softplus_body())),
                jvp: None,
            },
            &[x4],
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("vjp needs 3 inputs and 1 outputs"), "{e}");
}
