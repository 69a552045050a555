//! The optimizer: each pass on hand-built graphs (structure after the pass, and values by
//! running), the compile pipeline (records, IR dumps, verification), constant folding through a
//! session, JSON round trips and the printer.

use rlx::opt::{AlgebraicSimplify, ConstantFolding, Cse, DeadCodeElimination, Decompose};
use rlx::prelude::*;
use rlx::{CompilePipeline, Pass};
use std::path::PathBuf;

fn f32s(dims: &[usize]) -> Shape {
    Shape::new(dims, DType::F32)
}

fn count(g: &Graph, name: &str) -> usize {
    g.nodes().iter().filter(|n| n.op.name() == name).count()
}

fn op_names(g: &Graph) -> Vec<&'static str> {
    g.nodes().iter().map(|n| n.op.name()).collect()
}

fn run_pass(p: &dyn Pass, g: &Graph) -> (Graph, usize) {
    let (out, n) = p.run(g).unwrap_or_else(|e| panic!("{}: {e}", p.name()));
    rlx::ir::verify(&out)
        .unwrap_or_else(|e| panic!("{} produced an invalid graph: {e}\n{out}", p.name()));
    (out, n)
}

/// Run `g` unoptimized on the CPU (the reference for what a pass must preserve).
fn run_plain(g: &Graph, inputs: &[(&str, &[f32])]) -> Vec<Vec<f32>> {
    Session::new(Device::Cpu)
        .without_optimizations()
        .compile(g.clone())
        .run(inputs)
}

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.5 - 1.0).collect()
}

/// A fresh, empty directory under the system temp dir.
fn temp_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!("rlx-test-{tag}-{}-{nanos}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

// ---------------------------------------------------------------- DCE

#[test]
fn dce_removes_unused_branches_but_keeps_inputs_and_params() {
    let mut g = Graph::new("dce");
    let x = g.input("x", f32s(&[3]));
    g.input("unused_in", f32s(&[2]));
    let unused_p = g.param("unused_p", f32s(&[4]));
    let c = g.constant_f32(&[3], &[1.0, 2.0, 3.0]);
    let dead = g.activation(Activation::Exp, x);
    let dead2 = g.add(dead, c);
    let _dead3 = g.mul(dead2, dead2);
    let _dead_on_param = g.activation(Activation::Neg, unused_p);
    let y = g.add(x, x);
    let z = g.activation(Activation::Relu, y);
    g.set_outputs(vec![z, x]);

    let (out, removed) = run_pass(&DeadCodeElimination, &g);
    assert_eq!(removed, 5, "{out}");
    assert_eq!(op_names(&out), ["input", "input", "param", "add", "relu"]);
    assert_eq!(
        out.inputs(),
        vec![("x", NodeId(0)), ("unused_in", NodeId(1))]
    );
    assert_eq!(out.params(), vec![("unused_p", NodeId(2))]);
    // Outputs follow their nodes.
    assert_eq!(out.outputs(), &[NodeId(4), NodeId(0)]);
    assert_eq!(out.node(NodeId(4)).inputs, vec![NodeId(3)]);
    // Nothing left to remove.
    assert_eq!(run_pass(&DeadCodeElimination, &out).1, 0);

    // The compiled graph still asks for every input and param by name.
    let mut compiled = Session::new(Device::Cpu).compile(g);
    let names: Vec<&str> = compiled.inputs().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["x", "unused_in"]);
    assert_eq!(compiled.params().len(), 1);
    compiled.set_param("unused_p", &[0.0; 4]);
    let out = compiled.run(&[("x", &[-1.0, 0.5, 2.0]), ("unused_in", &[9.0, 9.0])]);
    assert_eq!(out, vec![vec![0.0, 1.0, 4.0], vec![-1.0, 0.5, 2.0]]);
}

// ---------------------------------------------------------------- CSE

#[test]
fn cse_merges_identical_nodes() {
    let mut g = Graph::new("cse");
    let x = g.input("x", f32s(&[4]));
    let y = g.input("y", f32s(&[4]));
    let a1 = g.add(x, y);
    let a2 = g.add(x, y);
    let e1 = g.activation(Activation::Exp, a1);
    let e2 = g.activation(Activation::Exp, a2); // equal once a2 is merged into a1
    let swapped = g.add(y, x); // different operand order: not structurally equal
    let m = g.mul(e1, e2);
    let s = g.sub(m, swapped);
    g.set_outputs(vec![s]);

    let (out, merged) = run_pass(&Cse, &g);
    assert_eq!(merged, 2, "{out}");
    assert_eq!(count(&out, "add"), 2);
    assert_eq!(count(&out, "exp"), 1);
    let mul = out.nodes().iter().find(|n| n.op.name() == "mul").unwrap();
    assert_eq!(
        mul.inputs[0], mul.inputs[1],
        "both operands of mul are the one exp"
    );
    let inputs: &[(&str, &[f32])] = &[("x", &[0.0, 1.0, -1.0, 0.5]), ("y", &[1.0, 0.0, 2.0, 0.25])];
    assert_eq!(run_plain(&out, inputs), run_plain(&g, inputs));
}

