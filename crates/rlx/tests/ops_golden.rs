//! The op table: every case in `golden/ops.json` (computed with numpy / JAX by
//! `golden/gen_ops.py`; regenerate with `scripts/regen-goldens.sh`) is built as a one-op graph,
//! compiled for the CPU and compared with the reference within the case's tolerance.

mod common;
#[path = "ops_golden/prompt_products.rs"]
mod prompt_products;
#[path = "ops_golden/quantized.rs"]
mod quantized;
use quantized::*;

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

/// Run a built case on `device`: its first output.
fn run_on(device: Device, b: &Built, optimize: bool) -> Result<Vec<f64>, String> {
    let mut outs = run_all_with(device, b, optimize)?;
    Ok(outs.swap_remove(0))
}

/// Every output of a built case on `device`, optimized.
fn run_all_on(device: Device, b: &Built) -> Result<Vec<Vec<f64>>, String> {
    run_all_with(device, b, true)
}

fn run_all_with(device: Device, b: &Built, optimize: bool) -> Result<Vec<Vec<f64>>, String> {
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
    Ok(outs.iter().map(|(v, d)| decode(v, *d)).collect())
}

/// A GPU adapter is here (CI installs Mesa's software Vulkan); a missing one fails the test.
fn assert_gpu() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
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

/// The cases the GPU backend is allowed not to run: (case kind, dtype, why). The kind is the
/// op's name, with the form that matters where one form of an op runs and another does not
/// (see [`gpu_kind`]); `*` matches every kind. The dtype matches a case any of whose inputs or
/// result has it; `*` matches every case. A case is allowed by the first entry matching it.
/// Every other case must compile and run on the GPU, and every entry must allow at least one
/// case, so the list shrinks as the GPU backend grows.
const NOT_ON_THE_GPU: &[(&str, &str, &str)] = &[
    ("*", "f64", "WGSL has no f64 type"),
    ("*", "i64", "WGSL has no 64-bit integer type"),
    (
        "matmul",
        "i32",
        "the GPU's products are f32 (f16/bf16 widened) only",
    ),
    (
        "dot_general",
        "i32",
        "decomposes into an integer matmul, which is f32-only on the GPU",
    ),
    ("reduce", "i32", "the GPU's reductions are f32-only"),
    ("cumsum", "i32", "the GPU's cumsum is f32-only"),
    ("scatter_add", "i32", "the GPU's scatter_add is f32-only"),
    (
        "cache_write (slots)",
        "*",
        "only the position form of cache_write has a WGSL kernel",
    ),
    (
        "paged_attention",
        "*",
        "no WGSL kernel for the paged KV cache",
    ),
    (
        "while (unbounded)",
        "*",
        "a while without max_iterations has no GPU form (a bounded one unrolls)",
    ),
    (
        "qlinear",
        "*",
        "the int8 integer ops run on the CPU (and the edge writers) only",
    ),
    ("qconv2d", "*", "the int8 integer ops run on the CPU only"),
    ("qadd", "*", "the int8 integer ops run on the CPU only"),
    ("qpool", "*", "the int8 integer ops run on the CPU only"),
];

/// A case's kind for [`NOT_ON_THE_GPU`]: its op's name, marked with the form where the GPU runs
/// one form of the op and not another.
fn gpu_kind(c: &Value) -> String {
    let op = c["op"].as_str().unwrap_or("?");
    match op {
        "cache_write" if usizes(&c["inputs"][2]["shape"]) != [1] => format!("{op} (slots)"),
        "while" if c["attrs"]["max_iterations"].is_null() => format!("{op} (unbounded)"),
        _ => op.to_string(),
    }
}

/// The entry of [`NOT_ON_THE_GPU`] allowing case `c`, if any (its index).
fn allowed_off_the_gpu(c: &Value) -> Option<usize> {
    allowed_off(NOT_ON_THE_GPU, c)
}

