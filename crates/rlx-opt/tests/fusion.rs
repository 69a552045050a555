//! The elementwise fusion pass keeps the graph's meaning (the reference evaluator gives the same
//! bits before and after), its report serializes, and switching it off forms nothing.

use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::{DType, FusionKind, Graph, NodeId, Op};
use rlx_opt::{FuseElementwise, FusionOptions, MissReason};
use std::collections::BTreeMap;

const MLP: &str = r#"graph "mlp" {
  %x = input {name = "x"} : f32[2, 4]
  %w = input {name = "w"} : f32[4, 4]
  %up = input {name = "up"} : f32[2, 4]
  %bias = input {name = "bias"} : f32[4]
  %gate = matmul %x, %w : f32[2, 4]
  %s = silu %gate : f32[2, 4]
  %m = mul %s, %up : f32[2, 4]
  %b = add %m, %bias : f32[2, 4]
  %e = exp %b : f32[2, 4]
  %sm = softmax %e {axis = 1} : f32[2, 4]
  %t = tanh %sm : f32[2, 4]
  %o = neg %t : f32[2, 4]
  %r = mul %e, %e : f32[2, 4]
  %q = sqrt %r : f32[2, 4]
  %c = cast %q {to = f16} : f16[2, 4]
  return %o, %c
}"#;

fn leaves(g: &Graph) -> BTreeMap<String, Tensor> {
    g.inputs()
        .into_iter()
        .chain(g.params())
        .map(|(name, id)| {
            let dims = g.shape(id).static_dims().expect("static");
            let n: usize = dims.iter().product();
            let vals = (0..n)
                .map(|i| ((i * 7 + name.len()) % 11) as f64 * 0.25 - 1.0)
                .collect();
            (name.to_string(), Tensor::from_f64(&dims, DType::F32, vals))
        })
        .collect()
}

#[test]
fn fusion_keeps_the_meaning_and_reports_every_decision() {
    let g = Graph::parse(MLP).expect("parses");
    let (fused, report) = FuseElementwise::new(FusionOptions::default())
        .fuse(&g)
        .expect("fuses");
    rlx_ir::verify(&fused).expect("the fused graph verifies");
    let regions = fused
        .nodes()
        .iter()
        .filter(|n| matches!(&n.op, Op::Fused(r) if r.kind == FusionKind::Elementwise))
        .count();
    assert_eq!(regions, 3, "{fused}");
    assert_eq!(report.regions.len(), 3);
    let before = evaluate(&g, &leaves(&g)).expect("evaluates");
    let after = evaluate(&fused, &leaves(&g)).expect("evaluates");
    assert_eq!(before, after);
    // The matmul and softmax are candidates that could not join, with a reason and a hint.
    let matmul = report
        .candidates
        .iter()
        .find(|c| c.op == "matmul")
        .expect("the matmul is a candidate");
    assert_eq!(matmul.miss, Some(MissReason::NotElementwise));
    assert!(!MissReason::NotElementwise.hint().is_empty());
    assert_eq!(report.ops_before["silu"], 1);
    assert_eq!(report.ops_after["fused:elementwise"], 3);
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).expect("json");
    assert_eq!(json["regions"].as_array().map(Vec::len), Some(3));
    assert!(
        report.to_string().contains("region 0 (elementwise)"),
        "{report}"
    );
    // The fused graph prints and parses like any other.
    assert_eq!(Graph::parse(&fused.to_string()).expect("parses"), fused);
}

#[test]
fn switched_off_fusion_forms_no_region_and_says_why() {
    let g = Graph::parse(MLP).expect("parses");
    let (out, report) = FuseElementwise::new(FusionOptions {
        elementwise: false,
        ..Default::default()
    })
    .fuse(&g)
    .expect("runs");
    assert_eq!(out, g);
    assert!(report.regions.is_empty());
    assert!(report
        .candidates
        .iter()
        .filter(|c| c.op == "silu")
        .all(|c| c.miss == Some(MissReason::Disabled)));
}

#[test]
fn regions_respect_the_size_limit() {
    let g = Graph::parse(MLP).expect("parses");
    let (_, report) = FuseElementwise::new(FusionOptions {
        max_region_ops: 2,
        ..Default::default()
    })
    .fuse(&g)
    .expect("runs");
    assert!(
        report.regions.iter().all(|r| r.nodes.len() <= 2),
        "{report}"
    );
    assert!(
        report
            .candidates
            .iter()
            .any(|c| c.miss == Some(MissReason::RegionFull)),
        "{report}"
    );
}