#[test]
fn cse_keeps_distinct_leaves_and_merges_equal_constants() {
    let mut g = Graph::new("cse_leaves");
    let a = g.input("a", f32s(&[2]));
    let b = g.input("b", f32s(&[2]));
    let p = g.param("p", f32s(&[2]));
    let q = g.param("q", f32s(&[2]));
    let c1 = g.constant_f32(&[2], &[1.0, 2.0]);
    let c2 = g.constant_f32(&[2], &[1.0, 2.0]);
    let c3 = g.constant_f32(&[2], &[1.0, 3.0]);
    let s1 = g.add(a, c1);
    let s2 = g.add(b, c2);
    let s3 = g.add(p, c3);
    let s4 = g.add(q, c1);
    g.set_outputs(vec![s1, s2, s3, s4]);
    let (out, merged) = run_pass(&Cse, &g);
    assert_eq!(merged, 1, "only the second [1, 2] constant merges:\n{out}");
    assert_eq!(out.inputs().len(), 2);
    assert_eq!(out.params().len(), 2);
    assert_eq!(count(&out, "constant"), 2);
    assert_eq!(count(&out, "add"), 4);
}

// ---------------------------------------------------------------- algebraic simplification

#[test]
fn simplify_removes_multiply_by_one_and_add_of_zero() {
    let mut g = Graph::new("identities");
    let x = g.input("x", f32s(&[2, 3]));
    let one = g.scalar(1.0, DType::F32);
    let zero = g.scalar(-0.0, DType::F32); // the exact float additive identity
    let plus_zero = g.scalar(0.0, DType::F32); // and the exact subtractive one
    let ones = g.constant_f32(&[3], &[1.0; 3]);
    let a = g.mul(x, one);
    let b = g.add(a, zero);
    let c = g.add(zero, b);
    let d = g.mul(ones, c); // [3] broadcast against [2, 3]: still x's shape
    let e = g.sub(d, plus_zero);
    let f = g.div(e, one);
    g.set_outputs(vec![f]);
    let (out, n) = run_pass(&AlgebraicSimplify, &g);
    assert_eq!(n, 6, "{out}");
    assert_eq!(
        out.outputs(),
        &[NodeId(0)],
        "the output is x itself:\n{out}"
    );
    assert_eq!(
        count(&out, "mul") + count(&out, "add") + count(&out, "sub") + count(&out, "div"),
        0
    );
    let xs = iota(6);
    assert_eq!(run_plain(&out, &[("x", &xs)]), vec![xs.clone()]);
    assert_eq!(run_plain(&g, &[("x", &xs)]), vec![xs]);
}

/// `x - (-0.0)` and `x + 0.0` are not `x` (for `x = -0.0` both give `+0.0`): they stay.
#[test]
fn simplify_keeps_the_signed_zeros_that_are_not_identities() {
    let mut g = Graph::new("not_identities");
    let x = g.input("x", f32s(&[2]));
    let neg = g.scalar(-0.0, DType::F32);
    let pos = g.scalar(0.0, DType::F32);
    let a = g.sub(x, neg);
    let b = g.add(x, pos);
    g.set_outputs(vec![a, b]);
    let (out, n) = run_pass(&AlgebraicSimplify, &g);
    assert_eq!(n, 0, "{out}");
    let got = run_plain(&g, &[("x", &[-0.0, 1.0])]);
    assert!(got[0][0].is_sign_positive() && got[1][0].is_sign_positive());
}

#[test]
fn simplify_keeps_identities_that_broadcast_x_to_a_bigger_shape() {
    let mut g = Graph::new("widening");
    let x = g.input("x", f32s(&[3]));
    let zeros = g.constant_f32(&[2, 3], &[0.0; 6]);
    let ones = g.constant_f32(&[2, 1], &[1.0; 2]);
    let widened = g.add(x, zeros); // f32[2, 3]: not x
    let widened2 = g.mul(ones, x); // f32[2, 3]
    let s = g.scalar(-0.0, DType::F32);
    let scalar_x = g.input("s", f32s(&[]));
    let widened3 = g.add(scalar_x, s); // scalar + scalar: a true identity
    let not_a_splat = g.constant_f32(&[3], &[0.0, 1.0, 0.0]);
    let non_identity = g.add(x, not_a_splat);
    g.set_outputs(vec![widened, widened2, widened3, non_identity]);
    let (out, n) = run_pass(&AlgebraicSimplify, &g);
    assert_eq!(n, 1, "only scalar + 0 is an identity:\n{out}");
    assert_eq!(*out.shape(out.outputs()[0]), f32s(&[2, 3]));
    assert_eq!(out.node(out.outputs()[0]).op.name(), "add");
    assert_eq!(out.node(out.outputs()[1]).op.name(), "mul");
    assert_eq!(out.node(out.outputs()[2]).op.name(), "input");
    assert_eq!(out.node(out.outputs()[3]).op.name(), "add");
    let feeds: &[(&str, &[f32])] = &[("x", &[1.0, 2.0, 3.0]), ("s", &[5.0])];
    let want = vec![
        vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0],
        vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0],
        vec![5.0],
        vec![1.0, 3.0, 3.0],
    ];
    assert_eq!(run_plain(&out, feeds), want);
    // Through the full optimizing session too.
    assert_eq!(Session::new(Device::Cpu).compile(g).run(feeds), want);
}

