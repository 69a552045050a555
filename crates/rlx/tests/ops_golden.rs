//! The op table: every case in `golden/ops.json` (computed with numpy / JAX by
//! `golden/gen_ops.py`; regenerate with `scripts/regen-goldens.sh`) is built as a one-op graph,
//! compiled for the CPU and compared with the reference within the case's tolerance.

mod common;

use common::table::{cases, dtype, op_of, usizes};
use common::{decode, encode};
use rlx::prelude::*;
use serde_json::Value;
use std::collections::BTreeSet;

/// A case as a one-op graph with its feeds (name, bytes, dtype).
struct Built {
    g: Graph,
    feeds: Vec<(String, Vec<u8>, DType)>,
    /// Values of params (the cache a `cache_write` updates in place must be one).
    params: Vec<(String, Vec<u8>, DType)>,
}

fn build(case: &Value) -> Result<Built, String> {
    let name = case["name"].as_str().expect("name");
    let mut g = Graph::new(name);
    let mut args = Vec::new();
    let mut feeds = Vec::new();
    let mut params = Vec::new();
    let op_name = case["op"].as_str().expect("op");
    for (i, inp) in case["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .enumerate()
    {
        let dt = dtype(&inp["dtype"]);
        let dims = usizes(&inp["shape"]);
        let data: Vec<f64> = inp["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|v| v.as_f64().expect("number"))
            .collect();
        if op_name == "cache_write" && i == 0 {
            args.push(g.param(&format!("in{i}"), Shape::new(&dims, dt)));
            params.push((format!("in{i}"), encode(&data, dt), dt));
            continue;
        }
        let id = g.input(&format!("in{i}"), Shape::new(&dims, dt));
        let id = match inp.get("perm") {
            Some(p) => g.transpose(id, &usizes(p)),
            None => id,
        };
        args.push(id);
        feeds.push((format!("in{i}"), encode(&data, dt), dt));
    }
    let op = op_of(op_name, &case["attrs"]);
    let out = g.try_op(op, &args).map_err(|e| format!("building: {e}"))?;
    g.set_outputs(vec![out]);
    let want = &case["expected"];
    let (want_dt, want_dims) = (dtype(&want["dtype"]), usizes(&want["shape"]));
    if *g.shape(out) != Shape::new(&want_dims, want_dt) {
        return Err(format!(
            "shape {} but reference is {want_dt}{want_dims:?}",
            g.shape(out)
        ));
    }
    Ok(Built { g, feeds, params })
}

/// The case's expected values, rounded back to the result dtype (the file holds the shortest
/// decimal of each value in its dtype).
fn expected(case: &Value) -> Vec<f64> {
    let want = &case["expected"];
    let dt = dtype(&want["dtype"]);
    let exp: Vec<f64> = want["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|v| v.as_f64().expect("number"))
        .collect();
    decode(&encode(&exp, dt), dt)
}

/// Compare `got` with `want` within the case's tolerance.
fn compare(case: &Value, got: &[f64], want: &[f64], what: &str) -> Result<(), String> {
    let (rtol, atol) = (
        case["rtol"].as_f64().unwrap_or(0.0),
        case["atol"].as_f64().unwrap_or(0.0),
    );
    if got.len() != want.len() {
        return Err(format!("{} values, {what} has {}", got.len(), want.len()));
    }
    for (i, (g, e)) in got.iter().zip(want).enumerate() {
        if (g - e).abs() > atol + rtol * e.abs() || g.is_nan() != e.is_nan() {
            return Err(format!(
                "element {i}: got {g}, {what} {e} (rtol {rtol}, atol {atol})"
            ));
        }
    }
    Ok(())
}

/// Run a built case on the CPU backend.
fn run_cpu(b: &Built, optimize: bool) -> Result<Vec<f64>, String> {
    run_on(Device::Cpu, b, optimize)
}

/// Run a built case on `device`.
fn run_on(device: Device, b: &Built, optimize: bool) -> Result<Vec<f64>, String> {
    let session = if optimize {
        Session::new(device)
    } else {
        Session::new(device).without_optimizations()
    };
    let mut c = session
        .try_compile(b.g.clone())
        .map_err(|e| format!("compiling: {e}"))?;
    for (name, bytes, dt) in &b.params {
        c.try_set_param_typed(name, bytes, *dt)
            .map_err(|e| format!("setting {name}: {e}"))?;
    }
    let feeds_ref: Vec<(&str, &[u8], DType)> = b
        .feeds
        .iter()
        .map(|(n, b, d)| (n.as_str(), b.as_slice(), *d))
        .collect();
    let outs = c
        .try_run_typed(&feeds_ref)
        .map_err(|e| format!("running: {e}"))?;
    Ok(decode(&outs[0].0, outs[0].1))
}

/// Run a built case on the reference evaluator.
fn run_reference(b: &Built) -> Result<Vec<f64>, String> {
    let mut leaves = std::collections::BTreeMap::new();
    for (name, bytes, dt) in b.feeds.iter().chain(&b.params) {
        let dims = b
            .g
            .nodes()
            .iter()
            .find(|n| matches!(&n.op, Op::Input { name: m } | Op::Param { name: m } if m == name))
            .expect("a leaf")
            .shape
            .dims()
            .to_vec();
        let shape = Shape::with_dims(dims, *dt);
        leaves.insert(
            name.clone(),
            rlx::ir::eval::Tensor::from_bytes(&shape, bytes).map_err(|e| e.to_string())?,
        );
    }
    let out = rlx::ir::eval::evaluate(&b.g, &leaves).map_err(|e| format!("evaluating: {e}"))?;
    Ok(decode(&out[0].to_bytes(), out[0].dtype()))
}

/// Build, compile and run one case on the CPU; `Err` describes a mismatch with the golden.
fn run_case(case: &Value, optimize: bool) -> Result<(), String> {
    let b = build(case)?;
    compare(case, &run_cpu(&b, optimize)?, &expected(case), "reference")
}

/// Every case, at every instruction-set level the CPU can run (AVX-512, AVX2, portable), so
/// each SIMD variant of every kernel meets the numpy/JAX references.
fn check_all(optimize: bool) {
    let cases = cases();
    rlx_cpu::isa::for_each_level(|level| {
        let failures: Vec<String> = cases
            .iter()
            .filter_map(|c| {
                run_case(c, optimize)
                    .err()
                    .map(|e| format!("{}: {e}", c["name"].as_str().unwrap_or("?")))
            })
            .collect();
        assert!(
            failures.is_empty(),
            "{} of {} cases fail at level {level}:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
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

/// The reference evaluator meets the numpy/JAX goldens on every case, so it can be the oracle
/// of backend tests.
#[test]
fn the_reference_evaluator_matches_every_case() {
    let cases = cases();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            build(c)
                .and_then(|b| compare(c, &run_reference(&b)?, &expected(c), "golden"))
                .err()
                .map(|e| format!("{}: {e}", c["name"].as_str().unwrap_or("?")))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases fail on the reference evaluator:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The backend test (ggml `test-backend-ops`): every case on the CPU backend, optimized, against
/// the reference evaluator, at every instruction-set level.
#[test]
fn the_cpu_backend_matches_the_reference_evaluator() {
    let cases = cases();
    rlx_cpu::isa::for_each_level(|level| {
        let failures: Vec<String> = cases
            .iter()
            .filter_map(|c| {
                build(c)
                    .and_then(|b| {
                        compare(
                            c,
                            &run_cpu(&b, true)?,
                            &run_reference(&b)?,
                            "reference evaluator",
                        )
                    })
                    .err()
                    .map(|e| format!("{}: {e}", c["name"].as_str().unwrap_or("?")))
            })
            .collect();
        assert!(
            failures.is_empty(),
            "{} of {} cases differ at level {level}:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    });
}

/// The backend test on the GPU (wgpu; lavapipe in CI): every case whose graph compiles there
/// (f32 ops with a WGSL kernel, and composites decomposing into them) against the reference
/// evaluator, within 1e-5 relative (or the case's own, looser, tolerance). A missing adapter is
/// a failure: CI installs Mesa's software Vulkan. Cases with f16 values run twice: with f16
/// stored as 16 bits (where the adapter has `SHADER_F16`, as lavapipe does) and as 32-bit words
/// (`RLX_WGPU_F16_STORAGE=0`, what other adapters get).
#[test]
fn the_gpu_backend_matches_the_reference_evaluator() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let cases = cases();
    let (mut ran, mut failures, mut skipped) = (BTreeSet::new(), Vec::new(), BTreeSet::new());
    let (mut schemes, mut schemes_ran) = (BTreeSet::new(), BTreeSet::new());
    let f16 = |c: &&Value| c.to_string().contains("\"dtype\":\"f16\"");
    let words_pass = cases.iter().filter(f16).map(|c| (true, c));
    let n_words = words_pass.clone().count();
    assert!(n_words >= 40, "only {n_words} cases with f16 values");
    for (words, c) in cases.iter().map(|c| (false, c)).chain(words_pass) {
        // Only this test compiles for the GPU in this binary: nothing else reads the variable.
        if words {
            std::env::set_var("RLX_WGPU_F16_STORAGE", "0");
        }
        let name = &format!(
            "{}{}",
            c["name"].as_str().unwrap_or("?"),
            if words { " (f16 as words)" } else { "" }
        );
        let Ok(b) = build(c) else { continue };
        let scheme = c["attrs"]["scheme"]
            .as_str()
            .filter(|s| s.starts_with("Gguf"))
            .map(str::to_string);
        schemes.extend(scheme.clone());
        let got = match run_on(Device::Gpu, &b, true) {
            Ok(v) => v,
            Err(e)
                if e.contains("compiling")
                    && (e.contains("no WGSL kernel")
                        || e.contains("only f32")
                        || e.contains("no kernel and no decomposition")) =>
            {
                skipped.insert(c["op"].as_str().unwrap_or("?").to_string());
                continue;
            }
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let mut tol = c.clone();
        tol["rtol"] = serde_json::json!(c["rtol"].as_f64().unwrap_or(0.0).max(1e-5));
        tol["atol"] = serde_json::json!(c["atol"].as_f64().unwrap_or(0.0).max(1e-6));
        match run_reference(&b).and_then(|want| compare(&tol, &got, &want, "reference evaluator")) {
            Ok(()) => {
                ran.insert(c["op"].as_str().unwrap_or("?").to_string());
                schemes_ran.extend(scheme);
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    std::env::remove_var("RLX_WGPU_F16_STORAGE");
    assert!(
        failures.is_empty(),
        "{} cases differ on the GPU:\n{}",
        failures.len(),
        failures.join("\n")
    );
    for op in [
        "add",
        "mul",
        "exp",
        "matmul",
        "dot_general",
        "reduce",
        "softmax",
        "transpose",
        "concat",
        "layer_norm",
        "fused",
        "quantize",
        "dequantize",
        "fake_quantize",
        "neg",
    ] {
        assert!(
            ran.contains(op),
            "no {op} case ran on the GPU (ran {ran:?}; not on the GPU: {skipped:?})"
        );
    }
    assert_eq!(
        schemes, schemes_ran,
        "every GGUF block type is decoded on the GPU"
    );
    let never: Vec<&String> = skipped.difference(&ran).collect();
    eprintln!("GPU op table: ops run {ran:?}; ops not lowered yet {never:?} (and the non-f32 cases of the others)");
}

/// The GPU's quantized products round their activations to int8 blocks as the CPU does (as
/// llama.cpp does for each weight type), so the two agree far more closely than either agrees
/// with the exact product: within 2e-5 of the largest result and a hundredth of the CPU's
/// distance from the exact product, for every GGUF block type.
#[test]
fn the_gpus_quantized_products_agree_with_the_cpus() {
    assert!(
        Device::Gpu.is_available(),
        "{}",
        Device::Gpu.availability_hint()
    );
    let mut checked = 0;
    for c in cases().iter().filter(|c| c["op"] == "dequant_matmul") {
        let name = c["name"].as_str().unwrap_or("?");
        let Ok(b) = build(c) else { continue };
        let (cpu, gpu) = (
            run_on(Device::Cpu, &b, true).expect("runs on the CPU"),
            run_on(Device::Gpu, &b, true).expect("runs on the GPU"),
        );
        let want = run_reference(&b).expect("reference");
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-3);
        let worst = cpu
            .iter()
            .zip(&gpu)
            .map(|(p, q)| (p - q).abs())
            .fold(0f64, f64::max);
        let exact = cpu
            .iter()
            .zip(&want)
            .map(|(p, q)| (p - q).abs())
            .fold(0f64, f64::max);
        eprintln!(
            "{name}: GPU - CPU {:.2e}, CPU - exact {:.2e} (of {scale:.3})",
            worst, exact
        );
        // Q4_1 / Q5_1 leave ~1e-5: the CPU rounds their blocks' activation sums to f16 as well.
        assert!(
            worst <= 2e-5 * scale && worst <= exact / 100.0,
            "{name}: GPU and CPU differ by {worst} (scale {scale}; the CPU and the exact product by {exact})"
        );
        checked += 1;
    }
    assert!(checked >= 13, "only {checked} quantized product cases");
}

/// The text form prints and parses back every case of the op table (every op kind, with its
/// attributes), and the parsed graph prints the same text.
#[test]
fn the_text_form_round_trips_every_case() {
    for c in &cases() {
        let g = build(c)
            .map(|b| b.g)
            .unwrap_or_else(|e| panic!("{}: {e}", c["name"]));
        let text = g.to_string();
        let back = Graph::parse(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", c["name"]));
        assert_eq!(back, g, "{text}");
        assert_eq!(back.to_string(), text);
    }
}

/// Every op kind of the IR has golden cases (a new op needs its rows). The list comes from
/// [`OpKind::all`] (the IR's variants and every registered defined op), so it cannot drift; only the leaves are exempt, and every case
/// has them.
#[test]
fn the_table_covers_every_op() {
    let covered: BTreeSet<OpKind> = cases()
        .iter()
        .map(|c| op_of(c["op"].as_str().unwrap(), &c["attrs"]).kind())
        .collect();
    let leaves = [OpKind::Input, OpKind::Param, OpKind::Constant];
    let missing: Vec<&str> = OpKind::all()
        .iter()
        .filter(|k| !leaves.contains(k) && !covered.contains(k))
        .map(|k| k.name())
        .collect();
    assert!(missing.is_empty(), "ops without golden cases: {missing:?}");
}
