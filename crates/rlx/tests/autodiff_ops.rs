//! Derivatives of every op, generated from the op table: for each f32 case the op is rebuilt in
//! f64 on fresh random inputs, and
//! - reverse mode (`grad_with_loss`) is compared with central finite differences,
//! - forward mode (`jvp`) is compared with a directional finite difference and with `grad · v`,
//! - each op's decomposition (what autodiff differentiates for composite ops) is compared with
//!   its native kernel.
//!
//! Ops whose results are not differentiable are listed with the reason; none is skipped silently.

mod common;

use common::table::{cases, dtype, op_of, usizes};
use common::{decode, encode};
use rlx::autodiff::{grad_with_loss, jvp, tangent_name, D_OUTPUT};
use rlx::prelude::*;
use serde_json::Value;
use std::collections::BTreeSet;

/// Ops with no derivative to check, and why.
const NOT_DIFFERENTIABLE: &[(&str, &str)] = &[
    ("eq", "bool result"),
    ("ne", "bool result"),
    ("lt", "bool result"),
    ("le", "bool result"),
    ("gt", "bool result"),
    ("ge", "bool result"),
    ("topk_indices", "integer result"),
    ("quantize", "integer result"),
    ("qlinear", "integer operands and result"),
    ("qconv2d", "integer operands and result"),
    ("qadd", "integer operands and result"),
    ("qpool", "integer operands and result"),
    ("fake_quantize", "a step function: its gradient is the straight-through estimator, checked by fake_quantize_passes_gradients_straight_through"),
    ("dequantize_rows", "inference-only: decodes packed integer weights"),
    ("dequant_matmul", "inference-only: the weights are packed integers"),
    ("quant_linear", "inference-only: the weights are packed integers"),
    ("cache_write", "inference-only: updates the KV cache in place"),
    ("cached_attention", "inference-only: reads the KV cache"),
    ("paged_attention", "inference-only: reads the paged KV cache"),
    ("complex", "c64 values have f32 parts, not the f64 this check runs in: complex.rs checks the complex ops' derivatives against jax.grad and jax.jvp"),
    ("real", "c64 operand (see complex)"),
    ("imag", "c64 operand (see complex)"),
    ("fft", "c64 operands or results (see complex)"),
];

/// A `while` without `max_iterations`: no reverse mode, as JAX has none for `while_loop` (the
/// bounded rows are checked here; `jax_parity.rs` checks the unbounded loop's forward mode
/// against `jax.jvp` of `lax.while_loop`).
fn unbounded_while(case: &Value) -> bool {
    case["op"] == "while" && case["attrs"]["max_iterations"].is_null()
}

/// A small deterministic generator (tests must not depend on a crate's RNG stream).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next()
    }
}

/// Input domain for operand `i` of `op` (keeps logs, roots and divisions well defined).
fn domain(op: &str, i: usize) -> (f64, f64) {
    match (op, i) {
        ("log" | "sqrt" | "rsqrt" | "pow", _) | ("div", 1) => (0.5, 2.0),
        ("tan", _) => (-1.0, 1.0),
        // A state-space model's A is negative (decay); a positive one grows the state by
        // exp(12) over a short sequence, and finite differences lose their digits.
        ("selective_scan", 2) => (-1.5, -0.1),
        _ => (-2.0, 2.0),
    }
}

struct Built {
    graph: Graph,
    params: Vec<(String, Vec<f64>)>,
}

/// The case's op in f64 on random params; int / bool operands (indices, conditions, positions)
/// and custom attention masks stay constants from the table. The loss is `sum(op(...) * w)`.
fn build(case: &Value, rng: &mut Rng) -> Option<Built> {
    build_in(case, rng, DType::F64)
}