/// The input graph of a filetest.
fn filetest_input(name: &str) -> Graph {
    let text = std::fs::read_to_string(format!(
        "{}/tests/filetests/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("filetest");
    let input: String = text
        .split("; output")
        .next()
        .expect("input")
        .lines()
        .filter(|l| !l.starts_with(';'))
        .collect::<Vec<_>>()
        .join("\n");
    Graph::parse(&input).expect("parses")
}

#[test]
fn pattern_regions_keep_the_meaning_and_take_only_what_a_backend_accepts() {
    let g = filetest_input("fusion_patterns.rlx");
    let all = |_: &Graph, _: NodeId, _: FusionKind| true;
    let (fused, report, map) =
        rlx_opt::plan::fuse(&g, FusionOptions::default(), &all).expect("fuses");
    rlx_ir::verify(&fused).expect("verifies");
    let kinds: Vec<FusionKind> = report.regions.iter().map(|r| r.kind).collect();
    for k in [
        FusionKind::Attention,
        FusionKind::GatedMlp,
        FusionKind::ResidualNorm,
        FusionKind::MatMulEpilogue,
        FusionKind::Elementwise,
    ] {
        assert!(kinds.contains(&k), "{k:?} missing: {report}");
    }
    assert_eq!(map.len(), g.len());
    assert_eq!(
        evaluate(&g, &leaves(&g)).expect("evaluates"),
        evaluate(&fused, &leaves(&g)).expect("evaluates")
    );
    // A backend taking only attention gets only that (and elementwise regions it also takes).
    let attention = |g: &Graph, id: NodeId, k: FusionKind| {
        k == FusionKind::Attention
            || (k == FusionKind::Elementwise && rlx_opt::fusion::elementwise(&g.node(id).op))
    };
    let (_, report, _) =
        rlx_opt::plan::fuse(&g, FusionOptions::default(), &attention).expect("fuses");
    assert!(
        report
            .regions
            .iter()
            .all(|r| matches!(r.kind, FusionKind::Attention | FusionKind::Elementwise)),
        "{report}"
    );
    assert_eq!(
        report
            .regions
            .iter()
            .filter(|r| r.kind == FusionKind::Attention)
            .count(),
        1
    );
    // Switched off, nothing is formed.
    let off = FusionOptions {
        elementwise: false,
        patterns: false,
        ..Default::default()
    };
    let (same, report, _) = rlx_opt::plan::fuse(&g, off, &all).expect("runs");
    assert!(report.regions.is_empty());
    assert_eq!(same.len(), g.len());
}

#[test]
fn optimizer_updates_are_marked_where_the_backend_takes_them() {
    let g = Graph::parse(
        r#"graph "sgd" {
  %p = param {name = "p"} : f32[8]
  %g = input {name = "g"} : f32[8]
  %lr = constant {data = 0x0ad7233c} : f32[]
  %s = mul %g, %lr : f32[8]
  %n = sub %p, %s : f32[8]
  return %n
}"#,
    )
    .expect("parses");
    let all = |g: &Graph, id: NodeId, k: FusionKind| {
        k != FusionKind::Elementwise || rlx_opt::fusion::elementwise(&g.node(id).op)
    };
    let updates = [("p".to_string(), 0)];
    let (fused, plan) =
        rlx_opt::prepare(&g, &rlx_opt::LoweringOptions::default(), &all, &updates).expect("plans");
    assert_eq!(plan.fusion.regions.len(), 1);
    assert_eq!(
        plan.fusion.regions[0].kind,
        FusionKind::Optimizer,
        "{}",
        plan.fusion
    );
    assert!(
        matches!(&fused.node(fused.outputs()[0]).op, Op::Fused(r) if r.kind == FusionKind::Optimizer)
    );
    assert_eq!(
        plan.donations,
        vec![rlx_opt::Donation {
            output: 0,
            param: "p".into()
        }]
    );
    // Without the update bound, it stays an elementwise region, and nothing is donated.
    let (_, plan) =
        rlx_opt::prepare(&g, &rlx_opt::LoweringOptions::default(), &all, &[]).expect("plans");
    assert_eq!(plan.fusion.regions[0].kind, FusionKind::Elementwise);
    assert!(plan.donations.is_empty());
}

#[test]
fn norm_matmul_regions_keep_the_meaning_and_name_their_parts() {
    let g = filetest_input("fusion_norm_matmul.rlx");
    let all = |_: &Graph, _: NodeId, _: FusionKind| true;
    let (fused, _, _) = rlx_opt::plan::fuse(&g, FusionOptions::default(), &all).expect("fuses");
    rlx_ir::verify(&fused).expect("verifies");
    assert_eq!(
        evaluate(&g, &leaves(&g)).expect("evaluates"),
        evaluate(&fused, &leaves(&g)).expect("evaluates")
    );
    let heads: Vec<NodeId> = fused
        .ids()
        .filter(|&id| {
            matches!(&fused.node(id).op, Op::Fused(r) if r.kind == FusionKind::NormMatMul && r.output == 0)
        })
        .collect();
    assert_eq!(heads.len(), 2, "{fused}");
    let leaf = |id: NodeId| match &fused.node(id).op {
        Op::Input { name } | Op::Param { name } => name.clone(),
        op => op.name().to_string(),
    };
    // The first takes the residual add, whose sum is its second result.
    let p = rlx_opt::norm_matmul_parts(&fused, heads[0]).expect("the pattern's shape");
    assert_eq!(p.scheme, None);
    assert_eq!(
        [leaf(p.x), leaf(p.gamma), leaf(p.w)],
        ["x", "g1", "w1"].map(String::from)
    );
    assert_eq!(p.residual.map(leaf).as_deref(), Some("r"));
    let sum = p.sum.expect("the sum is read after the product");
    assert_eq!(fused.fused_head(sum), Some(heads[0]));
    assert_eq!(rlx_opt::norm_matmul_parts(&fused, sum), Some(p));
    assert_eq!(p.eps, 1e-5);
    // The second's add is read before its product: it stays outside.
    let p = rlx_opt::norm_matmul_parts(&fused, heads[1]).expect("the pattern's shape");
    assert_eq!((leaf(p.x).as_str(), p.residual, p.sum), ("add", None, None));
    assert_eq!([leaf(p.gamma), leaf(p.w)], ["g2", "w2"].map(String::from));
    // A backend that takes no norm_matmul region gets none.
    let none = |_: &Graph, _: NodeId, k: FusionKind| k != FusionKind::NormMatMul;
    let (_, report, _) = rlx_opt::plan::fuse(&g, FusionOptions::default(), &none).expect("fuses");
    assert!(report
        .regions
        .iter()
        .all(|r| r.kind != FusionKind::NormMatMul));
}