#[test]
fn simplify_keeps_float_add_of_positive_zero() {
    // -0.0 + 0.0 is +0.0, so `x + 0.0` is not an identity for floats; for integers it is.
    let mut g = Graph::new("signed_zero");
    let x = g.input("x", f32s(&[2]));
    let zero = g.scalar(0.0, DType::F32);
    let y = g.add(x, zero);
    let i = g.input("i", Shape::new(&[2], DType::I32));
    let izero = g.scalar(0.0, DType::I32);
    let j = g.add(i, izero);
    g.set_outputs(vec![y, j]);
    let (out, n) = run_pass(&AlgebraicSimplify, &g);
    assert_eq!(n, 1, "{out}");
    assert_eq!(out.node(out.outputs()[0]).op.name(), "add");
    assert_eq!(out.node(out.outputs()[1]).op.name(), "input");
    let r = Session::new(Device::Cpu)
        .compile(g)
        .run(&[("x", &[-0.0, 1.0]), ("i", &[3.0, 4.0])]);
    assert!(
        r[0][0] == 0.0 && r[0][0].is_sign_positive(),
        "-0.0 + 0.0 must be +0.0, got {:?}",
        r[0]
    );
}

#[test]
fn simplify_composes_transposes_correctly() {
    let dims = [2, 3, 4, 5];
    let perms: [(&[usize], &[usize]); 4] = [
        (&[1, 2, 3, 0], &[2, 0, 3, 1]),
        (&[3, 1, 0, 2], &[1, 3, 2, 0]),
        (&[0, 2, 1, 3], &[0, 2, 1, 3]), // inverse of itself: identity
        (&[1, 2, 3, 0], &[3, 0, 1, 2]), // inverse: identity
    ];
    let xs = iota(120);
    for (p, q) in perms {
        let mut g = Graph::new("tt");
        let x = g.input("x", f32s(&dims));
        let t1 = g.transpose(x, p);
        let t2 = g.transpose(t1, q);
        let y = g.activation(Activation::Neg, t2);
        g.set_outputs(vec![y]);
        let pipe = CompilePipeline::new()
            .with_pass(AlgebraicSimplify)
            .with_pass(DeadCodeElimination)
            .rounds(4);
        let out = pipe.run(&g).expect("pipeline").graph;
        let identity = q.iter().map(|&i| p[i]).enumerate().all(|(i, v)| i == v);
        assert_eq!(
            count(&out, "transpose"),
            if identity { 0 } else { 1 },
            "p {p:?} q {q:?}:\n{out}"
        );
        assert_eq!(out.shape(out.outputs()[0]), g.shape(y));
        assert_eq!(
            run_plain(&out, &[("x", &xs)]),
            run_plain(&g, &[("x", &xs)]),
            "p {p:?} q {q:?}"
        );
        // And the reference is right: element [i0..i3] of t2 is x at the composed permutation.
        let got = run_plain(&g, &[("x", &xs)]).remove(0);
        let t2_dims: Vec<usize> = q.iter().map(|&i| dims[p[i]]).collect();
        for (flat, v) in got.iter().enumerate() {
            let mut rem = flat;
            let mut idx = [0usize; 4];
            for a in (0..4).rev() {
                idx[a] = rem % t2_dims[a];
                rem /= t2_dims[a];
            }
            let mut src = [0usize; 4];
            for a in 0..4 {
                src[p[q[a]]] = idx[a];
            }
            let off = ((src[0] * 3 + src[1]) * 4 + src[2]) * 5 + src[3];
            assert_eq!(*v, -xs[off]);
        }
    }
}