/// [`build`] with float values of dtype `ft`.
fn build_in(case: &Value, rng: &mut Rng, ft: DType) -> Option<Built> {
    let op_name = case["op"].as_str().unwrap();
    if NOT_DIFFERENTIABLE.iter().any(|(o, _)| *o == op_name) || unbounded_while(case) {
        return None;
    }
    let mut g = Graph::new(case["name"].as_str().unwrap());
    let mut args = Vec::new();
    let mut params = Vec::new();
    for (i, inp) in case["inputs"].as_array().unwrap().iter().enumerate() {
        let dt = dtype(&inp["dtype"]);
        let dims = usizes(&inp["shape"]);
        let n: usize = dims.iter().product();
        let data: Vec<f64> = inp["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let is_mask = op_name == "attention" && i == 3;
        let id = if dt.is_float() && !is_mask {
            let (lo, hi) = domain(op_name, i);
            let v: Vec<f64> = (0..n).map(|_| rng.uniform(lo, hi)).collect();
            let name = format!("p{i}");
            params.push((name.clone(), v));
            g.param(&name, Shape::new(&dims, ft))
        } else if dt.is_float() {
            g.constant_bytes(Shape::new(&dims, ft), encode(&data, ft))
        } else {
            g.constant_bytes(Shape::new(&dims, dt), encode(&data, dt))
        };
        args.push(match inp.get("perm") {
            Some(p) => g.transpose(id, &usizes(p)),
            None => id,
        });
    }
    let mut op = op_of(op_name, &case["attrs"]);
    if let Op::Cast { to } = &mut op {
        if !to.is_float() {
            return None;
        }
        *to = ft;
    }
    let y = g.try_op(op, &args).ok()?;
    if !g.shape(y).dtype().is_float() || params.is_empty() {
        return None;
    }
    let yd = g.shape(y).static_dims().unwrap();
    let n: usize = yd.iter().product();
    if n == 0 || params.iter().any(|(_, v)| v.is_empty()) {
        return None;
    }
    let w: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let w = g.constant_bytes(Shape::new(&yd, ft), encode(&w, ft));
    let p = g.mul(y, w);
    let axes: Vec<usize> = (0..yd.len()).collect();
    let loss = g.sum(p, &axes, false);
    g.set_outputs(vec![loss]);
    Some(Built { graph: g, params })
}

fn set_all(c: &mut CompiledGraph, params: &[(String, Vec<f64>)]) {
    for (name, v) in params {
        c.set_param_typed(name, &encode(v, DType::F64), DType::F64);
    }
}

fn scalar_out(outs: &[(Vec<u8>, DType)], i: usize) -> f64 {
    decode(&outs[i].0, outs[i].1)[0]
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

/// Check one case; `Ok(false)` when the case has nothing differentiable.
fn check(case: &Value) -> Result<bool, String> {
    let mut rng = Rng(0x5eed ^ case["name"].as_str().unwrap().len() as u64);
    let Some(b) = build(case, &mut rng) else {
        return Ok(false);
    };
    let session = Session::new(Device::Cpu).with_threads(1);
    let mut fwd = session
        .try_compile(b.graph.clone())
        .map_err(|e| format!("forward: {e}"))?;
    let wrt: Vec<NodeId> = b
        .params
        .iter()
        .map(|(n, _)| b.graph.find_leaf(n).unwrap())
        .collect();
    let gg = grad_with_loss(&b.graph, &wrt).map_err(|e| format!("grad_with_loss: {e}"))?;
    let mut bwd = session
        .try_compile(gg)
        .map_err(|e| format!("grad graph: {e}"))?;
    set_all(&mut bwd, &b.params);
    let one = encode(&[1.0], DType::F64);
    let outs = bwd
        .try_run_typed(&[(D_OUTPUT, &one, DType::F64)])
        .map_err(|e| format!("grad run: {e}"))?;
    let loss_of = |fwd: &mut CompiledGraph, params: &[(String, Vec<f64>)]| -> f64 {
        set_all(fwd, params);
        scalar_out(&fwd.run_typed(&[]), 0)
    };
    set_all(&mut fwd, &b.params);
    let l0 = scalar_out(&fwd.run_typed(&[]), 0);
    if !close(l0, scalar_out(&outs, 0), 1e-12) {
        return Err(format!(
            "loss from the grad graph {} differs from the forward loss {l0}",
            scalar_out(&outs, 0)
        ));
    }
    const H: f64 = 1e-6;
    const TOL: f64 = 1e-5;
    let mut probe = b.params.clone();
    for (pi, (name, v)) in b.params.iter().enumerate() {
        let grad = decode(&outs[1 + pi].0, outs[1 + pi].1);
        // At most 24 elements per operand, spread over it.
        let step = (v.len() / 24).max(1);
        for e in (0..v.len()).step_by(step) {
            probe[pi].1[e] = v[e] + H;
            let up = loss_of(&mut fwd, &probe);
            probe[pi].1[e] = v[e] - H;
            let down = loss_of(&mut fwd, &probe);
            probe[pi].1[e] = v[e];
            let fd = (up - down) / (2.0 * H);
            if !close(fd, grad[e], TOL) {
                return Err(format!(
                    "d loss / d {name}[{e}]: reverse mode {} vs finite difference {fd}",
                    grad[e]
                ));
            }
        }
    }
    // Forward mode along a random direction v: jvp == FD and jvp == grad · v.
    let names: Vec<&str> = b.params.iter().map(|(n, _)| n.as_str()).collect();
    let jg = jvp(&b.graph, &names).map_err(|e| format!("jvp: {e}"))?;
    let mut jc = session
        .try_compile(jg)
        .map_err(|e| format!("jvp graph: {e}"))?;
    set_all(&mut jc, &b.params);
    let dirs: Vec<Vec<f64>> = b
        .params
        .iter()
        .map(|(_, v)| v.iter().map(|_| rng.uniform(-1.0, 1.0)).collect())
        .collect();
    let tnames: Vec<String> = names.iter().map(|n| tangent_name(n)).collect();
    let tbytes: Vec<Vec<u8>> = dirs.iter().map(|d| encode(d, DType::F64)).collect();
    let feeds: Vec<(&str, &[u8], DType)> = tnames
        .iter()
        .zip(&tbytes)
        .map(|(n, b)| (n.as_str(), b.as_slice(), DType::F64))
        .collect();
    let jo = jc
        .try_run_typed(&feeds)
        .map_err(|e| format!("jvp run: {e}"))?;
    let tangent = scalar_out(&jo, 1);
    let shifted = |s: f64| -> Vec<(String, Vec<f64>)> {
        b.params
            .iter()
            .zip(&dirs)
            .map(|((n, v), d)| (n.clone(), v.iter().zip(d).map(|(x, y)| x + s * y).collect()))
            .collect()
    };
    let fd = (loss_of(&mut fwd, &shifted(H)) - loss_of(&mut fwd, &shifted(-H))) / (2.0 * H);
    if !close(fd, tangent, TOL) {
        return Err(format!(
            "forward mode {tangent} vs directional finite difference {fd}"
        ));
    }
    let dot: f64 = (0..b.params.len())
        .map(|i| {
            decode(&outs[1 + i].0, DType::F64)
                .iter()
                .zip(&dirs[i])
                .map(|(a, b)| a * b)
                .sum::<f64>()
        })
        .sum();
    if !close(dot, tangent, 1e-9) {
        return Err(format!("forward mode {tangent} vs grad · v {dot}"));
    }
    Ok(true)
}

#[test]
fn reverse_and_forward_mode_match_finite_differences_for_every_op() {
    let cases = cases();
    let mut checked = BTreeSet::new();
    let mut failures = Vec::new();
    let mut count = 0;
    for c in &cases {
        let dts: Vec<DType> = c["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| dtype(&i["dtype"]))
            .collect();
        // f32 / f64 cases carry the structure; half-precision and integer variants add nothing here.
        if dts.iter().any(|d| matches!(d, DType::F16 | DType::BF16)) {
            continue;
        }
        match check(c) {
            Ok(true) => {
                checked.insert(c["op"].as_str().unwrap().to_string());
                count += 1;
            }
            Ok(false) => {}
            Err(e) => failures.push(format!("{}: {e}", c["name"].as_str().unwrap())),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let all: BTreeSet<String> = cases
        .iter()
        .map(|c| c["op"].as_str().unwrap().to_string())
        .collect();
    let excused: BTreeSet<String> = NOT_DIFFERENTIABLE
        .iter()
        .map(|(o, _)| o.to_string())
        .collect();
    let missing: Vec<&String> = all
        .iter()
        .filter(|o| !checked.contains(*o) && !excused.contains(*o))
        .collect();
    assert!(
        missing.is_empty(),
        "ops whose derivatives were never checked: {missing:?}"
    );
    assert!(count > 200, "only {count} cases checked");
    eprintln!("{count} cases checked over {} ops", checked.len());
}

/// The gradient cases the GPU is allowed not to run: (op, dtype, why); the dtype matches a case
/// one of whose inputs has it. Every other differentiable case must run on the GPU, and every
/// entry must allow at least one case, so the list shrinks as the GPU backend grows.
const GRADS_NOT_ON_THE_GPU: &[(&str, &str, &str)] = &[(
    "gather",
    "i64",
    "the indices stay an i64 constant of the grad graph, and WGSL has no 64-bit integers",
)];

/// The entry of [`GRADS_NOT_ON_THE_GPU`] allowing case `c`, if any (its index).
fn grad_allowed_off_the_gpu(c: &Value) -> Option<usize> {
    let op = c["op"].as_str().unwrap();
    let dtypes: BTreeSet<&str> = c["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["dtype"].as_str())
        .collect();
    GRADS_NOT_ON_THE_GPU
        .iter()
        .position(|(o, d, _)| *o == op && dtypes.contains(d))
}

/// The gradients of every differentiable case, in f32, computed on the GPU (lavapipe in CI)
/// match the CPU's: the same grad graphs through the same passes, another backend. A case the
/// GPU cannot compile for want of a GPU form must be in [`GRADS_NOT_ON_THE_GPU`]; any other
/// error fails the test. (Cases with nothing differentiable, which [`build_in`] declines, are
/// not gradient cases; the CPU test skips the same ones.)
#[test]
fn gradients_on_the_gpu_match_the_cpu() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let (mut ran, mut failures) = (0, Vec::new());
    let mut used = vec![0usize; GRADS_NOT_ON_THE_GPU.len()];
    for case in &cases() {
        let name = case["name"].as_str().unwrap();
        let mut rng = Rng(0x5eed ^ name.len() as u64);
        let Some(b) = build_in(case, &mut rng, DType::F32) else {
            continue;
        };
        let wrt: Vec<NodeId> = b
            .params
            .iter()
            .map(|(n, _)| b.graph.find_leaf(n).unwrap())
            .collect();
        let gg = match grad_with_loss(&b.graph, &wrt) {
            Ok(gg) => gg,
            Err(e) => {
                failures.push(format!("{name}: grad_with_loss: {e}"));
                continue;
            }
        };
        let run = |device: Device| run_grads(device, &gg, &b.params);
        let cpu = run(Device::Cpu).unwrap_or_else(|e| panic!("{name} on the CPU: {e}"));
        let gpu = match run(Device::Gpu) {
            Ok(v) => v,
            Err(e) => {
                let no_gpu_form = e.contains("no WGSL kernel")
                    || e.contains("do not run on the GPU")
                    || e.contains("no decomposition");
                match grad_allowed_off_the_gpu(case) {
                    Some(i) if no_gpu_form => used[i] += 1,
                    Some(i) => failures.push(format!(
                        "{name}: {e} (in the allow-list as {:?}, but the error is not a missing GPU form)",
                        GRADS_NOT_ON_THE_GPU[i]
                    )),
                    None => failures.push(format!("{name}: {e} (not in GRADS_NOT_ON_THE_GPU)")),
                }
                continue;
            }
        };
        ran += 1;
        for (k, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
            let scale = c.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            if let Some((e, (x, y))) = c
                .iter()
                .zip(g)
                .enumerate()
                .find(|(_, (x, y))| (*x - *y).abs() > 1e-4 * scale || x.is_nan() != y.is_nan())
            {
                failures.push(format!("{name}: output {k}[{e}]: CPU {x}, GPU {y}"));
                break;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} gradient cases fail on the GPU:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let unused: Vec<_> = GRADS_NOT_ON_THE_GPU
        .iter()
        .zip(&used)
        .filter(|(_, n)| **n == 0)
        .map(|(e, _)| e)
        .collect();
    assert!(
        unused.is_empty(),
        "entries of GRADS_NOT_ON_THE_GPU that no case needs any more (remove them): {unused:?}"
    );
    assert!(ran >= 200, "only {ran} gradient cases ran on the GPU");
    eprintln!("{ran} gradient cases on the GPU; not on the GPU, by allow-list entry:");
    for ((op, dt, why), n) in GRADS_NOT_ON_THE_GPU.iter().zip(&used) {
        eprintln!("  {n:3} {op} [{dt}]: {why}");
    }
}

/// Composite ops are differentiated through their decompositions: those must compute what the
/// native kernels compute.
#[test]
fn decompositions_match_native_kernels() {
    let mut n = 0;
    for c in cases() {
        let op = op_of(c["op"].as_str().unwrap(), &c["attrs"]);
        let excused = NOT_DIFFERENTIABLE
            .iter()
            .any(|(o, _)| *o == c["op"].as_str().unwrap())
            || unbounded_while(&c);
        if rlx::ir::ops::has_ad_rules(&op) || excused {
            continue;
        }
        let mut g = Graph::new("native");
        let mut feeds = Vec::new();
        let mut args = Vec::new();
        for (i, inp) in c["inputs"].as_array().unwrap().iter().enumerate() {
            let dt = dtype(&inp["dtype"]);
            let data: Vec<f64> = inp["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let id = g.input(&format!("in{i}"), Shape::new(&usizes(&inp["shape"]), dt));
            args.push(match inp.get("perm") {
                Some(p) => g.transpose(id, &usizes(p)),
                None => id,
            });
            feeds.push((format!("in{i}"), encode(&data, dt), dt));
        }
        let y = g.op(op, &args);
        g.set_outputs(vec![y]);
        let decomposed = rlx::autodiff::prepare_for_ad(&g).unwrap();
        let f: Vec<(&str, &[u8], DType)> = feeds
            .iter()
            .map(|(a, b, d)| (a.as_str(), b.as_slice(), *d))
            .collect();
        let s = Session::new(Device::Cpu);
        let a = s.compile(g).run_typed(&f);
        let b = s.compile(decomposed).run_typed(&f);
        let (x, y) = (decode(&a[0].0, a[0].1), decode(&b[0].0, b[0].1));
        let tol = c["rtol"].as_f64().unwrap().max(1e-5) * 4.0;
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            assert!(
                (p - q).abs() <= tol * (1.0 + p.abs()),
                "{}: element {i}: native {p}, decomposed {q}",
                c["name"]
            );
        }
        n += 1;
    }
    assert!(n > 30, "only {n} composite cases");
}

/// d(a^b)/db at a = 0 is 0 (as in JAX), not 0 * log(0) = NaN, in both modes.
#[test]
fn pow_exponent_derivative_at_zero_base() {
    let mut g = Graph::new("p");
    let a = g.input("a", Shape::scalar(DType::F64));
    let b = g.input("b", Shape::scalar(DType::F64));
    let y = g.pow(a, b);
    g.set_outputs(vec![y]);
    let feeds = |a: f64, b: f64| (encode(&[a], DType::F64), encode(&[b], DType::F64));
    let (fa, fb) = feeds(0.0, 2.0);
    let mut c = Session::new(Device::Cpu).compile(rlx::autodiff::grad(&g, &[a, b]).unwrap());
    let o = c.run_typed(&[("a", &fa, DType::F64), ("b", &fb, DType::F64)]);
    assert_eq!(
        (
            decode(&o[0].0, DType::F64)[0],
            decode(&o[1].0, DType::F64)[0]
        ),
        (0.0, 0.0)
    );
    let mut j = Session::new(Device::Cpu).compile(jvp(&g, &["b"]).unwrap());
    let one = encode(&[1.0], DType::F64);
    let o = j.run_typed(&[
        ("a", &fa, DType::F64),
        ("b", &fb, DType::F64),
        (tangent_name("b").as_str(), &one, DType::F64),
    ]);
    assert_eq!(decode(&o[1].0, DType::F64)[0], 0.0);
}

/// FakeQuantize's gradient is the straight-through estimator, not the derivative of the step
/// function finite differences would see: the cotangent passes exactly where the value was not
/// clamped (forward and reverse mode), and scale and zero point get none.
#[test]
fn fake_quantize_passes_gradients_straight_through() {
    for axis in [None, Some(1)] {
        let mut g = Graph::new("fq");
        let x = g.input("x", Shape::new(&[2, 3], DType::F32));
        let (sd, sv, zv): (Vec<usize>, Vec<f32>, Vec<f64>) = if axis.is_some() {
            (vec![3], vec![0.5, 0.25, 1.0], vec![0.0, 3.0, -2.0])
        } else {
            (vec![], vec![0.5], vec![0.0])
        };
        let s = g.constant_f32(&sd, &sv);
        let z = g
            .try_constant_bytes(Shape::new(&sd, DType::I8), encode(&zv, DType::I8))
            .unwrap();
        let y = g.op(Op::defined(FakeQuantize { axis }), &[x, s, z]);
        let w = g.constant_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let l = g.mul(y, w);
        let l = g.sum(l, &[0, 1], false);
        g.set_outputs(vec![l]);
        // In range, clamped above (x / s + zp > 127), clamped below, in range...
        let xs = [0.3f32, 100.0, -100.0, -0.7, 1.2, 60.0];
        let dx = rlx::autodiff::grad(&g, &[x]).unwrap();
        let mut c = Session::new(Device::Cpu).compile(dx);
        let got = c.run(&[("x", &xs)]).remove(0);
        let (lo, hi) = (-128.0f64, 127.0f64);
        let want: Vec<f32> = xs
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let ch = i % 3;
                let (s, z) = if axis.is_some() {
                    (sv[ch] as f64, zv[ch])
                } else {
                    (sv[0] as f64, zv[0])
                };
                let q = (v as f64 / s).round_ties_even() + z;
                if (lo..=hi).contains(&q) {
                    (i + 1) as f32
                } else {
                    0.0
                }
            })
            .collect();
        assert_eq!(got, want, "axis {axis:?}");
        assert!(
            want.contains(&0.0) && want.iter().any(|&v| v != 0.0),
            "the case exercises both sides"
        );
        // Forward mode gives the same directional derivative along every unit tangent.
        let jv = rlx::autodiff::jvp(&g, &["x"]).unwrap();
        let mut cj = Session::new(Device::Cpu).compile(jv);
        for i in 0..6 {
            let mut t = [0f32; 6];
            t[i] = 1.0;
            let tn = rlx::autodiff::tangent_name("x");
            let out = cj.run(&[("x", &xs), (tn.as_str(), &t)]);
            assert_eq!(
                *out.last().unwrap(),
                vec![want[i]],
                "jvp along x[{i}], axis {axis:?}"
            );
        }
    }
}

/// The autodiff table's gradients through the CUDA backend (its pipeline, lowering and CUDA C
/// kernels), the programs run in host emulation (`rlx_cuda::emulate`, registered for
/// `Device::Cuda` in this process), match the CPU's within 1e-4 of each output's scale; every
/// kernel is also compiled by NVRTC for sm_80 and sm_90 (required where `scripts/test.sh` set
/// `RLX_REQUIRE_NVRTC=1`). No case may fail to compile.
#[test]
fn gradients_of_cuda_programs_in_host_emulation_match_the_cpu() {
    rlx::driver::register_backend(
        Device::Cuda,
        std::sync::Arc::new(rlx_cuda::emulate::EmulatedBackend),
    );
    let mut graphs = Vec::new();
    for case in &cases() {
        let name = case["name"].as_str().unwrap().to_string();
        let mut rng = Rng(0x5eed ^ name.len() as u64);
        let Some(b) = build_in(case, &mut rng, DType::F32) else {
            continue;
        };
        let wrt: Vec<NodeId> = b
            .params
            .iter()
            .map(|(n, _)| b.graph.find_leaf(n).unwrap())
            .collect();
        let gg = grad_with_loss(&b.graph, &wrt).unwrap_or_else(|e| panic!("{name}: {e}"));
        graphs.push((name, b, gg));
    }
    // One host build of every kernel the programs will launch.
    let mut kernels = std::collections::BTreeSet::new();
    for (name, _, gg) in &graphs {
        let l = Session::new(Device::Cuda)
            .try_lower(gg.clone())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let p = rlx_cuda::lower(&l.graph, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        kernels.extend(p.kernels);
    }
    rlx_cuda::emulate::Emulator::prebuild(&kernels).unwrap();
    let mut failures = Vec::new();
    for (name, b, gg) in &graphs {
        let run = |device: Device| run_grads(device, gg, &b.params);
        let cpu = run(Device::Cpu).unwrap_or_else(|e| panic!("{name} on the CPU: {e}"));
        let cuda = match run(Device::Cuda) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        for (k, (c, g)) in cpu.iter().zip(&cuda).enumerate() {
            let scale = c.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            if let Some((e, (x, y))) = c
                .iter()
                .zip(g)
                .enumerate()
                .find(|(_, (x, y))| (*x - *y).abs() > 1e-4 * scale || x.is_nan() != y.is_nan())
            {
                failures.push(format!("{name}: output {k}[{e}]: CPU {x}, CUDA {y}"));
                break;
            }
        }
    }
    eprintln!(
        "CUDA gradients in host emulation: {} cases, {} kernels, {} fail",
        graphs.len(),
        kernels.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} gradient cases fail through CUDA:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The outputs of gradient graph `gg` on `device` with `params` set and the output's cotangent 1.
fn run_grads(
    device: Device,
    gg: &Graph,
    params: &[(String, Vec<f64>)],
) -> Result<Vec<Vec<f64>>, String> {
    let mut c = Session::new(device)
        .try_compile(gg.clone())
        .map_err(|e| e.to_string())?;
    for (n, v) in params {
        c.set_param_typed(n, &encode(v, DType::F32), DType::F32);
    }
    let one = encode(&[1.0], DType::F32);
    let outs = c
        .try_run_typed(&[(D_OUTPUT, &one, DType::F32)])
        .map_err(|e| e.to_string())?;
    Ok(outs.iter().map(|(o, d)| decode(o, *d)).collect())
}

/// `value_and_grad` keeps every output of the graph (JAX's `has_aux`) before the gradients,
/// and its gradients are `grad`'s: `loss = Σ w²` with the aux output `3w` gives
/// `[Σ w², 3w, 2w]`.
#[test]
fn value_and_grad_keeps_the_other_outputs_and_gives_grads_gradients() {
    let mut g = Graph::new("vg");
    let w = g.param("w", Shape::new(&[3], DType::F32));
    let sq = g.mul(w, w);
    let loss = g.sum(sq, &[0], false);
    let three = g.scalar(3.0, DType::F32);
    let aux = g.mul(w, three);
    g.set_outputs(vec![loss, aux]);
    let vg = rlx::autodiff::value_and_grad(&g, &[w]).unwrap();
    assert_eq!(vg.outputs().len(), 3);
    let mut c = Session::new(Device::Cpu).compile(vg);
    c.set_param("w", &[1.0, -2.0, 0.5]);
    let out = c.run(&[]);
    assert_eq!(
        out,
        vec![vec![5.25], vec![3.0, -6.0, 1.5], vec![2.0, -4.0, 1.0]]
    );
    let gr = rlx::autodiff::grad(&g, &[w]).unwrap();
    let mut c = Session::new(Device::Cpu).compile(gr);
    c.set_param("w", &[1.0, -2.0, 0.5]);
    assert_eq!(c.run(&[]), vec![vec![2.0, -4.0, 1.0]]);
}
