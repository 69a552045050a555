//! `vmap` checked against a loop, for every case of the op table and several batching patterns:
//! every input batched on axis 0, one input batched on its last axis, one input batched and the
//! rest shared. The batched graph runs once; the loop runs the original graph per example.

mod common;

use common::table::{cases, dtype, op_of, usizes};
use common::{decode, encode};
use rlx::autodiff::vmap_axes;
use rlx::prelude::*;
use serde_json::Value;
use std::collections::BTreeSet;

const B: usize = 3;

/// Batching patterns vmap must refuse with a named "no batching rule" error, and why: the KV
/// cache is state updated in place (a batch of caches is the paged cache of serving), and a
/// batch of packed quantized weights would need one weight matrix per example.
fn unbatchable(c: &Value, axes: &[(usize, usize)]) -> Option<&'static str> {
    match c["op"].as_str().unwrap_or("") {
        "cache_write" | "cached_attention" | "paged_attention" => {
            Some("the KV cache is state updated in place")
        }
        "dequant_matmul" | "quant_linear" if axes.iter().any(|&(i, _)| i == 1) => {
            Some("packed weights are shared by every example")
        }
        _ => None,
    }
}

/// Insert the examples as a new axis `axis` of `shape` (each c64 element is two values, so the
/// run length comes from the examples' length).
fn stack_at(examples: &[Vec<f64>], shape: &[usize], axis: usize) -> Vec<f64> {
    let outer: usize = shape[..axis].iter().product();
    let inner = examples.first().map_or(0, |e| e.len()) / outer.max(1);
    let mut out = Vec::with_capacity(outer * inner * examples.len());
    for o in 0..outer {
        for ex in examples {
            out.extend_from_slice(&ex[o * inner..(o + 1) * inner]);
        }
    }
    out
}

struct Case {
    graph: Graph,
    names: Vec<String>,
    shapes: Vec<Vec<usize>>,
    dtypes: Vec<DType>,
    /// Per input, per example.
    data: Vec<Vec<Vec<f64>>>,
}