#[test]
fn simplify_collapses_reshape_chains_and_identity_moves() {
    let mut g = Graph::new("reshapes");
    let x = g.input("x", f32s(&[2, 3, 4]));
    let r1 = g.reshape(x, &[6, 4]);
    let r2 = g.reshape(r1, &[4, 6]);
    let r3 = g.reshape(r2, &[24]);
    let r4 = g.reshape(r3, &[3, 8]);
    let back = g.reshape(r4, &[2, 3, 4]); // back to x's shape
    let e = g.expand(back, &[2, 3, 4]);
    let n = g.narrow(e, 1, 0, 3);
    let c = g.cast(n, DType::F32);
    let t = g.transpose(c, &[0, 1, 2]);
    let y = g.activation(Activation::Neg, t);
    let y = g.activation(Activation::Neg, y);
    let kept = g.reshape(r2, &[2, 12]);
    g.set_outputs(vec![y, kept]);
    let res = CompilePipeline::new()
        .with_pass(AlgebraicSimplify)
        .with_pass(DeadCodeElimination)
        .rounds(4)
        .run(&g)
        .expect("pipeline");
    let out = res.graph;
    assert_eq!(
        out.outputs()[0],
        NodeId(0),
        "everything on the first path is an identity:\n{out}"
    );
    assert_eq!(count(&out, "reshape"), 1, "{out}");
    assert_eq!(
        out.node(out.outputs()[1]).op,
        Op::Reshape { shape: vec![2, 12] }
    );
    assert_eq!(out.node(out.outputs()[1]).inputs, vec![NodeId(0)]);
    assert_eq!(op_names(&out), ["input", "reshape"]);
    let xs = iota(24);
    assert_eq!(run_plain(&out, &[("x", &xs)]), vec![xs.clone(), xs.clone()]);
}

#[test]
fn simplify_keeps_real_casts_and_narrows() {
    let mut g = Graph::new("casts");
    let x = g.input("x", f32s(&[4]));
    let h = g.cast(x, DType::F16);
    let back = g.cast(h, DType::F32); // rounding: not an identity
    let n = g.narrow(back, 0, 1, 3);
    g.set_outputs(vec![n]);
    let (out, rewrites) = run_pass(&AlgebraicSimplify, &g);
    assert_eq!(rewrites, 0, "{out}");
    assert_eq!(out, g);
}

// ---------------------------------------------------------------- constant folding

#[test]
fn constant_folding_pass_folds_constant_subgraphs_only() {
    let mut g = Graph::new("fold");
    let x = g.input("x", f32s(&[3]));
    let p = g.param("p", f32s(&[3]));
    let c = g.constant_f32(&[3], &[0.0, 1.0, -1.0]);
    let e = g.activation(Activation::Exp, c);
    let two = g.scalar(2.0, DType::F32);
    let f = g.mul(e, two); // folded too: its operands are constants once e is
    let big = g.constant_f32(&[64], &[0.5; 64]);
    let big_e = g.activation(Activation::Exp, big); // larger than max_elements: kept
    let pe = g.add(p, c); // has a param: kept
    let y = g.add(x, f);
    let y = g.add(y, pe);
    let s = g.sum(big_e, &[0], false);
    g.set_outputs(vec![y, s]);
    let pass = ConstantFolding { max_elements: 16 };
    let (out, folded) = run_pass(&pass, &g);
    assert_eq!(folded, 2, "{out}");
    assert_eq!(count(&out, "exp"), 1, "only the big exp stays:\n{out}");
    assert_eq!(count(&out, "mul"), 0);
    // The folded constant holds exp(c) * 2 as the reference evaluator computes it (f64, rounded once).
    let folded_node = out
        .nodes()
        .iter()
        .rev()
        .find(|n| matches!(n.op, Op::Constant { .. }) && n.shape == f32s(&[3]))
        .unwrap();
    let Op::Constant { data } = &folded_node.op else {
        unreachable!()
    };
    let vals: Vec<f32> = data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    for (v, c) in vals.iter().zip([0.0f32, 1.0, -1.0]) {
        // exp rounded to f32 once, then an exact doubling.
        assert_eq!(*v, ((c as f64).exp() as f32) * 2.0);
    }
    let feeds: &[(&str, &[f32])] = &[("x", &[1.0, 2.0, 3.0])];
    let (folded_run, plain_run) = (run_plain(&out, feeds), run_plain(&g, feeds));
    for (a, b) in folded_run.iter().flatten().zip(plain_run.iter().flatten()) {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs(),
            "folded {a} vs computed {b}"
        );
    }
}

#[test]
fn session_folds_constants() {
    let mut g = Graph::new("session_fold");
    let x = g.input("x", f32s(&[3]));
    let c = g.constant_f32(&[3], &[0.0, 1.0, 2.0]);
    let e = g.activation(Activation::Exp, c);
    let y = g.add(x, e);
    g.set_outputs(vec![y]);
    let mut compiled = Session::new(Device::Cpu).compile(g);
    assert_eq!(count(compiled.graph(), "exp"), 0, "{}", compiled.graph());
    assert_eq!(count(compiled.graph(), "add"), 1);
    let out = compiled.run(&[("x", &[1.0, 1.0, 1.0])]);
    for (got, c) in out[0].iter().zip([0.0f32, 1.0, 2.0]) {
        let want = 1.0 + c.exp();
        assert!((got - want).abs() <= 1e-6 * want, "{got} vs {want}");
    }
    let records = compiled.pass_records();
    assert!(!records.is_empty());
    let names: Vec<&str> = records.iter().map(|r| r.pass.as_str()).collect();
    for p in ["simplify", "cse", "const_fold", "dce", "decompose"] {
        assert!(names.contains(&p), "pass {p} not recorded: {names:?}");
    }
    let fold = records.iter().find(|r| r.pass == "const_fold").unwrap();
    assert_eq!(fold.rewrites, 1);
    assert_eq!(
        (fold.nodes_before, fold.nodes_after),
        (4, 4),
        "exp(c) becomes a constant; c stays until DCE"
    );
    let dce = records.iter().find(|r| r.pass == "dce").unwrap();
    assert_eq!((dce.nodes_before, dce.nodes_after), (4, 3));
    // Each record starts where the previous one ended.
    for w in records.windows(2) {
        assert_eq!(w[0].nodes_after, w[1].nodes_before, "{records:?}");
    }
}