/// The entry of `list` (op kind as [`gpu_kind`] names it, a dtype among the case's values, why)
/// allowing case `c`, if any (its index).
fn allowed_off(list: &[(&str, &str, &str)], c: &Value) -> Option<usize> {
    let kind = gpu_kind(c);
    let dtypes: BTreeSet<&str> = c["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .chain([&c["expected"]])
        .filter_map(|v| v["dtype"].as_str())
        .collect();
    list.iter()
        .position(|(k, d, _)| (*k == "*" || *k == kind) && (*d == "*" || dtypes.contains(d)))
}

/// The backend test on the GPU (wgpu; lavapipe in CI): every case against the reference
/// evaluator, within 1e-5 relative (or the case's own, looser, tolerance), except those
/// [`NOT_ON_THE_GPU`] allows not to run, which must then fail to compile for want of a GPU form
/// (any other error fails the test). A missing adapter is a failure: CI installs Mesa's software
/// Vulkan. Cases with f16 values run twice: with f16 stored as 16 bits (where the adapter has
/// `SHADER_F16`, as lavapipe does) and as 32-bit words (`RLX_WGPU_F16_STORAGE=0`, what other
/// adapters get).
#[test]
fn the_gpu_backend_matches_the_reference_evaluator() {
    assert_gpu();
    let cases = cases();
    let (mut ran, mut failures) = (BTreeSet::new(), Vec::new());
    let mut used = vec![0usize; NOT_ON_THE_GPU.len()];
    let (mut schemes, mut schemes_ran) = (BTreeSet::new(), BTreeSet::new());
    let f16 = |c: &&Value| c.to_string().contains("\"dtype\":\"f16\"");
    let words_pass = cases.iter().filter(f16).map(|c| (true, c));
    let n_words = words_pass.clone().count();
    assert!(n_words >= 40, "only {n_words} cases with f16 values");
    for (words, c) in cases.iter().map(|c| (false, c)).chain(words_pass) {
        // Only this test compiles for the GPU in this binary: nothing else reads the variable.
        if words {
            std::env::set_var(rlx::ir::env::WGPU_F16_STORAGE.name, "0");
        }
        let name = &format!(
            "{}{}",
            c["name"].as_str().unwrap_or("?"),
            if words { " (f16 as words)" } else { "" }
        );
        // Every case builds (the CPU tests run them all): a build error is a failure here too.
        let b = match build(c) {
            Ok(b) => b,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let scheme = c["attrs"]["scheme"]
            .as_str()
            .filter(|s| s.starts_with("Gguf"))
            .map(str::to_string);
        schemes.extend(scheme.clone());
        let allowed = allowed_off_the_gpu(c);
        let got = match run_on(Device::Gpu, &b, true) {
            Ok(v) => v,
            Err(e) => {
                let no_gpu_form = e.starts_with("compiling")
                    && (e.contains("no WGSL kernel")
                        || e.contains("do not run on the GPU")
                        || e.contains("no decomposition"));
                match allowed {
                    Some(i) if no_gpu_form => used[i] += 1,
                    Some(i) => failures.push(format!(
                        "{name}: {e} (in the allow-list as {:?}, but the error is not a missing GPU form)",
                        NOT_ON_THE_GPU[i]
                    )),
                    None => failures.push(format!(
                        "{name} ({} {:?}): {e} (not in NOT_ON_THE_GPU)",
                        gpu_kind(c),
                        c["expected"]["dtype"]
                    )),
                }
                continue;
            }
        };
        let mut tol = c.clone();
        tol["rtol"] = serde_json::json!(c["rtol"].as_f64().unwrap_or(0.0).max(1e-5));
        tol["atol"] = serde_json::json!(c["atol"].as_f64().unwrap_or(0.0).max(1e-6));
        match run_reference(&b)
            .and_then(|want| compare(&tol, &got, &want, "reference evaluator"))
            .and_then(|()| quantized_agrees_if_product(c, &b, &got, "GPU"))
        {
            Ok(()) => {
                ran.insert(c["op"].as_str().unwrap_or("?").to_string());
                schemes_ran.extend(scheme);
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    std::env::remove_var(rlx::ir::env::WGPU_F16_STORAGE.name);
    assert!(
        failures.is_empty(),
        "{} cases fail on the GPU:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let unused: Vec<_> = NOT_ON_THE_GPU
        .iter()
        .zip(&used)
        .filter(|(_, n)| **n == 0)
        .map(|(e, _)| e)
        .collect();
    assert!(
        unused.is_empty(),
        "entries of NOT_ON_THE_GPU that no case needs any more (remove them): {unused:?}"
    );
    assert_eq!(
        schemes, schemes_ran,
        "every GGUF block type is decoded on the GPU"
    );
    eprintln!("GPU op table: ops run {ran:?}; cases not on the GPU, by allow-list entry:");
    for ((kind, dt, why), n) in NOT_ON_THE_GPU.iter().zip(&used) {
        eprintln!("  {n:3} {kind} [{dt}]: {why}");
    }
}

/// The GPU's quantized products round their activations to int8 blocks as the CPU does (as
/// llama.cpp does for each weight type), so the two agree far more closely than either agrees
/// with the exact product: within 2e-5 of the largest result and a hundredth of the CPU's
/// distance from the exact product, for every GGUF block type.
#[test]
fn the_gpus_quantized_products_agree_with_the_cpus() {
    assert_gpu();
    let mut checked = 0;
    for c in cases().iter().filter(|c| c["op"] == "dequant_matmul") {
        let name = c["name"].as_str().unwrap_or("?");
        let Ok(b) = build(c) else { continue };
        let (cpu, gpu) = (
            run_on(Device::Cpu, &b, true).expect("runs on the CPU"),
            run_on(Device::Gpu, &b, true).expect("runs on the GPU"),
        );
        let want = run_reference(&b).expect("reference");
        if let Err(e) = quantized_agrees(name, &cpu, &gpu, &want, "GPU") {
            panic!("{e}");
        }
        checked += 1;
    }
    assert!(checked >= 13, "only {checked} quantized product cases");
    // The few-rows products above add each subgroup's sums with `subgroupAdd` where the device
    // was opened with subgroups (lavapipe has them); without them only the workgroup tree ran,
    // which `crates/rlx-wgpu/tests/subgroups.rs` checks on its own.
    let gpu = rlx_wgpu::Gpu::get(Device::Gpu).expect("the GPU adapter opens");
    assert!(
        gpu.subgroups,
        "adapter {:?} was opened without subgroups, so the subgroupAdd path of the few-rows \
         products did not run",
        gpu.info.name
    );
}

/// Decode-sized GGUF products on the GPU (one row, the shader specialized to it; and three
/// rows), wide enough that a workgroup takes many columns in turn, for every block type the
/// GPU decodes: each within [`quantized_or_near_exact`] of the CPU's, and the one-row product's
/// result bit for bit the first row of the three-row product's (the rows are rounded and
/// summed alone either way).
#[test]
fn wide_one_row_gpu_products_agree_with_the_cpu_and_with_a_row_among_three() {
    assert_gpu();
    let mut rng = rlx::gguf::SplitMix64::new(29);
    let mut checked = 0;
    for scheme in rlx::ir::QuantScheme::GGUF {
        let Some(ty) = scheme.ggml_type() else {
            continue;
        };
        let (k, n) = (512, 1100);
        let Ok(w) = rlx::gguf::random_tensor(ty, &[n, k], 0.0, 0.5, &mut rng) else {
            continue;
        };
        let (one, three) = (
            quantized_product(scheme, 1, k, n, &w),
            quantized_product(scheme, 3, k, n, &w),
        );
        let gpu1 = match run_on(Device::Gpu, &one, true) {
            Ok(v) => v,
            Err(e) if e.contains("nsupported") => continue,
            Err(e) => panic!("{scheme:?}: {e}"),
        };
        let gpu3 = run_on(Device::Gpu, &three, true).expect("three rows on the GPU");
        let cpu1 = run_on(Device::Cpu, &one, true).expect("runs on the CPU");
        let want = run_reference(&one).expect("reference");
        let name = format!("{scheme:?} 1x{k} @ {n}");
        if let Err(e) = quantized_or_near_exact(&name, &cpu1, &gpu1, &want, "GPU") {
            panic!("{e}");
        }
        let same = gpu1
            .iter()
            .zip(&gpu3[..n])
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        assert_eq!(
            same, n,
            "{name}: the one-row product differs from the first of three rows"
        );
        checked += 1;
    }
    assert!(
        checked >= 8,
        "only {checked} block types decoded on the GPU"
    );
}

/// Prompt-sized quantized products (more rows than the decode kernel takes, so the GPU's tiled
/// prompt kernel): 9 and 37 rows (one partial tile, a full one and a partial one) by 70
/// columns (a partial tile of columns) over K = 512, for every GGUF block type the GPU
/// decodes, random well-formed weights; the GPU against the CPU as
/// [`the_gpus_quantized_products_agree_with_the_cpus`] holds them, and the 9 rows (a tile of
/// 16) bit for bit as the first 9 of the 37 (tiles of 32).
#[test]
fn prompt_sized_quantized_products_on_the_gpu_agree_with_the_cpus() {
    assert_gpu();
    let (n, k) = (70, 512);
    let mut rng = rlx::gguf::SplitMix64::new(11);
    let mut checked = 0;
    for scheme in rlx::ir::QuantScheme::GGUF {
        let (Some(ty), Some(_)) = (scheme.ggml_type(), scheme.row_bytes(k)) else {
            continue;
        };
        if rlx_wgpu::shaders::gguf_decoder(scheme).is_none() {
            continue;
        }
        // Q8_K is an activation type: no random weights of it are written.
        let Ok(w) = rlx::gguf::random_tensor(ty, &[n, k], 0.0, 0.5, &mut rng) else {
            continue;
        };
        let mut first = Vec::new();
        for rows in [9, 37] {
            let b = quantized_product(scheme, rows, k, n, &w);
            let name = format!("{scheme:?} {rows}x{k} @ {n}");
            let cpu = run_on(Device::Cpu, &b, true).expect("runs on the CPU");
            let gpu = run_on(Device::Gpu, &b, true).expect("runs on the GPU");
            let want = run_reference(&b).expect("reference");
            if let Err(e) = quantized_or_near_exact(&name, &cpu, &gpu, &want, "GPU (tiled)") {
                panic!("{e}");
            }
            // The 9 rows (one 16-row tile) are bit for bit the first 9 of the 37 (32-row
            // tiles): a tile's height changes no result.
            if first.is_empty() {
                first = gpu;
            } else {
                let same = first
                    .iter()
                    .zip(&gpu)
                    .filter(|(a, b)| a.to_bits() == b.to_bits())
                    .count();
                assert_eq!(
                    same,
                    first.len(),
                    "{name}: its first 9 rows differ from the 9-row product's"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 24, "only {checked} prompt-sized products");
}

/// Decode-sized quantized products (1, 5 and 8 rows, 70 columns) for every GGUF block type
/// with random well-formed weights: K = 576 (256-element blocks: 768), and K = 2048 at 5 rows;
/// `(name, scheme, rows, k, graph)`.
fn decode_sized_products() -> Vec<(String, rlx::ir::QuantScheme, usize, usize, Built)> {
    let n = 70;
    let mut rng = rlx::gguf::SplitMix64::new(17);
    let mut cases = Vec::new();
    for scheme in rlx::ir::QuantScheme::GGUF {
        let Some(ty) = scheme.ggml_type() else {
            continue;
        };
        let blk = if scheme.act_block(1) == Some(256) {
            768
        } else {
            576
        };
        for (rows, k) in [(1, blk), (5, blk), (8, blk), (5, 2048)] {
            // Q8_K is an activation type: no random weights of it are written.
            let Ok(w) = rlx::gguf::random_tensor(ty, &[n, k], 0.0, 0.5, &mut rng) else {
                continue;
            };
            let b = quantized_product(scheme, rows, k, n, &w);
            cases.push((format!("{scheme:?} {rows}x{k} @ {n}"), scheme, rows, k, b));
        }
        // Eight and twelve one-row products (a decode batch): rounded as one-token steps
        // are, by the matrix-vector kernel and by the tiled one (with Q4_1 / Q5_1's sums).
        let k = if blk == 768 { 256 } else { 352 };
        if let Ok(w) = rlx::gguf::random_tensor(ty, &[n, k], 0.0, 0.5, &mut rng) {
            for batch in [8, 12] {
                let b = quantized_product_of(scheme, &[batch, 1, k], n, &w);
                cases.push((format!("{scheme:?} {batch}x1x{k} @ {n}"), scheme, 1, k, b));
            }
        }
    }
    assert!(cases.len() >= 48, "only {} products", cases.len());
    cases
}

/// [`decode_sized_products`] on the GPU against the CPU as
/// [`the_gpus_quantized_products_agree_with_the_cpus`] holds them: where the activations fit in
/// workgroup memory (`rows * K` ≤ 3072) the matrix-vector kernel rounds them itself; where not,
/// a rounding step comes first (with the 32-blocks' sums for Q4_1 / Q5_1). Both the word-load
/// decoders (`shaders::group_decoder`) and the element-wise ones run.
#[test]
fn decode_sized_quantized_products_on_the_gpu_agree_with_the_cpus() {
    assert_gpu();
    decode_sized_products_agree_on(Device::Gpu, "GPU");
}

/// [`decode_sized_products`] on `device` against the CPU, as [`quantized_or_near_exact`]
/// holds them.
fn decode_sized_products_agree_on(device: Device, what: &str) {
    for (name, _, _, _, b) in &decode_sized_products() {
        let cpu = run_on(Device::Cpu, b, true).expect("runs on the CPU");
        let got = run_on(device, b, true).unwrap_or_else(|e| panic!("{name} on {what}: {e}"));
        let want = run_reference(b).expect("reference");
        if let Err(e) = quantized_or_near_exact(name, &cpu, &got, &want, what) {
            panic!("{e}");
        }
    }
}

/// On a CUDA device: [`decode_sized_products`] against the CPU as
/// [`the_gpus_quantized_products_agree_with_the_cpus`] holds them (the staged and unstaged
/// matrix-vector kernels, word-load and element-wise decoders, on the device).
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_decode_sized_quantized_products_agree_with_the_cpus() {
    common::require_cuda("CUDA decode-sized products");
    decode_sized_products_agree_on(Device::Cuda, "CUDA");
}

/// RMSNorms read only by a decode product, alone and after a residual add whose sum a node
/// after the product also reads (`(x + r)²`, the graph's second output): 7 block types, 1 and 5
/// rows; `(name, scheme, residual, built)`. The compiler forms a `norm_matmul` region of each
/// where the backend's product kernel normalizes its staged activations.
fn norm_products() -> Vec<(String, rlx::ir::QuantScheme, bool, Built)> {
    use rlx::ir::BinaryOp;
    use rlx::ir::QuantScheme::*;
    let n = 70;
    let mut rng = rlx::gguf::SplitMix64::new(23);
    let mut cases = Vec::new();
    for scheme in [
        GgufQ4_0, GgufQ4_1, GgufQ5_0, GgufQ8_0, GgufF16, GgufQ4K, GgufQ6K,
    ] {
        let k = if scheme.act_block(1) == Some(256) {
            768
        } else {
            576
        };
        let ty = scheme.ggml_type().expect("a GGUF scheme");
        let w = rlx::gguf::random_tensor(ty, &[n, k], 0.0, 0.5, &mut rng).expect("weights");
        let gamma: Vec<f32> = (0..k).map(|i| 0.5 + (i % 7) as f32 * 0.125).collect();
        for (rows, residual) in [(1, false), (5, false), (1, true), (5, true)] {
            let mut b = quantized_product(scheme, rows, k, n, &w);
            let (x, wi) = (b.g.inputs()[0].1, b.g.node(b.g.outputs()[0]).inputs[1]);
            let mut g = Graph::new("norm_product");
            let xi = g.input("x", b.g.shape(x).clone());
            let gi = g.param("gamma", Shape::new(&[k], DType::F32));
            let wp = g.param("w", b.g.shape(wi).clone());
            // The CPU and the GPUs sum the norm's squares in different orders, so an activation
            // on a rounding boundary could round the other way and move a result by one step
            // (as between any two summation orders); these inputs have none.
            let (h, sum) = if residual {
                let r = g.input("r", b.g.shape(x).clone());
                let s = g.op(Op::Binary(BinaryOp::Add), &[xi, r]);
                (g.op(Op::RmsNorm { eps: 1e-5 }, &[s, gi]), Some(s))
            } else {
                (g.op(Op::RmsNorm { eps: 1e-5 }, &[xi, gi]), None)
            };
            let y = g.op(Op::DequantMatMul { scheme }, &[h, wp]);
            let mut outs = vec![y];
            if let Some(s) = sum {
                outs.push(g.op(Op::Binary(BinaryOp::Mul), &[s, s]));
                let r: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 31 % 97) as f32 - 48.0) / 64.0)
                    .collect();
                b.feeds.push((
                    "r".into(),
                    r.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    DType::F32,
                ));
            }
            g.set_outputs(outs);
            b.g = g;
            b.params.insert(
                0,
                (
                    "gamma".into(),
                    gamma.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    DType::F32,
                ),
            );
            let what = if residual {
                "add, rms_norm"
            } else {
                "rms_norm"
            };
            let name = format!("{what} then {scheme:?} {rows}x{k} @ {n}");
            cases.push((name, scheme, residual, b));
        }
    }
    cases
}

/// The `norm_matmul` result nodes in `device`'s lowered form of `b`: one region (two nodes
/// with the residual sum) where the device's product kernel takes the norm.
fn norm_regions(device: Device, b: &Built) -> (Graph, usize) {
    let l = Session::new(device).try_lower(b.g.clone()).expect("lowers");
    let regions = l
        .graph
        .nodes()
        .iter()
        .filter(|n| matches!(&n.op, Op::Fused(r) if r.kind == rlx::ir::FusionKind::NormMatMul))
        .count();
    (l.graph, regions)
}

/// The second output of a residual case (`(x + r)²`) is the sum's square to the bit.
fn residual_sum_exact(name: &str, b: &Built, second: &[f64]) {
    let f = |v: &[u8]| decode(v, DType::F32);
    let (x, r) = (f(&b.feeds[0].1), f(&b.feeds[1].1));
    let want: Vec<f64> = x
        .iter()
        .zip(&r)
        .map(|(a, c)| {
            let s = *a as f32 + *c as f32;
            (s * s) as f64
        })
        .collect();
    assert_eq!(second, want, "{name}: the residual sum");
}

/// An RMSNorm read only by a decode product is taken into the product's kernel on CUDA (a
/// `norm_matmul` region: it normalizes the staged activations, then rounds them): one launch
/// for both, in host emulation against the CPU's norm and product as
/// [`the_gpus_quantized_products_agree_with_the_cpus`] holds them. Products of K-quants
/// (activation blocks of 256) keep the norm's own launch.
#[test]
fn rms_norms_taken_into_cuda_decode_products_agree_with_the_cpus() {
    let mut cases = Vec::new();
    for (name, scheme, residual, b) in norm_products() {
        let (lowered, regions) = norm_regions(Device::Cuda, &b);
        let fuses = rlx_cuda::source::norm_fuses(scheme);
        assert_eq!(
            regions,
            fuses as usize * (1 + residual as usize),
            "{name}: regions"
        );
        let p = rlx_cuda::lower(&lowered, &[]).expect("lowers for CUDA");
        // Norm (and add) inside the product where it takes them; the scaling its own.
        let launches = match (fuses, residual) {
            (true, r) => 1 + r as usize,
            (false, r) => 2 + 2 * r as usize,
        };
        assert_eq!(p.launches.len(), launches, "{name}: launches");
        cases.push((name, b, p));
    }
    let emu = rlx_cuda::emulate::Emulator::build(cases.iter().flat_map(|c| &c.2.kernels))
        .expect("the kernels compile for the host");
    for (name, b, p) in &cases {
        emulated_product_agrees(&emu, name, b, p);
    }
}

/// The same on wgpu (lavapipe in CI): the region is one dispatch, the product against the
/// CPU's, the residual sum to the bit.
#[test]
fn rms_norms_taken_into_gpu_decode_products_agree_with_the_cpus() {
    assert_gpu();
    for (name, scheme, residual, b) in norm_products() {
        let (_, regions) = norm_regions(Device::Gpu, &b);
        let fuses = rlx_wgpu::shaders::norm_fuses(scheme);
        assert_eq!(
            regions,
            fuses as usize * (1 + residual as usize),
            "{name}: regions"
        );
        let outs = run_all_on(Device::Gpu, &b).unwrap_or_else(|e| panic!("{name}: {e}"));
        let cpu = run_on(Device::Cpu, &b, true).expect("runs on the CPU");
        let want = run_reference(&b).expect("reference");
        if let Err(e) = quantized_or_near_exact(&name, &cpu, &outs[0], &want, "GPU") {
            panic!("{e}");
        }
        if residual {
            residual_sum_exact(&name, &b, &outs[1]);
        }
    }
}

/// The bytes of each slot's value, by name.
fn values_for(slots: &[rlx::driver::IoSlot], from: &[(String, Vec<u8>, DType)]) -> Vec<Vec<u8>> {
    slots
        .iter()
        .map(|s| {
            from.iter()
                .find(|(n, _, _)| *n == s.name)
                .map(|(_, v, _)| v.clone())
                .unwrap_or_else(|| panic!("no value for {}", s.name))
        })
        .collect()
}

/// Program `p` of the quantized product `b` in host emulation against the CPU, as
/// [`quantized_or_near_exact`] holds them.
fn emulated_product_agrees(
    emu: &rlx_cuda::emulate::Emulator,
    name: &str,
    b: &Built,
    p: &rlx_cuda::Program,
) {
    let (feeds, params) = (
        values_for(&p.inputs, &b.feeds),
        values_for(&p.params, &b.params),
    );
    let outs = emu
        .run(p, &feeds, &params)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let got = decode(&outs[0], DType::F32);
    let cpu = run_on(Device::Cpu, b, true).expect("runs on the CPU");
    let want = run_reference(b).expect("reference");
    if let Err(e) = quantized_or_near_exact(name, &cpu, &got, &want, "CUDA (emulated)") {
        panic!("{e}");
    }
    // A second output (`(x + r)²`, of the residual sum read after the product) to the bit.
    if let Some(second) = outs.get(1) {
        residual_sum_exact(name, b, &decode(second, DType::F32));
    }
}

/// A rotation whose only reader (through a reshape) is a cache write is rotated into the
/// cache by one launch on CUDA; in host emulation the cache it gives is the reference
/// evaluator's (f32 and f16 caches, one and two rows, positions inside the cache, at its last
/// row with a row dropped, past it, and negative).
#[test]
fn ropes_into_cuda_cache_writes_match_the_reference_evaluator() {
    let mut cases = Vec::new();
    for (name, b) in rope_cache_writes() {
        let l = Session::new(Device::Cuda)
            .try_lower(b.g.clone())
            .expect("lowers");
        let p = rlx_cuda::lower(&l.graph, &[]).expect("lowers for CUDA");
        assert_eq!(p.launches.len(), 1, "{name}: launches");
        cases.push((name, b, p));
    }
    let emu = rlx_cuda::emulate::Emulator::build(cases.iter().flat_map(|c| &c.2.kernels))
        .expect("the kernels compile for the host");
    for (name, b, p) in &cases {
        let outs = emu
            .run(
                p,
                &values_for(&p.inputs, &b.feeds),
                &values_for(&p.params, &b.params),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = decode(&outs[0], p.outputs[0].shape.dtype());
        rope_cache_agrees(name, &got, b);
    }
}

/// The same on wgpu (lavapipe in CI): one dispatch, the reference evaluator's cache.
#[test]
fn ropes_into_gpu_cache_writes_match_the_reference_evaluator() {
    assert_gpu();
    for (name, b) in rope_cache_writes() {
        let c = Session::new(Device::Gpu)
            .try_compile(b.g.clone())
            .expect("compiles");
        let ops = c
            .executable()
            .as_any()
            .and_then(|a| a.downcast_ref::<rlx_wgpu::GpuProgram>())
            .expect("a wgpu program")
            .step_ops();
        assert_eq!(ops, ["cache_write"], "{name}: dispatches");
        let got = run_on(Device::Gpu, &b, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        rope_cache_agrees(&name, &got, &b);
    }
}

/// A rotation `x [3, S, 8]` reshaped into a cache write of `[4, 24]` (f32 and f16 caches,
/// one and two rows, positions inside the cache, at its last row with a row dropped, past
/// it, and negative): `(name, built)`.
fn rope_cache_writes() -> Vec<(String, Built)> {
    let (h, d, t) = (3, 8, 4);
    let mut cases = Vec::new();
    for cache_dt in [DType::F32, DType::F16] {
        for s in [1, 2] {
            for at in [1i32, 3, 4, -2] {
                let mut g = Graph::new("rope_into_cache");
                let x = g.input("x", Shape::new(&[h, s, d], DType::F32));
                let positions = g.input("positions", Shape::new(&[s], DType::I32));
                let cache = g.param("cache", Shape::new(&[t, h * d], cache_dt));
                let pos = g.input("at", Shape::new(&[1], DType::I32));
                let r = g.rope(x, positions, 10000.0, false);
                let u = g.reshape(r, &[s, h * d]);
                let w = g.cache_write(cache, u, pos);
                g.set_outputs(vec![w]);
                let xs: Vec<f32> = (0..h * s * d).map(|i| (i as f32 * 0.37).sin()).collect();
                let cs: Vec<f32> = (0..t * h * d).map(|i| i as f32 * 0.01 - 0.4).collect();
                let cache_bytes: Vec<u8> = match cache_dt {
                    DType::F16 => cs
                        .iter()
                        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                        .collect(),
                    _ => cs.iter().flat_map(|v| v.to_le_bytes()).collect(),
                };
                let b = Built {
                    g,
                    feeds: vec![
                        (
                            "x".into(),
                            xs.iter().flat_map(|v| v.to_le_bytes()).collect(),
                            DType::F32,
                        ),
                        (
                            "positions".into(),
                            (0..s as i32)
                                .flat_map(|p| (at.max(0) + p + 5).to_le_bytes())
                                .collect(),
                            DType::I32,
                        ),
                        ("at".into(), at.to_le_bytes().to_vec(), DType::I32),
                    ],
                    params: vec![("cache".into(), cache_bytes, cache_dt)],
                };
                cases.push((format!("{cache_dt} cache, {s} rows at {at}"), b));
            }
        }
    }
    cases
}

/// `got`, the cache a case of [`rope_cache_writes`] gives, is the reference evaluator's.
fn rope_cache_agrees(name: &str, got: &[f64], b: &Built) {
    let want = run_reference(b).expect("reference");
    for (i, (a, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - w).abs() <= 1e-3 * w.abs().max(1.0),
            "{name}: element {i}: {a} against {w}"
        );
    }
}

/// [`decode_sized_products`] as CUDA programs in host emulation, against the CPU as
/// [`the_gpus_quantized_products_agree_with_the_cpus`] holds them: where the activations fit in
/// the matrix-vector kernel's shared memory (`rows * K` ≤ 8192) it rounds them itself, one
/// launch; with K = 2048 and 5 rows they do not, and a rounding launch comes first. Both the
/// word-load decoders (`source::group_decoder`) and the element-wise ones run.
#[test]
fn decode_sized_quantized_products_as_cuda_programs_agree_with_the_cpus() {
    let cases: Vec<_> = decode_sized_products()
        .into_iter()
        .map(|(name, scheme, rows, k, b)| {
            let l = Session::new(Device::Cuda)
                .try_lower(b.g.clone())
                .expect("lowers");
            let p = rlx_cuda::lower(&l.graph, &[]).expect("lowers for CUDA");
            (name, scheme, rows, k, b, p)
        })
        .collect();
    let emu = rlx_cuda::emulate::Emulator::build(cases.iter().flat_map(|c| &c.5.kernels))
        .expect("the kernels compile for the host");
    for (name, scheme, rows, k, b, p) in &cases {
        // `rows`: of the last matrix (what rounding goes by); the kernel goes by all of them.
        let all = b.g.shape(b.g.inputs()[0].1).numel().unwrap_or(0) / k;
        let staged = all <= rlx_cuda::source::QROWS && all * k <= rlx_cuda::source::MATVEC_STAGE;
        let launches = if !staged && scheme.act_block(*rows).is_some() {
            2
        } else {
            1
        };
        assert_eq!(p.launches.len(), launches, "{name}: launches");
        emulated_product_agrees(&emu, name, b, p);
    }
}

/// Graph `g` of one f32 input `x` on the GPU against the reference evaluator: every result
/// within 1e-5 of the largest finite one (at least `floor`), NaN where the reference has NaN.
fn gpu_matches_reference(g: Graph, x: &[f32], floor: f64, what: &str) {
    let b = Built {
        g,
        feeds: vec![(
            "x".into(),
            x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F32,
        )],
        params: vec![],
    };
    let got = run_on(Device::Gpu, &b, true).expect("runs on the GPU");
    let want = run_reference(&b).expect("reference");
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(floor, |m, v| m.max(v.abs()));
    for (i, (a, w)) in got.iter().zip(&want).enumerate() {
        let ok = if w.is_nan() {
            a.is_nan()
        } else {
            (a - w).abs() <= 1e-5 * scale
        };
        assert!(ok, "{what}, result {i}: {a} vs {w}");
    }
}

/// Reductions over long rows on the GPU (a workgroup per result from 256 reduced elements):
/// every kind over a row of 1000, a strided middle axis of 300, two axes together and 70,000
/// elements into one (more than one lavapipe invocation may loop over), with a NaN in one row
/// for max and min; against the reference evaluator.
#[test]
fn long_reductions_on_the_gpu_match_the_reference_evaluator() {
    assert_gpu();
    let kinds = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
    ];
    let shapes: [(&[usize], &[usize]); 4] = [
        (&[3, 1000], &[1]),
        (&[2, 300, 5], &[1]),
        (&[4, 20, 30], &[1, 2]),
        (&[70000], &[0]),
    ];
    for kind in kinds {
        for (dims, axes) in shapes {
            let n: usize = dims.iter().product();
            // Products stay finite: values near 1 for prod, spread out for the others.
            let mut x: Vec<f32> = (0..n)
                .map(|i| {
                    let u = (i * 7919 % 1000) as f32 / 1000.0;
                    if kind == ReduceKind::Prod {
                        1.0 + (u - 0.5) * 0.01
                    } else {
                        u * 4.0 - 2.0
                    }
                })
                .collect();
            if matches!(kind, ReduceKind::Max | ReduceKind::Min) {
                x[7] = f32::NAN;
            }
            let mut g = Graph::new("long_reduce");
            let xi = g.input("x", Shape::new(dims, DType::F32));
            let y = g.op(
                Op::Reduce {
                    kind,
                    axes: axes.to_vec(),
                    keepdims: false,
                },
                &[xi],
            );
            g.set_outputs(vec![y]);
            gpu_matches_reference(g, &x, 1.0, &format!("{kind:?} {dims:?} over {axes:?}"));
        }
    }
}

/// Softmax and cumsum along rows of 32 or more (a workgroup per row on the GPU): a contiguous
/// row of 1000, a strided middle axis of 300, a leading axis of 40 and one row of 70,000, with
/// a NaN row and a `-inf` for softmax; against the reference evaluator.
#[test]
fn long_softmax_and_cumsum_on_the_gpu_match_the_reference_evaluator() {
    assert_gpu();
    let shapes: [(&[usize], usize); 4] = [
        (&[3, 1000], 1),
        (&[2, 300, 5], 1),
        (&[40, 3], 0),
        (&[70000], 0),
    ];
    for softmax in [true, false] {
        for (dims, axis) in shapes {
            let n: usize = dims.iter().product();
            let mut x: Vec<f32> = (0..n)
                .map(|i| (i * 7919 % 1000) as f32 / 250.0 - 2.0)
                .collect();
            if softmax {
                x[7] = f32::NAN;
                x[n - 2] = f32::NEG_INFINITY;
            }
            let mut g = Graph::new("long_rows");
            let xi = g.input("x", Shape::new(dims, DType::F32));
            let op = if softmax {
                Op::Softmax { axis }
            } else {
                Op::Cumsum { axis }
            };
            let y = g.op(op, &[xi]);
            g.set_outputs(vec![y]);
            let what = if softmax { "softmax" } else { "cumsum" };
            gpu_matches_reference(
                g,
                &x,
                if softmax { 0.0 } else { 1.0 },
                &format!("{what} {dims:?} along {axis}"),
            );
        }
    }
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

/// Op-table cases the CUDA backend does not run yet, by op kind (as [`NOT_ON_THE_GPU`]) and a
/// dtype among the case's values (`*`: any), and why. Compiling one must fail naming the
/// missing kernel, and every entry must still be needed.
const NOT_ON_CUDA: &[(&str, &str, &str)] = &[
    (
        "while (unbounded)",
        "*",
        "a while without max_iterations has no CUDA form (a bounded one unrolls)",
    ),
    ("matmul", "i32", "the CUDA products are float only"),
    (
        "dot_general",
        "i32",
        "decomposes into an integer matmul, float only on CUDA",
    ),
    (
        "qlinear",
        "*",
        "the int8 integer ops run on the CPU (and the edge writers) only",
    ),
    ("qconv2d", "*", "the int8 integer ops run on the CPU only"),
    ("qadd", "*", "the int8 integer ops run on the CPU only"),
    ("qpool", "*", "the int8 integer ops run on the CPU only"),
];

/// The entry of [`NOT_ON_CUDA`] allowing case `c`, if any (its index).
fn allowed_off_cuda(c: &Value) -> Option<usize> {
    allowed_off(NOT_ON_CUDA, c)
}

/// Every op-table case lowers for CUDA on a machine without a GPU (the session's pipeline
/// with the CUDA backend's `supports`, then its lowering), or is refused naming the missing
/// kernel as [`NOT_ON_CUDA`] allows; and every kernel those programs launch compiles with NVRTC
/// for sm_80 and sm_90. Without NVRTC the lowering is still checked and the test says so in one
/// line (`scripts/test.sh` installs NVRTC and sets `RLX_REQUIRE_NVRTC=1`, which makes a missing
/// NVRTC a failure).
#[test]
fn every_cuda_kernel_of_the_op_table_compiles_with_nvrtc() {
    let nvrtc = rlx_cuda::nvrtc::Nvrtc::get();
    if let Err(e) = &nvrtc {
        assert!(
            rlx::ir::env::get(rlx::ir::env::REQUIRE_NVRTC).as_deref() != Some("1"),
            "RLX_REQUIRE_NVRTC=1 and {e}"
        );
        eprintln!("NVRTC missing, CUDA kernels lowered but NOT compiled: {e}");
    }
    let mut used = vec![0usize; NOT_ON_CUDA.len()];
    let (mut failures, mut kernels) = (Vec::new(), BTreeSet::new());
    let mut lowered = 0;
    for c in cases() {
        let name = c["name"].as_str().unwrap_or("?").to_string();
        let b = match build(&c) {
            Ok(b) => b,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let allowed = allowed_off_cuda(&c);
        let prog = Session::new(Device::Cuda)
            .try_lower(b.g.clone())
            .and_then(|l| rlx_cuda::lower(&l.graph, &[]));
        match (prog, allowed) {
            (Ok(p), None) => {
                lowered += 1;
                kernels.extend(p.kernels);
            }
            (Ok(_), Some(i)) => failures.push(format!(
                "{name}: lowers for CUDA, but NOT_ON_CUDA lists it as {:?}",
                NOT_ON_CUDA[i]
            )),
            (Err(e), Some(i))
                if e.to_string().contains("no decomposition")
                    || e.to_string().contains("do not run on CUDA")
                    || e.to_string().contains("no CUDA") =>
            {
                used[i] += 1
            }
            (Err(e), _) => failures.push(format!("{name} ({}): {e}", gpu_kind(&c))),
        }
    }
    if let Ok(nvrtc) = nvrtc {
        let sources: Vec<&str> = kernels.iter().map(String::as_str).collect();
        for arch in rlx_cuda::CHECKED_ARCHS {
            if let Err(e) = nvrtc.check_all(&sources, arch) {
                failures.push(format!("sm_{arch}: {e}"));
            }
        }
        eprintln!(
            "CUDA op table: {lowered} cases lowered; {} distinct kernels compiled for sm_{:?} with NVRTC {:?} ({})",
            kernels.len(),
            rlx_cuda::CHECKED_ARCHS,
            nvrtc.version(),
            nvrtc.path()
        );
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let unused: Vec<_> = NOT_ON_CUDA
        .iter()
        .zip(&used)
        .filter(|(_, n)| **n == 0)
        .map(|(e, _)| e)
        .collect();
    assert!(
        unused.is_empty(),
        "entries of NOT_ON_CUDA no case needs any more: {unused:?}"
    );
}

/// On a CUDA device: every case the backend runs gives the reference evaluator's values (f32
/// within 1e-5 relative unless the case says more).
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_op_table_matches_the_reference_evaluator() {
    common::require_cuda("CUDA op table");
    let mut failures = Vec::new();
    let mut ran = 0;
    for c in cases() {
        if allowed_off_cuda(&c).is_some() {
            continue;
        }
        let name = c["name"].as_str().unwrap_or("?");
        let b = match build(&c) {
            Ok(b) => b,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let got = match run_on(Device::Cuda, &b, true) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let mut tol = c.clone();
        tol["rtol"] = serde_json::json!(c["rtol"].as_f64().unwrap_or(0.0).max(1e-5));
        tol["atol"] = serde_json::json!(c["atol"].as_f64().unwrap_or(0.0).max(1e-6));
        match run_reference(&b)
            .and_then(|want| compare(&tol, &got, &want, "reference evaluator"))
            .and_then(|()| quantized_agrees_if_product(&c, &b, &got, "CUDA"))
        {
            Ok(()) => ran += 1,
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    eprintln!("CUDA op table on {}: {ran} cases match", Device::Cuda);
    assert!(
        failures.is_empty(),
        "{} cases fail on CUDA:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The CUDA programs of the op table, run on the host (their kernels compiled as C++ by `g++`
/// against a header that plays CUDA's blocks, barriers and warp shuffles; see
/// `rlx_cuda::emulate`): every case the backend runs gives the reference evaluator's values.
/// This checks the lowering (sizes, strides, the memory plan's addresses) and the kernels'
/// arithmetic without a GPU; the device itself is checked by
/// [`needs_cuda_device_op_table_matches_the_reference_evaluator`].
#[test]
fn cuda_programs_of_the_op_table_match_the_reference_evaluator_in_host_emulation() {
    let mut progs = Vec::new();
    for c in cases() {
        if allowed_off_cuda(&c).is_some() {
            continue;
        }
        let b = build(&c).expect("every case builds");
        let l = Session::new(Device::Cuda)
            .try_lower(b.g.clone())
            .expect("lowers");
        let p = rlx_cuda::lower(&l.graph, &[]).expect("lowers for CUDA");
        progs.push((c, b, p));
    }
    let emu = rlx_cuda::emulate::Emulator::build(progs.iter().flat_map(|(_, _, p)| &p.kernels))
        .expect("the kernels compile for the host");
    let mut failures = Vec::new();
    for (c, b, p) in &progs {
        let name = c["name"].as_str().unwrap_or("?");
        let outs = match emu.run(
            p,
            &values_for(&p.inputs, &b.feeds),
            &values_for(&p.params, &b.params),
        ) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let got = decode(&outs[0], p.outputs[0].shape.dtype());
        let mut tol = c.clone();
        tol["rtol"] = serde_json::json!(c["rtol"].as_f64().unwrap_or(0.0).max(1e-5));
        tol["atol"] = serde_json::json!(c["atol"].as_f64().unwrap_or(0.0).max(1e-6));
        let want = run_reference(b);
        if let Err(e) = want
            .as_ref()
            .map_err(|e| e.clone())
            .and_then(|want| compare(&tol, &got, want, "reference evaluator"))
        {
            failures.push(format!("{name} ({} launches): {e}", p.launches.len()));
        }
        // Products run above as cuBLAS calls; on a device without cuBLAS they take the kernel.
        if let (true, Ok(want)) = (p.launches.iter().any(|l| l.gemm.is_some()), &want) {
            let own = emu
                .run_without_cublas(
                    p,
                    &values_for(&p.inputs, &b.feeds),
                    &values_for(&p.params, &b.params),
                )
                .map(|o| decode(&o[0], p.outputs[0].shape.dtype()))
                .map_err(|e| e.to_string());
            if let Err(e) = own.and_then(|own| compare(&tol, &own, want, "reference")) {
                failures.push(format!("{name} without cuBLAS: {e}"));
            }
        }
        if let Err(e) = quantized_agrees_if_product(c, b, &got, "CUDA (emulated)") {
            failures.push(e);
        }
    }
    eprintln!(
        "CUDA op table in host emulation: {} cases, {} fail",
        progs.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} cases fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
