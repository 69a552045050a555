//! File tests of the passes (cranelift's filetests): each `tests/filetests/*.rlx` file holds
//! comment lines describing it, a `; passes:` line, an input graph in the text form, and after a
//! `; output` line what the passes make of it: the rules that fired in each pass, the estimated
//! cost before and after, and the resulting graph. The test fails when the output differs;
//! `RLX_BLESS=1 cargo test -p rlx-opt --test filetests` rewrites the files with what the passes
//! produce now (review the diff before committing it).
//!
//! Passes by name: `simplify`, `cse`, `dce`, `const_fold`, `fuse_elementwise` and
//! `fuse_patterns` (a file starting with one also shows its fusion report), `quant_propagate`
//! (a QDQ graph folded into int8 ops), and `decompose=op+op` (the decomposition a backend
//! lacking those ops gets; `decompose=fused` inlines fused regions). Rule lists must never make a graph worse:
//! unless a file decomposes, its cost after may not exceed its cost before.

use rlx_ir::{ops, Graph, NodeId, OpKind};
use rlx_opt::{
    AlgebraicSimplify, CompilePipeline, ConstantFolding, Cse, DeadCodeElimination, Decompose,
    FuseElementwise, FusePatterns, FusionOptions, Pass, QuantPropagate,
};
use std::fmt::Write;
use std::path::Path;

const OUTPUT: &str = "; output";

fn pass_of<'a>(
    name: &str,
    supports: &'a dyn Fn(&Graph, NodeId) -> bool,
) -> Result<Box<dyn Pass + 'a>, String> {
    Ok(match name {
        "simplify" => Box::new(AlgebraicSimplify),
        "cse" => Box::new(Cse),
        "dce" => Box::new(DeadCodeElimination),
        "const_fold" => Box::new(ConstantFolding {
            max_elements: 1 << 16,
        }),
        "fuse_elementwise" => Box::new(FuseElementwise::new(FusionOptions::default())),
        "fuse_patterns" => Box::new(FusePatterns::new(FusionOptions::default(), None)),
        "quant_propagate" => Box::new(QuantPropagate),
        _ if name.starts_with("decompose=") => Box::new(Decompose {
            backend: "filetest",
            supports,
            why: None,
        }),
        other => return Err(format!("unknown pass `{other}`")),
    })
}

/// The output section the passes produce for a file's input.
fn run_file(text: &str) -> Result<String, String> {
    let passes_line = text
        .lines()
        .find_map(|l| l.strip_prefix("; passes:"))
        .ok_or("no `; passes:` line")?;
    let input = text.split(OUTPUT).next().unwrap_or(text);
    // The graph starts at the first line that begins with `graph`.
    let start = input.lines().scan(0, |off, l| {
        let at = *off;
        *off += l.len() + 1;
        Some((at, l))
    });
    let at = start
        .filter(|(_, l)| l.starts_with("graph "))
        .map(|(a, _)| a)
        .next()
        .ok_or("no input graph")?;
    let graph_text = &input[at..];
    let g = Graph::parse(graph_text).map_err(|e| format!("input: {e}"))?;
    // The ops named by `decompose=a+b` are the ones the imagined backend lacks.
    let mut lacks: Vec<OpKind> = Vec::new();
    for list in passes_line
        .split_whitespace()
        .filter_map(|p| p.strip_prefix("decompose="))
    {
        for k in list.split('+') {
            lacks.push(OpKind::from_name(k).ok_or(format!("unknown op `{k}`"))?);
        }
    }
    let decomposes = !lacks.is_empty();
    let supports = |g: &Graph, id: NodeId| !lacks.contains(&g.node(id).op.kind());
    let mut pipeline = CompilePipeline::new().verify_each(true).dump_to(None);
    for name in passes_line.split_whitespace() {
        pipeline = pipeline.with_boxed_pass(pass_of(name, &supports)?);
    }
    let res = pipeline.run(&g).map_err(|e| format!("passes: {e}"))?;
    let mut out = String::new();
    for r in &res.records {
        let fired: Vec<String> = r.fired.iter().map(|(k, v)| format!("{k} x{v}")).collect();
        let _ = writeln!(
            out,
            "; {}: {} -> {} nodes; fired: {}",
            r.pass,
            r.nodes_before,
            r.nodes_after,
            if fired.is_empty() {
                "nothing".into()
            } else {
                fired.join(", ")
            }
        );
    }
    let (before, after) = (ops::graph_cost(&g), ops::graph_cost(&res.graph));
    let _ = writeln!(
        out,
        "; cost: {} -> {} flops, {} -> {} bytes",
        before.flops, after.flops, before.bytes, after.bytes
    );
    if !decomposes && (after.flops > before.flops || after.bytes > before.bytes) {
        return Err(format!(
            "the passes made the graph worse:\n{out}{}",
            res.graph
        ));
    }
    // A file that starts by fusing also shows the fusion report (decisions and reasons).
    let first = passes_line.split_whitespace().next();
    if matches!(first, Some("fuse_elementwise" | "fuse_patterns")) {
        let report = if first == Some("fuse_elementwise") {
            FuseElementwise::new(FusionOptions::default()).fuse(&g)
        } else {
            FusePatterns::new(FusionOptions::default(), None)
                .fuse_mapped(&g)
                .map(|(g, r, _)| (g, r))
        }
        .map_err(|e| e.to_string())?
        .1;
        for line in report.to_string().lines() {
            let _ = writeln!(out, "; {line}");
        }
    }
    let _ = writeln!(out, "{}", res.graph);
    Ok(out)
}

#[test]
fn filetests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let bless = rlx_ir::env::get(rlx_ir::env::BLESS).as_deref() == Some("1");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/filetests")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rlx"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "expected the filetests in {}",
        dir.display()
    );
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("readable");
        let got = match run_file(&text) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let want = text.split_once(&format!("{OUTPUT}\n")).map(|(_, w)| w);
        if want == Some(got.as_str()) {
            continue;
        }
        if bless {
            let head = text.split(OUTPUT).next().unwrap_or(&text).trim_end();
            std::fs::write(path, format!("{head}\n\n{OUTPUT}\n{got}")).expect("writable");
        } else {
            failures.push(format!(
                "{}: output differs (RLX_BLESS=1 to accept it)\n--- want\n{}\n--- got\n{got}",
                path.display(),
                want.unwrap_or("(none)")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} filetests fail:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}