#[test]
fn session_runs_a_fully_constant_graph() {
    let mut g = Graph::new("all_const");
    let c = g.constant_f32(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let t = g.transpose(c, &[1, 0]);
    let m = g.dot(c, t);
    let s = g.sum(m, &[1], false);
    g.set_outputs(vec![s, c]);
    let mut compiled = Session::new(Device::Cpu).compile(g);
    assert!(
        compiled
            .graph()
            .nodes()
            .iter()
            .all(|n| matches!(n.op, Op::Constant { .. })),
        "{}",
        compiled.graph()
    );
    assert!(compiled.inputs().is_empty());
    // [[1,2],[3,4]] @ [[1,3],[2,4]] = [[5,11],[11,25]]
    assert_eq!(
        compiled.run(&[]),
        vec![vec![16.0, 36.0], vec![1.0, 2.0, 3.0, 4.0]]
    );
}

// ---------------------------------------------------------------- pipeline

#[test]
fn pipeline_dumps_before_and_after_each_pass() {
    let dir = temp_dir("dump");
    let mut g = Graph::new("dump me");
    let x = g.input("x", f32s(&[2]));
    let one = g.scalar(1.0, DType::F32);
    let y = g.mul(x, one);
    let z = g.activation(Activation::Tanh, y);
    g.set_outputs(vec![z]);
    let res = CompilePipeline::new()
        .dump_to(Some(dir.clone()))
        .with_pass(AlgebraicSimplify)
        .with_pass(DeadCodeElimination)
        .run(&g)
        .expect("pipeline");
    let read =
        |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let before = read("dump_me.00.simplify.before.txt");
    let after = read("dump_me.00.simplify.after.txt");
    let dce_before = read("dump_me.01.dce.before.txt");
    let dce_after = read("dump_me.01.dce.after.txt");
    assert_eq!(before, g.to_string());
    assert!(
        before.contains("mul") && before.contains("tanh"),
        "{before}"
    );
    assert_eq!(after, dce_before);
    assert_eq!(dce_after, res.graph.to_string());
    assert!(
        !dce_after.contains("mul") && !dce_after.contains("constant"),
        "{dce_after}"
    );
    assert!(dce_after.contains("tanh %0"), "{dce_after}");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    // Without a dump directory nothing is written.
    let quiet = temp_dir("nodump");
    CompilePipeline::new()
        .dump_to(None)
        .with_pass(AlgebraicSimplify)
        .run(&g)
        .expect("pipeline");
    assert_eq!(std::fs::read_dir(&quiet).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&quiet);
}

#[test]
fn pipeline_records_and_rounds() {
    let mut g = Graph::new("rounds");
    let x = g.input("x", f32s(&[2, 3]));
    let t1 = g.transpose(x, &[1, 0]);
    let t2 = g.transpose(t1, &[1, 0]);
    g.set_outputs(vec![t2]);
    let res = CompilePipeline::new()
        .with_pass(AlgebraicSimplify)
        .with_pass(DeadCodeElimination)
        .rounds(5)
        .run(&g)
        .unwrap();
    let names: Vec<&str> = res.records.iter().map(|r| r.pass.as_str()).collect();
    // Round 1 composes the transposes and, since the engine offers the composed transpose to
    // the rules again, drops it as the identity; DCE removes the old pair; round 2 finds nothing
    // to do and stops.
    assert_eq!(
        names,
        ["simplify", "dce", "simplify", "dce"],
        "{:?}",
        res.records
    );
    let fired: Vec<(&str, usize)> = res.records[0]
        .fired
        .iter()
        .map(|(k, &v)| (k.as_str(), v))
        .collect();
    assert_eq!(
        fired,
        [("transpose_identity", 1), ("transpose_transpose", 1)]
    );
    assert_eq!(res.records.last().unwrap().rewrites, 0);
    assert_eq!(op_names(&res.graph), ["input"]);
    assert_eq!(res.graph.outputs(), &[NodeId(0)]);
}

/// A pass that breaks the graph: it claims every add returns one more element.
struct Breaker;

impl Pass for Breaker {
    fn name(&self) -> &str {
        "breaker"
    }
    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        rlx::opt::rewrite(g, |out, op, ins, shape| {
            if op.name() != "add" {
                return Ok(rlx::opt::Rewrite::Keep);
            }
            let n = shape.dim(0).unwrap();
            Ok(rlx::opt::Rewrite::Replace(out.push_unchecked(
                op.clone(),
                ins.to_vec(),
                f32s(&[n + 1]),
            )))
        })
    }
}

