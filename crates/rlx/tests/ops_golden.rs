//! The op table: every case in `golden/ops.json` (computed with numpy / JAX by
//! `golden/gen_ops.py`; regenerate with `scripts/regen-goldens.sh`) is built as a one-op graph,
//! compiled for the CPU and compared with the reference within the case's tolerance.

mod common;

use common::table::{cases, dtype, op_of, usizes};
use common::{decode, encode};
use rlx::prelude::*;
use serde_json::Value;
use std::collections::BTreeSet;

/// Build, compile and run one case; `Err` describes a mismatch.
fn run_case(case: &Value, optimize: bool) -> Result<(), String> {
    let name = case["name"].as_str().expect("name");
    let mut g = Graph::new(name);
    let mut args = Vec::new();
    let mut feeds = Vec::new();
    for (i, inp) in case["inputs"].as_array().expect("inputs").iter().enumerate() {
        let dt = dtype(&inp["dtype"]);
        let dims = usizes(&inp["shape"]);
        let data: Vec<f64> = inp["data"].as_array().expect("data").iter().map(|v| v.as_f64().expect("number")).collect();
        let id = g.input(&format!("in{i}"), Shape::new(&dims, dt));
        let id = match inp.get("perm") {
            Some(p) => g.transpose(id, &usizes(p)),
            None => id,
        };
        args.push(id);
        feeds.push((format!("in{i}"), encode(&data, dt), dt));
    }
    let op = op_of(case["op"].as_str().expect("op"), &case["attrs"]);
    let out = g.try_op(op, &args).map_err(|e| format!("building: {e}"))?;
    g.set_outputs(vec![out]);
    let want = &case["expected"];
    let want_dt = dtype(&want["dtype"]);
    let want_dims = usizes(&want["shape"]);
    if *g.shape(out) != Shape::new(&want_dims, want_dt) {
        return Err(format!("shape {} but reference is {want_dt}{want_dims:?}", g.shape(out)));
    }
    let session = if optimize { Session::new(Device::Cpu) } else { Session::new(Device::Cpu).without_optimizations() };
    let mut c = session.try_compile(g).map_err(|e| format!("compiling: {e}"))?;
    let feeds_ref: Vec<(&str, &[u8], DType)> = feeds.iter().map(|(n, b, d)| (n.as_str(), b.as_slice(), *d)).collect();
    let outs = c.try_run_typed(&feeds_ref).map_err(|e| format!("running: {e}"))?;
    let got = decode(&outs[0].0, outs[0].1);
    let exp: Vec<f64> = want["data"].as_array().expect("data").iter().map(|v| v.as_f64().expect("number")).collect();
    // The file holds the shortest decimal of each value in its dtype; round it back to that dtype.
    let exp = decode(&encode(&exp, want_dt), want_dt);
    let (rtol, atol) = (case["rtol"].as_f64().unwrap_or(0.0), case["atol"].as_f64().unwrap_or(0.0));
    if got.len() != exp.len() {
        return Err(format!("{} values, reference has {}", got.len(), exp.len()));
    }
    for (i, (g, e)) in got.iter().zip(&exp).enumerate() {
        if (g - e).abs() > atol + rtol * e.abs() || g.is_nan() {
            return Err(format!("element {i}: got {g}, reference {e} (rtol {rtol}, atol {atol})"));
        }
    }
    Ok(())
}

/// Every case, at every instruction-set level the CPU can run (AVX-512, AVX2, portable), so
/// each SIMD variant of every kernel meets the numpy/JAX references.
fn check_all(optimize: bool) {
    let cases = cases();
    rlx_cpu::isa::for_each_level(|level| {
        let failures: Vec<String> = cases
            .iter()
            .filter_map(|c| run_case(c, optimize).err().map(|e| format!("{}: {e}", c["name"].as_str().unwrap_or("?"))))
            .collect();
        assert!(failures.is_empty(), "{} of {} cases fail at level {level}:\n{}", failures.len(), cases.len(), failures.join("\n"));
    });
}

#[test]
fn every_case_matches_the_reference() {
    check_all(true);
}

#[test]
fn every_case_matches_without_optimizations() {
    check_all(false);
}

/// Every op of the IR appears in the table (a new op needs its row).
#[test]
fn the_table_covers_every_op() {
    let covered: BTreeSet<String> = cases().iter().map(|c| op_of(c["op"].as_str().unwrap(), &c["attrs"]).name().to_string()).collect();
    let ops = [
        "add", "sub", "mul", "div", "max", "min", "pow", "eq", "ne", "lt", "le", "gt", "ge", "where", "gelu", "gelu_approx", "silu",
        "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "neg", "abs", "sin", "cos", "tan", "atan", "round", "erf", "cast",
        "matmul", "dot_general", "reduce", "softmax", "layer_norm", "rms_norm", "reshape", "transpose", "narrow", "concat",
        "expand", "gather", "scatter_add", "cumsum", "topk", "attention", "rope", "conv", "pool",
    ];
    let missing: Vec<&str> = ops.iter().copied().filter(|o| !covered.contains(*o)).collect();
    assert!(missing.is_empty(), "ops without golden cases: {missing:?}");
}
