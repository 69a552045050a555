//! What the compiler tells about a compiled graph: the fusion report (regions of several
//! kinds, with several results), the dispatch report (every node native, fused or a leaf, and
//! the decompositions that ran first) and the SVG picture; and the fused program computes what
//! the unfused one does, bit for bit.

use rlx::opt::Dispatch;
use rlx::prelude::*;

/// A product, a dot_general the CPU decomposes, an elementwise chain whose middle value is a
/// graph output (a region with two results), and a product summed over rows (a multiply-reduce
/// region, as a softmax backward pass has).
const GRAPH: &str = r#"graph "reports" {
  %x = input {name = "x"} : f32[8, 16]
  %w = param {name = "w"} : f32[16, 16]
  %u = input {name = "u"} : f32[8, 16]
  %h = matmul %x, %w : f32[8, 16]
  %d = dot_general %u, %w {lhs_contract = [1], rhs_contract = [0], lhs_batch = [], rhs_batch = []} : f32[8, 16]
  %a = silu %h : f32[8, 16]
  %m = mul %a, %d : f32[8, 16]
  %e = exp %m : f32[8, 16]
  %t = tanh %e : f32[8, 16]
  %p = mul %t, %u : f32[8, 16]
  %r = reduce %p {kind = sum, axes = [1], keepdims = true} : f32[8, 1]
  %s = sub %e, %r : f32[8, 16]
  return %m, %s
}"#;

fn inputs() -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let v = |n: usize, k: usize| {
        (0..n)
            .map(|i| ((i * k) % 23) as f32 / 23.0 - 0.5)
            .collect::<Vec<f32>>()
    };
    (v(128, 7), v(128, 11), v(256, 5))
}

fn run(session: Session) -> (CompiledGraph, Vec<Vec<f32>>) {
    let g = Graph::parse(GRAPH).expect("parses");
    let mut c = session.try_compile(g).expect("compiles");
    let (x, u, w) = inputs();
    c.set_param("w", &w);
    let out = c.run(&[("x", &x), ("u", &u)]);
    (c, out)
}

#[test]
fn reports_say_what_was_fused_and_what_runs_where() {
    let (c, fused_out) = run(Session::new(Device::Cpu));
    let fusion = c.fusion_report();
    let kinds: Vec<FusionKind> = fusion.regions.iter().map(|r| r.kind).collect();
    assert!(
        kinds.contains(&FusionKind::Elementwise) && kinds.contains(&FusionKind::MultiplyReduce),
        "{fusion}"
    );
    assert!(
        fusion.regions.iter().any(|r| !r.stored.is_empty()),
        "the output %m is stored by its region: {fusion}"
    );
    assert!(fusion.ops_after.values().sum::<usize>() < fusion.ops_before.values().sum::<usize>());

    let d = c.dispatch_report();
    assert_eq!(d.backend, "cpu");
    assert_eq!(d.nodes.len(), c.graph().len());
    assert!(d.decomposed.contains_key("decompose:dot_general"), "{d}");
    assert!(
        d.decomposed_at
            .iter()
            .any(|s| s.op == "dot_general" && s.rule == "decompose:dot_general"),
        "{d}"
    );
    let fusion_record = c
        .pass_records()
        .iter()
        .find(|r| r.pass == "fusion")
        .expect("a fusion record");
    assert_eq!(
        fusion_record.fired.get("fuse:multiply_reduce"),
        Some(&1),
        "{:?}",
        fusion_record.fired
    );
    let (_, native, fused, results, unsupported) = d.counts();
    assert_eq!(unsupported, 0, "{d}");
    assert!(
        native >= 2 && fused == fusion.regions.len() && results >= 1,
        "{d}"
    );
    for n in &d.nodes {
        let is_fused = matches!(n.dispatch, Dispatch::Fused { .. });
        assert_eq!(is_fused, n.op == "fused", "{n:?}");
    }
    let text = d.to_string();
    assert!(
        text.contains("fused region")
            && text.contains("multiply_reduce")
            && text.contains("decompose:dot_general"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&d.to_json()).expect("dispatch JSON");
    assert_eq!(
        json["nodes"].as_array().map(Vec::len),
        Some(c.graph().len())
    );
    let json: serde_json::Value = serde_json::from_str(&fusion.to_json()).expect("fusion JSON");
    assert!(json["regions"].as_array().is_some_and(|r| !r.is_empty()));

    // The same graph without fusion gives the same bits.
    let (plain, plain_out) = run(Session::new(Device::Cpu).without_optimizations());
    assert!(plain.fusion_report().regions.is_empty());
    assert_eq!(fused_out, plain_out);
}

#[test]
fn the_svg_draws_every_node_and_boxes_fused_regions() {
    let (c, _) = run(Session::new(Device::Cpu));
    let svg = rlx::ir::svg::to_svg(c.graph());
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<rect").count(), c.graph().len());
    assert_eq!(svg.matches("<g>").count(), svg.matches("</g>").count());
    assert!(
        svg.contains("fused elementwise") && svg.contains("fused multiply_reduce"),
        "{svg}"
    );
    assert!(svg.contains("class=\"fused\"") && svg.contains("f32[8, 16]"));
    let edges: usize = c.graph().nodes().iter().map(|n| n.inputs.len()).sum();
    assert_eq!(
        svg.matches("marker-end").count(),
        edges,
        "one arrow (or stub) per operand"
    );
}