#[test]
fn pipeline_verifies_after_each_pass() {
    let mut g = Graph::new("broken");
    let x = g.input("x", f32s(&[2]));
    let y = g.add(x, x);
    g.set_outputs(vec![y]);
    let err = CompilePipeline::new()
        .verify_each(true)
        .with_pass(Breaker)
        .run(&g)
        .expect_err("broken graph");
    match &err {
        Error::Verify(errs) => {
            let all = errs.join("\n");
            assert!(
                all.contains("%1") && all.contains("f32[3]") && all.contains("f32[2]"),
                "{all}"
            );
        }
        e => panic!("expected Error::Verify, got {e:?}"),
    }
    // The input graph is verified first, too.
    let mut bad = g.clone();
    bad.set_outputs_unchecked(vec![NodeId(7)]);
    let err = CompilePipeline::new().run(&bad).expect_err("bad output");
    assert!(matches!(err, Error::Verify(_)), "{err:?}");
    assert!(err.to_string().contains("%7"), "{err}");
}

// ---------------------------------------------------------------- decomposition

/// Naive `dot_general` over row-major data.
fn ref_dot_general(
    a: &[f32],
    ad: &[usize],
    b: &[f32],
    bd: &[usize],
    d: &DotDims,
) -> (Vec<usize>, Vec<f32>) {
    let free = |rank: usize, batch: &[usize], con: &[usize]| -> Vec<usize> {
        (0..rank)
            .filter(|i| !batch.contains(i) && !con.contains(i))
            .collect()
    };
    let (lf, rf) = (
        free(ad.len(), &d.lhs_batch, &d.lhs_contract),
        free(bd.len(), &d.rhs_batch, &d.rhs_contract),
    );
    let mut out_dims: Vec<usize> = d.lhs_batch.iter().map(|&i| ad[i]).collect();
    out_dims.extend(lf.iter().map(|&i| ad[i]));
    out_dims.extend(rf.iter().map(|&i| bd[i]));
    let con_dims: Vec<usize> = d.lhs_contract.iter().map(|&i| ad[i]).collect();
    let offset =
        |idx: &[usize], dims: &[usize]| idx.iter().zip(dims).fold(0, |acc, (i, n)| acc * n + i);
    let unravel = |mut f: usize, dims: &[usize]| {
        let mut v = vec![0; dims.len()];
        for i in (0..dims.len()).rev() {
            v[i] = f % dims[i];
            f /= dims[i];
        }
        v
    };
    let nb = d.lhs_batch.len();
    let n_out: usize = out_dims.iter().product();
    let n_con: usize = con_dims.iter().product();
    let mut out = Vec::with_capacity(n_out);
    for o in 0..n_out {
        let oi = unravel(o, &out_dims);
        let mut acc = 0f64;
        for k in 0..n_con {
            let ki = unravel(k, &con_dims);
            let (mut ai, mut bi) = (vec![0; ad.len()], vec![0; bd.len()]);
            for j in 0..nb {
                ai[d.lhs_batch[j]] = oi[j];
                bi[d.rhs_batch[j]] = oi[j];
            }
            for (j, &ax) in lf.iter().enumerate() {
                ai[ax] = oi[nb + j];
            }
            for (j, &ax) in rf.iter().enumerate() {
                bi[ax] = oi[nb + lf.len() + j];
            }
            for j in 0..ki.len() {
                ai[d.lhs_contract[j]] = ki[j];
                bi[d.rhs_contract[j]] = ki[j];
            }
            acc += a[offset(&ai, ad)] as f64 * b[offset(&bi, bd)] as f64;
        }
        out.push(acc as f32);
    }
    (out_dims, out)
}

