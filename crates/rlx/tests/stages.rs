//! HIR → MIR → LIR: the GPT is written with blocks (HIR), lowered by their rules to MIR, and
//! planned (LIR); the inspection text shows each stage and `dump_to` writes them.

use rlx::models::{Gpt, GptConfig};
use rlx::opt::{
    inspect_hir, inspect_lir, inspect_mir, inspect_mir_diff, inspect_pipeline, AlgebraicSimplify,
    CompilePipeline, Cse, DeadCodeElimination, GraphModule, Stage,
};
use rlx::prelude::*;

fn gpt() -> Graph {
    Gpt::new(GptConfig {
        vocab: 10,
        ctx: 8,
        dim: 16,
        heads: 2,
        layers: 2,
    })
    .unwrap()
    .training_graph(2)
    .unwrap()
}

fn count(g: &Graph, name: &str) -> usize {
    g.ids().filter(|&i| g.node(i).op.name() == name).count()
}

#[test]
fn the_gpt_is_hir_and_lowers_to_mir_by_its_block_rules() {
    let g = gpt();
    assert_eq!(count(&g, "transformer_block"), 2);
    assert_eq!(count(&g, "embedding"), 1);
    assert_eq!(count(&g, "linear"), 1);
    let m = GraphModule::new(g.clone());
    assert_eq!(m.stage(), Stage::Hir);
    let (mir, rec) = m.to_mir().unwrap();
    assert_eq!(mir.stage(), Stage::Mir);
    assert_eq!(rec.fired["lower:transformer_block"], 2);
    assert_eq!(rec.fired["lower:embedding"], 1);
    assert_eq!(rec.fired["lower:linear"], 1);
    let mg = mir.graph();
    assert!(mg
        .ids()
        .all(|i| !rlx::ir::ops::blocks::is_block(&mg.node(i).op)));
    // Two attentions, one per block; products: 4 per block and the head.
    assert_eq!(count(mg, "attention"), 2);
    assert_eq!(count(mg, "matmul"), 9);
    // The HIR text parses back (blocks are ops of the text form).
    let back = Graph::parse(&g.to_string()).unwrap();
    assert_eq!(back.to_string(), g.to_string());
    // A module of a block-free graph is MIR already.
    assert_eq!(GraphModule::new(mg.clone()).stage(), Stage::Mir);
    // A session lowers the blocks first and records each block's rule.
    let c = Session::new(Device::Cpu).compile(g);
    let rec = c
        .pass_records()
        .iter()
        .find(|r| r.pass == "lower_hir")
        .expect("a lower_hir record");
    assert_eq!(
        rec.fired.get("lower:transformer_block"),
        Some(&2),
        "{rec:?}"
    );
    assert!(c
        .graph()
        .ids()
        .all(|i| !rlx::ir::ops::blocks::is_block(&c.graph().node(i).op)));
}

#[test]
fn the_lir_plan_keeps_live_buffers_apart_and_lists_the_io() {
    let g = gpt();
    let pipe = CompilePipeline::new()
        .with_pass(AlgebraicSimplify)
        .with_pass(Cse)
        .with_pass(DeadCodeElimination)
        .dump_to(None);
    let (lir, result) = pipe.compile_module(&GraphModule::new(g.clone())).unwrap();
    assert_eq!(result.records[0].pass, "lower_hir");
    assert_eq!(lir.stage(), Stage::Lir);
    let plan = lir.lir().unwrap();
    let mg = lir.graph();
    // Every computed value has a buffer or is a view of one.
    for &id in &plan.schedule {
        let owned = plan.buffers.iter().any(|b| b.node == id);
        let viewed = plan.aliases.iter().any(|&(v, _)| v == id);
        assert!(owned ^ viewed, "{id}: buffer {owned}, alias {viewed}");
    }
    for (i, a) in plan.buffers.iter().enumerate() {
        assert!(a.offset + a.bytes <= plan.arena_bytes);
        assert_eq!(a.bytes, mg.shape(a.node).size_bytes().unwrap());
        for b in &plan.buffers[i + 1..] {
            let live = a.live.0 <= b.live.1 && b.live.0 <= a.live.1;
            let overlap = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            assert!(
                !(live && overlap),
                "{} and {} overlap while live",
                a.node,
                b.node
            );
        }
    }
    let names =
        |v: &[rlx::opt::IoEntry]| -> Vec<String> { v.iter().map(|e| e.name.clone()).collect() };
    assert_eq!(names(&plan.inputs), vec!["tokens", "targets"]);
    assert_eq!(plan.params.len(), 2 + 6 * 2 + 2);
    assert_eq!(plan.outputs.len(), 1);
    // The loss is live to the end.
    let out = plan.outputs[0].node;
    let b = plan.buffers.iter().find(|b| b.node == out).unwrap();
    assert_eq!(b.live.1, plan.schedule.len());
    let text = inspect_lir(&lir).unwrap();
    for part in [
        "; stage lir",
        "; manifest",
        "input \"tokens\"",
        "; schedule",
        "; aliases",
        "; buffers (arena",
    ] {
        assert!(text.contains(part), "{part} missing from:\n{text}");
    }
}

#[test]
fn inspection_shows_every_stage_and_dumps_write_them() {
    let g = gpt();
    let m = GraphModule::new(g.clone());
    assert!(inspect_hir(&m).contains("transformer_block"));
    let mir = inspect_mir(&m).unwrap();
    assert!(mir.starts_with("; stage mir") && !mir.contains("transformer_block"));
    let all = inspect_pipeline(&g, &CompilePipeline::new().with_pass(Cse).dump_to(None)).unwrap();
    let (h, mi, l) = (
        all.find("; stage hir").unwrap(),
        all.find("; stage mir").unwrap(),
        all.find("; stage lir").unwrap(),
    );
    assert!(h < mi && mi < l);
    let dir = std::env::temp_dir().join(format!("rlx-stages-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    CompilePipeline::new()
        .with_pass(Cse)
        .dump_to(Some(dir.clone()))
        .compile_module(&m)
        .unwrap();
    for stage in ["hir", "mir", "lir"] {
        let p = dir.join(format!("gpt_train.{stage}.txt"));
        let t = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(t.starts_with(&format!("; stage {stage}")));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_mir_diff_shows_what_a_pass_changed() {
    let mut g = Graph::new("d");
    let x = g.input("x", Shape::new(&[4], DType::F32));
    let z = g.scalar(-0.0, DType::F32);
    let z = g.expand(z, &[4]);
    let y = g.add(x, z);
    let y = g.activation(rlx::ops::Activation::Relu, y);
    g.set_outputs(vec![y]);
    let after = CompilePipeline::new()
        .with_pass(AlgebraicSimplify)
        .with_pass(DeadCodeElimination)
        .dump_to(None)
        .run(&g)
        .unwrap()
        .graph;
    let d = inspect_mir_diff(&g, &after);
    assert!(
        d.lines().any(|l| l.starts_with("- ") && l.contains("add")),
        "{d}"
    );
    assert!(
        d.lines().any(|l| l.starts_with("+ ") && l.contains("relu")),
        "{d}"
    );
    assert!(
        d.lines()
            .any(|l| l.starts_with("  ") && l.contains("input")),
        "{d}"
    );
    assert_eq!(inspect_mir_diff(&g, &g), "");
}