fn build(c: &Value) -> Case {
    let mut g = Graph::new("one");
    let (mut names, mut shapes, mut dtypes, mut data, mut args) =
        (vec![], vec![], vec![], vec![], vec![]);
    for (i, inp) in c["inputs"].as_array().unwrap().iter().enumerate() {
        let dt = dtype(&inp["dtype"]);
        let dims = usizes(&inp["shape"]);
        let base: Vec<f64> = inp["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let name = format!("in{i}");
        let id = g.input(&name, Shape::new(&dims, dt));
        args.push(match inp.get("perm") {
            Some(p) => g.transpose(id, &usizes(p)),
            None => id,
        });
        // Floats differ per example; indices, conditions and positions stay valid as they are.
        let per: Vec<Vec<f64>> = (0..B)
            .map(|b| {
                if dt.is_float() || dt == DType::C64 {
                    base.iter()
                        .map(|v| v + 0.125 * b as f64 * v.abs().max(0.5))
                        .collect()
                } else {
                    base.clone()
                }
            })
            .collect();
        names.push(name);
        shapes.push(dims);
        dtypes.push(dt);
        data.push(per);
    }
    let y = g.op(op_of(c["op"].as_str().unwrap(), &c["attrs"]), &args);
    g.set_outputs(vec![y]);
    Case {
        graph: g,
        names,
        shapes,
        dtypes,
        data,
    }
}

/// Run the batched graph for `axes` (input index -> batch axis) and compare with the loop.
fn check(c: &Value, case: &Case, axes: &[(usize, usize)], out_axis: usize) -> Result<(), String> {
    let in_axes: Vec<(&str, usize)> = axes
        .iter()
        .map(|&(i, a)| (case.names[i].as_str(), a))
        .collect();
    let vg = vmap_axes(&case.graph, &in_axes, B, &[out_axis]).map_err(|e| format!("vmap: {e}"))?;
    let s = Session::new(Device::Cpu);
    let mut vc = s
        .try_compile(vg)
        .map_err(|e| format!("compiling the batched graph: {e}"))?;
    let mut feeds = Vec::new();
    for i in 0..case.names.len() {
        let bytes = match axes.iter().find(|(j, _)| *j == i) {
            Some(&(_, a)) => encode(&stack_at(&case.data[i], &case.shapes[i], a), case.dtypes[i]),
            None => encode(&case.data[i][0], case.dtypes[i]),
        };
        feeds.push((case.names[i].as_str(), bytes, case.dtypes[i]));
    }
    let f: Vec<(&str, &[u8], DType)> = feeds
        .iter()
        .map(|(n, b, d)| (*n, b.as_slice(), *d))
        .collect();
    let out = vc
        .try_run_typed(&f)
        .map_err(|e| format!("running the batched graph: {e}"))?;
    let got = decode(&out[0].0, out[0].1);
    let mut one = s.compile(case.graph.clone());
    let mut per_example = Vec::new();
    for b in 0..B {
        let fb: Vec<(String, Vec<u8>, DType)> = (0..case.names.len())
            .map(|i| {
                let ex = if axes.iter().any(|(j, _)| *j == i) {
                    b
                } else {
                    0
                };
                (
                    case.names[i].clone(),
                    encode(&case.data[i][ex], case.dtypes[i]),
                    case.dtypes[i],
                )
            })
            .collect();
        let fr: Vec<(&str, &[u8], DType)> = fb
            .iter()
            .map(|(n, b, d)| (n.as_str(), b.as_slice(), *d))
            .collect();
        let o = one.run_typed(&fr);
        per_example.push(decode(&o[0].0, o[0].1));
    }
    let yshape = case
        .graph
        .shape(case.graph.outputs()[0])
        .static_dims()
        .unwrap();
    let want = stack_at(&per_example, &yshape, out_axis);
    if got.len() != want.len() {
        return Err(format!("{} values, loop gives {}", got.len(), want.len()));
    }
    let tol = c["rtol"].as_f64().unwrap_or(0.0).max(1e-5) * 4.0;
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        if (a - b).abs() > tol * (1.0 + b.abs()) {
            return Err(format!("element {i}: vmap {a}, loop {b}"));
        }
    }
    Ok(())
}

#[test]
fn vmap_matches_a_loop_for_every_op() {
    let mut failures = Vec::new();
    let mut ops = BTreeSet::new();
    let mut checks = 0;
    for c in cases() {
        let case = build(&c);
        let n = case.names.len();
        let yrank = case.graph.shape(case.graph.outputs()[0]).rank();
        let mut patterns: Vec<(Vec<(usize, usize)>, usize)> =
            vec![((0..n).map(|i| (i, 0)).collect(), 0)];
        patterns.push((vec![(0, case.shapes[0].len())], yrank));
        if n > 1 {
            patterns.push((vec![(n - 1, 0)], 0));
        }
        for (axes, out_axis) in patterns {
            let refused = unbatchable(&c, &axes);
            match (check(&c, &case, &axes, out_axis), refused) {
                (Ok(()), None) => checks += 1,
                (Err(e), Some(_)) if e.contains("no batching rule") => checks += 1,
                (Ok(()), Some(why)) => failures.push(format!(
                    "{} {axes:?}: vmap should refuse ({why})",
                    c["name"].as_str().unwrap()
                )),
                (Err(e), _) => failures.push(format!(
                    "{} {axes:?} -> {out_axis}: {e}",
                    c["name"].as_str().unwrap()
                )),
            }
        }
        ops.insert(c["op"].as_str().unwrap().to_string());
    }
    assert!(
        failures.is_empty(),
        "{} of {} checks fail:\n{}",
        failures.len(),
        checks + failures.len(),
        failures.join("\n")
    );
    eprintln!("{checks} vmap checks over {} ops", ops.len());
}