#[test]
fn dot_general_is_decomposed_for_the_cpu() {
    let cases: Vec<(Vec<usize>, Vec<usize>, DotDims)> = vec![
        // Plain batched matmul.
        (
            vec![2, 3, 4],
            vec![2, 4, 5],
            DotDims {
                lhs_contract: vec![2],
                rhs_contract: vec![1],
                lhs_batch: vec![0],
                rhs_batch: vec![0],
            },
        ),
        // Batch and contracting axes in unusual places, two contracting axes in swapped order.
        (
            vec![3, 2, 6, 4],
            vec![4, 5, 3, 2],
            DotDims {
                lhs_contract: vec![3, 0],
                rhs_contract: vec![0, 2],
                lhs_batch: vec![1],
                rhs_batch: vec![3],
            },
        ),
        // Outer product (no contraction, no batch).
        (vec![3], vec![2, 2], DotDims::default()),
    ];
    for (ad, bd, dims) in cases {
        let mut g = Graph::new("dg");
        let a = g.input("a", f32s(&ad));
        let b = g.input("b", f32s(&bd));
        let y = g.dot_general(a, b, dims.clone());
        g.set_outputs(vec![y]);
        let av: Vec<f32> = (0..ad.iter().product())
            .map(|i: usize| (i % 7) as f32 - 3.0)
            .collect();
        let bv: Vec<f32> = (0..bd.iter().product())
            .map(|i: usize| (i % 5) as f32 * 0.5 - 1.0)
            .collect();
        let (want_dims, want) = ref_dot_general(&av, &ad, &bv, &bd, &dims);
        assert_eq!(*g.shape(y), f32s(&want_dims));
        for session in [
            Session::new(Device::Cpu),
            Session::new(Device::Cpu).without_optimizations(),
        ] {
            let mut c = session.compile(g.clone());
            assert_eq!(count(c.graph(), "dot_general"), 0, "{}", c.graph());
            assert!(count(c.graph(), "matmul") == 1, "{}", c.graph());
            assert!(c
                .pass_records()
                .iter()
                .any(|r| r.pass == "decompose" && r.rewrites == 1));
            let out = c.run(&[("a", &av), ("b", &bv)]);
            assert_eq!(out[0], want, "{ad:?} x {bd:?} with {dims:?}");
        }
    }
}

#[test]
fn decompose_reports_ops_without_a_decomposition() {
    let mut g = Graph::new("unsupported");
    let x = g.input("x", f32s(&[2]));
    let y = g.activation(Activation::Tanh, x);
    g.set_outputs(vec![y]);
    let supports = |g: &Graph, id: NodeId| g.node(id).op.name() != "tanh";
    let err = Decompose {
        backend: "toy",
        supports: &supports,
        why: None,
    }
    .run(&g)
    .expect_err("tanh has no decomposition");
    assert_eq!(
        err,
        Error::Unsupported {
            backend: "toy".into(),
            op: "tanh".into(),
            node: NodeId(1),
            msg: "no kernel and no decomposition".into()
        }
    );
    assert!(
        err.to_string()
            .contains("toy backend cannot run tanh (node %1)"),
        "{err}"
    );
}

// ---------------------------------------------------------------- serialization and printing

/// A graph using most op kinds.
fn zoo() -> Graph {
    let mut g = Graph::new("zoo");
    let x = g.input("x", f32s(&[2, 4]));
    let w = g.param("w", f32s(&[4, 4]));
    let gamma = g.param("gamma", f32s(&[4]));
    let beta = g.param("beta", f32s(&[4]));
    let idx = g.input("idx", Shape::new(&[3], DType::I32));
    let c = g.constant_f32(&[4], &[0.1, -0.2, 0.3, 1e-7]);
    let h = g.scalar(0.5, DType::F16);
    let mm = g.matmul(x, w, f32s(&[2, 4]));
    let b = g.add(mm, c);
    let act = g.activation(Activation::GeluApprox, b);
    let ln = g.layer_norm(act, gamma, beta, 1e-5);
    let rn = g.rms_norm(ln, gamma, 1e-6);
    let sm = g.softmax(rn, 1);
    let red = g.reduce(ReduceKind::Max, sm, &[1], true);
    let sub = g.sub(sm, red);
    let q = g.reshape(sub, &[1, 2, 2, 2]);
    let att = g.attention(q, q, q, MaskKind::SlidingWindow(1), 0.7);
    let flat = g.reshape(att, &[2, 4]);
    let gat = g.gather(flat, idx, 1);
    let conv_in = g.reshape(x, &[1, 2, 4]);
    let cw = g.param("cw", f32s(&[3, 2, 2]));
    let conv = g.conv(
        conv_in,
        cw,
        ConvAttrs {
            stride: vec![2],
            padding: vec![(1, 0)],
            dilation: vec![1],
            groups: 1,
        },
    );
    let pool = g.pool(
        conv,
        PoolAttrs {
            kind: PoolKind::Mean,
            kernel: vec![2],
            stride: vec![1],
            padding: vec![(1, 1)],
        },
    );
    let dg = g.dot_general(
        x,
        w,
        DotDims {
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            ..Default::default()
        },
    );
    let cmp = g.compare(CmpOp::Ge, dg, mm);
    let sel = g.select(cmp, dg, mm);
    let cs = g.cumsum(sel, 0);
    let cat = g.concat(&[cs, sel], 0);
    let nar = g.narrow(cat, 0, 1, 2);
    let tr = g.transpose(nar, &[1, 0]);
    let ex = g.expand(c, &[3, 4]);
    let (tv, ti) = g.topk(x, 2);
    let hc = g.cast(h, DType::F32);
    let pos = g.input("pos", Shape::new(&[2], DType::I32));
    let rope = g.rope(q, pos, 10000.0, true);
    let upd = g.input("upd", f32s(&[2, 3]));
    let sc = g.scatter_add(x, idx, upd, 1);
    g.set_outputs(vec![gat, pool, tr, ex, tv, ti, hc, rope, sc]);
    g
}

#[test]
fn json_round_trip_of_many_op_kinds() {
    let g = zoo();
    rlx::ir::verify(&g).expect("the zoo is valid");
    let json = g.to_json();
    let back = Graph::from_json(&json).expect("round trip");
    assert_eq!(back, g);
    assert_eq!(back.to_json(), json);
    assert_eq!(back.to_string(), g.to_string());
    // Compiling both gives the same program results.
    let feeds: Vec<(String, Vec<f32>)> = vec![
        ("x".into(), iota(8)),
        ("idx".into(), vec![3.0, 0.0, 1.0]),
        ("pos".into(), vec![0.0, 5.0]),
        ("upd".into(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
    ];
    let feeds: Vec<(&str, &[f32])> = feeds
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect();
    let mut results = Vec::new();
    for graph in [g, back] {
        let mut c = Session::new(Device::Cpu).compile(graph);
        c.set_param("w", &iota(16));
        c.set_param("gamma", &[1.0, 0.5, 2.0, -1.0]);
        c.set_param("beta", &[0.0, 0.1, 0.2, 0.3]);
        c.set_param("cw", &iota(12));
        results.push(c.run(&feeds));
    }
    assert_eq!(results[0], results[1]);
    assert!(
        results[0].iter().flatten().all(|v| v.is_finite()),
        "{:?}",
        results[0]
    );
}

#[test]
fn display_names_every_op() {
    let g = zoo();
    let text = g.to_string();
    assert!(text.starts_with("graph \"zoo\" {"), "{text}");
    for n in g.nodes() {
        assert!(
            text.contains(n.op.name()),
            "{} missing from\n{text}",
            n.op.name()
        );
    }
    for want in [
        "input {name = \"x\"} : f32[2, 4]",
        "param {name = \"w\"}",
        "constant {data = 0x",
        "matmul %0, %1 : f32[2, 4]",
        "attention %",
        "{mask = sliding_window(1), scale = ",
        "{stride = [2], padding = [[",
        "{kind = mean, kernel = [2]",
        "{kind = max, axes = [1], keepdims = true}",
        "gather %",
        "{lhs_contract = [1], rhs_contract = [0]",
        "{k = 2, output = values}",
        "{k = 2, output = indices}",
        "{to = f32}",
        "{theta = 10000.0, interleaved = true}",
        "scatter_add %",
        "return %",
    ] {
        assert!(text.contains(want), "{want:?} missing from\n{text}");
    }
    assert_eq!(Graph::parse(&text).expect("the printed form parses"), g);
    assert_eq!(text.lines().count(), g.len() + 3);
}

#[test]
fn simplify_turns_the_summed_cotangents_of_narrows_into_one_concat() {
    // x [2, 6] split in three column blocks (as a fused QKV projection is): the gradient sums
    // three zero-padded pieces, which the simplifier rewrites as one concat of the pieces.
    let mut g = Graph::new("split");
    let x = g.input("x", f32s(&[2, 6]));
    let a = g.narrow(x, 1, 0, 2);
    let b = g.narrow(x, 1, 2, 2);
    let c = g.narrow(x, 1, 4, 2);
    let aa = g.mul(a, a);
    let two = g.scalar(2.0, DType::F32);
    let bb = g.mul(b, two);
    let cc = g.mul(c, c);
    let cc = g.mul(cc, c);
    let s = g.add(aa, bb);
    let s = g.add(s, cc);
    let loss = g.sum(s, &[0, 1], false);
    g.set_outputs(vec![loss]);
    let d = rlx::autodiff::grad_with_loss(&g, &[x]).unwrap();
    let pipe = CompilePipeline::new()
        .with_pass(AlgebraicSimplify)
        .with_pass(DeadCodeElimination)
        .rounds(4);
    let out = pipe.run(&d).unwrap().graph;
    let grad = out.outputs()[1];
    assert_eq!(out.node(grad).op.name(), "concat", "{out}");
    assert_eq!(count(&out, "concat"), 1, "{out}");
    let wide_adds = out
        .nodes()
        .iter()
        .filter(|n| {
            n.op.name() == "add"
                && n.shape.dims().len() == 2
                && n.shape.dims()[1].as_static() == Some(6)
        })
        .count();
    assert_eq!(
        wide_adds, 0,
        "no sum of padded [2, 6] cotangents remains:\n{out}"
    );
    let xs = iota(12);
    let feeds: &[(&str, &[f32])] = &[("x", &xs), (rlx::autodiff::D_OUTPUT, &[1.0])];
    let want: Vec<f32> = xs
        .iter()
        .enumerate()
        .map(|(i, &v)| match i % 6 {
            0 | 1 => 2.0 * v,
            2 | 3 => 2.0,
            _ => 3.0 * v * v,
        })
        .collect();
    assert_eq!(run_plain(&out, feeds)[1], want);
    assert_eq!(run_plain(&d, feeds)[1], want);
}
