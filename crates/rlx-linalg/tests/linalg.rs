//! rlx-linalg against JAX (`tests/golden/linalg.json`, from `gen_linalg.py`): for every case the
//! reference evaluator and the CPU kernel (faer) give JAX's values, reverse mode through RLX's
//! autodiff gives JAX's gradients, and forward mode agrees with them (the tangent along a
//! direction is the gradient's dot product). Also: f32, vmap, the text form, shape errors, the
//! GPU's refusal by name (no kernel, no decomposition), and `qr` of a wide matrix (values only:
//! its derivative is a named error, as JAX has none).

use rlx::ir::eval::Tensor;
use rlx::prelude::*;
use rlx_linalg::{apply, EighOutput, Linalg, QrOutput, SvdOutput};
use serde_json::Value;
use std::collections::BTreeMap;

fn cases() -> Vec<Value> {
    let at = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/linalg.json");
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(at).expect("golden file")).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn dims(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn op_of(c: &Value) -> Linalg {
    match c["op"].as_str().unwrap() {
        "solve" => Linalg::Solve,
        "triangular_solve" => Linalg::TriangularSolve {
            lower: c["attrs"]["lower"].as_bool().unwrap(),
        },
        "cholesky" => Linalg::Cholesky,
        "inv" => Linalg::Inv,
        "det" => Linalg::Det,
        "logabsdet" => Linalg::LogAbsDet,
        "eigh" => Linalg::Eigh {
            output: match c["attrs"]["output"].as_str().unwrap() {
                "values" => EighOutput::Values,
                _ => EighOutput::Vectors,
            },
        },
        "qr" => Linalg::Qr {
            output: match c["attrs"]["output"].as_str().unwrap() {
                "q" => QrOutput::Q,
                _ => QrOutput::R,
            },
        },
        "svd" => Linalg::Svd {
            output: match c["attrs"]["output"].as_str().unwrap() {
                "u" => SvdOutput::U,
                "s" => SvdOutput::S,
                _ => SvdOutput::Vt,
            },
        },
        other => panic!("unknown op {other}"),
    }
}

const NAMES: [&str; 2] = ["a", "b"];

/// The case's op on params `a` (and `b`) of `dt`; outputs `[loss = sum(result * W), result]`.
fn graph(c: &Value, dt: DType) -> Graph {
    rlx_linalg::register().unwrap();
    let mut g = Graph::new(c["name"].as_str().unwrap());
    let ins: Vec<NodeId> = c["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, x)| g.param(NAMES[i], Shape::new(&dims(&x["shape"]), dt)))
        .collect();
    let y = apply(&mut g, op_of(c), &ins).unwrap();
    let od = dims(&c["expected"]["shape"]);
    let w = Tensor::from_f64(&od, dt, f64s(&c["cotangent"]));
    let w = g
        .try_constant_bytes(Shape::new(&od, dt), w.to_bytes())
        .unwrap();
    let p = g.mul(y, w);
    let axes: Vec<usize> = (0..od.len()).collect();
    let loss = g
        .try_op(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes,
                keepdims: false,
            },
            &[p],
        )
        .unwrap();
    g.set_outputs(vec![loss, y]);
    g
}

fn set_inputs(c: &mut CompiledGraph, case: &Value, dt: DType) {
    for (i, x) in case["inputs"].as_array().unwrap().iter().enumerate() {
        let t = Tensor::from_f64(&dims(&x["shape"]), dt, f64s(&x["data"]));
        c.set_param_typed(NAMES[i], &t.to_bytes(), dt);
    }
}

fn close(what: &str, got: &[f64], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rtol * scale,
            "{what}[{k}]: {g} vs JAX {w} (rtol {rtol} of {scale})"
        );
    }
}

/// Deterministic values in [-0.5, 0.5) (xorshift from `seed`).
fn uniform(seed: u64) -> impl FnMut() -> f64 {
    let mut s = seed;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    }
}

fn as_f64(bytes: &[u8], dt: DType) -> Vec<f64> {
    Tensor::from_bytes(&Shape::new(&[bytes.len() / dt.size_bytes()], dt), bytes)
        .unwrap()
        .f64s()
}

#[test]
fn values_match_jax_on_the_reference_evaluator_and_the_cpu() {
    for c in cases() {
        let name = c["name"].as_str().unwrap();
        let g = graph(&c, DType::F64);
        let want = f64s(&c["expected"]["data"]);
        // The reference evaluator.
        let leaves: BTreeMap<String, Tensor> = c["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, x)| {
                (
                    NAMES[i].to_string(),
                    Tensor::from_f64(&dims(&x["shape"]), DType::F64, f64s(&x["data"])),
                )
            })
            .collect();
        let r = rlx::ir::eval::evaluate(&g, &leaves).unwrap();
        close(&format!("{name} (reference)"), &r[1].f64s(), &want, 1e-10);
        // The CPU runs the faer kernel (no decomposition exists).
        let mut cg = Session::new(Device::Cpu).compile(g);
        assert!(cg
            .dispatch_report()
            .nodes
            .iter()
            .any(|n| n.op == c["op"].as_str().unwrap()));
        set_inputs(&mut cg, &c, DType::F64);
        let out = cg.run_typed(&[]);
        close(
            &format!("{name} (CPU)"),
            &as_f64(&out[1].0, DType::F64),
            &want,
            1e-10,
        );
        // f32: the same values to f32 precision.
        let g32 = graph(&c, DType::F32);
        let mut c32 = Session::new(Device::Cpu).compile(g32);
        set_inputs(&mut c32, &c, DType::F32);
        let out = c32.run_typed(&[]);
        close(
            &format!("{name} (CPU, f32)"),
            &as_f64(&out[1].0, DType::F32),
            &want,
            1e-4,
        );
    }
}

#[test]
fn reverse_and_forward_mode_match_jax() {
    for c in cases() {
        let name = c["name"].as_str().unwrap();
        let g = graph(&c, DType::F64);
        let n_in = c["inputs"].as_array().unwrap().len();
        let wrt: Vec<NodeId> = NAMES[..n_in]
            .iter()
            .map(|n| g.find_leaf(n).unwrap())
            .collect();
        let gg = rlx::autodiff::grad(&g, &wrt).unwrap();
        let mut cg = Session::new(Device::Cpu).compile(gg);
        set_inputs(&mut cg, &c, DType::F64);
        let outs = cg.run_typed(&[]);
        let jax: Vec<Vec<f64>> = c["grads"].as_array().unwrap().iter().map(f64s).collect();
        for (k, want) in jax.iter().enumerate() {
            close(
                &format!("{name}: d loss / d {}", NAMES[k]),
                &as_f64(&outs[k].0, DType::F64),
                want,
                1e-8,
            );
        }
        // Forward mode: the loss's tangent along a direction is JAX's gradient dotted with it.
        let jg = rlx::autodiff::jvp(&g, &NAMES[..n_in]).unwrap();
        let mut cj = Session::new(Device::Cpu).compile(jg);
        set_inputs(&mut cj, &c, DType::F64);
        let mut dirs = Vec::new();
        let mut dot = 0.0;
        for (k, x) in c["inputs"].as_array().unwrap().iter().enumerate() {
            let d = dims(&x["shape"]);
            let v: Vec<f64> = (0..d.iter().product::<usize>())
                .map(|i| ((i * 7 + k * 3) % 5) as f64 / 5.0 - 0.4)
                .collect();
            dot += v.iter().zip(&jax[k]).map(|(a, b)| a * b).sum::<f64>();
            dirs.push((
                rlx::autodiff::tangent_name(NAMES[k]),
                Tensor::from_f64(&d, DType::F64, v).to_bytes(),
            ));
        }
        let feeds: Vec<(&str, &[u8], DType)> = dirs
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice(), DType::F64))
            .collect();
        let outs = cj.run_typed(&feeds);
        // Outputs: [loss, result, d loss, d result].
        let tangent = as_f64(&outs[2].0, DType::F64)[0];
        assert!(
            (tangent - dot).abs() <= 1e-8 * dot.abs().max(1.0),
            "{name}: jvp {tangent} vs {dot}"
        );
    }
}

#[test]
fn vmap_text_form_errors_and_the_gpus_refusal() {
    rlx_linalg::register().unwrap();
    // vmap of solve over a batch of 2 matrices and right-hand sides equals each solved alone.
    let mut one = Graph::new("one");
    let a = one.input("a", Shape::new(&[2, 2], DType::F64));
    let b = one.input("b", Shape::new(&[2, 1], DType::F64));
    let x = apply(&mut one, Linalg::Solve, &[a, b]).unwrap();
    one.set_outputs(vec![x]);
    let vg = rlx::autodiff::vmap(&one, &["a", "b"], 2).unwrap();
    let mut c = Session::new(Device::Cpu).compile(vg);
    let av = [2.0, 1.0, 1.0, 3.0, 4.0, 0.0, 1.0, 2.0f64];
    let bv = [3.0, 5.0, 8.0, 4.0f64];
    let bytes = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let out = c.run_typed(&[
        ("a", &bytes(&av), DType::F64),
        ("b", &bytes(&bv), DType::F64),
    ]);
    // [[2,1],[1,3]] x = [3,5] -> x = [0.8, 1.4]; [[4,0],[1,2]] x = [8,4] -> x = [2, 1].
    close(
        "vmap(solve)",
        &as_f64(&out[0].0, DType::F64),
        &[0.8, 1.4, 2.0, 1.0],
        1e-12,
    );

    // The text form prints and parses the ops with their attributes.
    let mut g = Graph::new("t");
    let a = g.input("a", Shape::new(&[3, 3], DType::F32));
    let b = g.input("b", Shape::new(&[3, 2], DType::F32));
    let x = apply(&mut g, Linalg::TriangularSolve { lower: false }, &[a, b]).unwrap();
    let l = apply(&mut g, Linalg::Cholesky, &[a]).unwrap();
    let d = apply(&mut g, Linalg::Det, &[l]).unwrap();
    g.set_outputs(vec![x, d]);
    let text = g.to_text();
    assert!(
        text.contains("triangular_solve") && text.contains("lower = false"),
        "{text}"
    );
    assert_eq!(Graph::parse(&text).unwrap().to_text(), text);

    // Shape errors name the op and the shapes.
    let mut bad = Graph::new("bad");
    let a = bad.input("a", Shape::new(&[3, 2], DType::F32));
    let e = apply(&mut bad, Linalg::Inv, &[a]).unwrap_err().to_string();
    assert!(e.contains("inv") && e.contains("[3, 2]"), "{e}");
    let a = bad.input("a2", Shape::new(&[3, 3], DType::F32));
    let b = bad.input("b2", Shape::new(&[4, 1], DType::F32));
    let e = apply(&mut bad, Linalg::Solve, &[a, b])
        .unwrap_err()
        .to_string();
    assert!(e.contains("solve") && e.contains("[4, 1]"), "{e}");

    // The GPU has no kernel and the op no decomposition: a compile error naming it (the
    // suite's GPU is Mesa's software Vulkan, which scripts/test.sh installs).
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let e = Session::new(Device::Gpu)
        .try_compile(g)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("triangular_solve") && e.contains("no decomposition"),
        "{e}"
    );
}

#[test]
fn wide_qr_two_result_ops_in_text_and_vmap() {
    rlx_linalg::register().unwrap();
    // A wide matrix (m < n): q [3, 3], r [3, 5] with q r = a, on the reference evaluator and
    // the CPU; its derivative is a named error (JAX has none either).
    let (m, n) = (3, 5);
    let av: Vec<f64> = (0..m * n)
        .map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0)
        .collect();
    let mut g = Graph::new("wide");
    let a = g.param("a", Shape::new(&[m, n], DType::F64));
    let q = apply(
        &mut g,
        Linalg::Qr {
            output: QrOutput::Q,
        },
        &[a],
    )
    .unwrap();
    let r = apply(
        &mut g,
        Linalg::Qr {
            output: QrOutput::R,
        },
        &[a],
    )
    .unwrap();
    g.set_outputs(vec![q, r]);
    assert_eq!(g.shape(q).static_dims().unwrap(), vec![3, 3]);
    assert_eq!(g.shape(r).static_dims().unwrap(), vec![3, 5]);
    let leaves: BTreeMap<String, Tensor> = [(
        "a".to_string(),
        Tensor::from_f64(&[m, n], DType::F64, av.clone()),
    )]
    .into();
    let want = rlx::ir::eval::evaluate(&g, &leaves).unwrap();
    let mut c = Session::new(Device::Cpu).compile(g.clone());
    c.set_param_typed(
        "a",
        &Tensor::from_f64(&[m, n], DType::F64, av.clone()).to_bytes(),
        DType::F64,
    );
    let out = c.run_typed(&[]);
    let (qv, rv) = (as_f64(&out[0].0, DType::F64), as_f64(&out[1].0, DType::F64));
    close("wide q (CPU vs reference)", &qv, &want[0].f64s(), 1e-12);
    close("wide r (CPU vs reference)", &rv, &want[1].f64s(), 1e-12);
    let qr: Vec<f64> = (0..m * n)
        .map(|p| {
            (0..m)
                .map(|t| qv[(p / n) * m + t] * rv[t * n + p % n])
                .sum()
        })
        .collect();
    close("q r = a", &qr, &av, 1e-12);
    for i in 0..m {
        assert!(rv[i * n + i] >= 0.0, "r's diagonal is non-negative");
    }
    let mut loss_g = g.clone();
    let axes = vec![0, 1];
    let s = loss_g
        .try_op(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes,
                keepdims: false,
            },
            &[q],
        )
        .unwrap();
    loss_g.set_outputs(vec![s]);
    let e = rlx::autodiff::grad(&loss_g, &[a]).unwrap_err().to_string();
    assert!(e.contains("qr") && e.contains("m >= n"), "{e}");

    // The text form keeps which result a node is.
    let mut t = Graph::new("t");
    let x = t.input("x", Shape::new(&[4, 4], DType::F32));
    let w = apply(
        &mut t,
        Linalg::Eigh {
            output: EighOutput::Values,
        },
        &[x],
    )
    .unwrap();
    let v = apply(
        &mut t,
        Linalg::Eigh {
            output: EighOutput::Vectors,
        },
        &[x],
    )
    .unwrap();
    let r = apply(
        &mut t,
        Linalg::Qr {
            output: QrOutput::R,
        },
        &[x],
    )
    .unwrap();
    t.set_outputs(vec![w, v, r]);
    let text = t.to_text();
    assert!(
        text.contains("eigh") && text.contains("vectors") && text.contains("output = r"),
        "{text}"
    );
    assert_eq!(Graph::parse(&text).unwrap().to_text(), text);

    // vmap of eigh's values over 3 symmetric matrices equals each alone.
    let mut one = Graph::new("one");
    let x = one.input("x", Shape::new(&[2, 2], DType::F64));
    let w = apply(
        &mut one,
        Linalg::Eigh {
            output: EighOutput::Values,
        },
        &[x],
    )
    .unwrap();
    one.set_outputs(vec![w]);
    let vg = rlx::autodiff::vmap(&one, &["x"], 3).unwrap();
    let mut c = Session::new(Device::Cpu).compile(vg);
    // [[2,1],[1,2]] -> 1, 3; [[0,0],[0,-1]] -> -1, 0; [[1,2],[2,1]] -> -1, 3.
    let xs = [
        2.0, 1.0, 1.0, 2.0, 0.0, 0.0, 0.0, -1.0, 1.0, 2.0, 2.0, 1.0f64,
    ];
    let bytes: Vec<u8> = xs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let out = c.run_typed(&[("x", &bytes, DType::F64)]);
    close(
        "vmap(eigh values)",
        &as_f64(&out[0].0, DType::F64),
        &[1.0, 3.0, -1.0, 0.0, -1.0, 3.0],
        1e-12,
    );
}

/// From 1024 rows the kernels split a factorization over the program's threads (faer's rayon
/// parallelism): solve, Cholesky, QR and singular values of one 1024 × 1024 matrix on two
/// threads agree with one thread, and the solve's residual is small.
#[test]
fn large_matrices_split_over_threads_agree_with_one_thread() {
    rlx_linalg::register().unwrap();
    let n = 1024;
    let mut rnd = uniform(0x2545_f491_4f6c_dd1du64);
    // Symmetric, 2 on the diagonal, off-diagonal entries below 1/n: positive definite and well
    // conditioned by Gershgorin's circles.
    let mut a = vec![0.0; n * n];
    for i in 0..n {
        a[i * n + i] = 2.0;
        for j in 0..i {
            let v = 2.0 * rnd() / n as f64;
            a[i * n + j] = v;
            a[j * n + i] = v;
        }
    }
    let b: Vec<f64> = (0..n).map(|_| rnd()).collect();
    let mut g = Graph::new("large");
    let ai = g.input("a", Shape::new(&[n, n], DType::F64));
    let bi = g.input("b", Shape::new(&[n, 1], DType::F64));
    let outs = vec![
        rlx_linalg::apply(&mut g, Linalg::Solve, &[ai, bi]).unwrap(),
        rlx_linalg::apply(&mut g, Linalg::Cholesky, &[ai]).unwrap(),
        rlx_linalg::apply(
            &mut g,
            Linalg::Qr {
                output: QrOutput::R,
            },
            &[ai],
        )
        .unwrap(),
        rlx_linalg::apply(
            &mut g,
            Linalg::Svd {
                output: SvdOutput::S,
            },
            &[ai],
        )
        .unwrap(),
    ];
    g.set_outputs(outs);
    let bytes = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (ab, bb) = (bytes(&a), bytes(&b));
    let results: Vec<Vec<Vec<f64>>> = [1, 2]
        .iter()
        .map(|&t| {
            let mut c = Session::new(Device::Cpu).with_threads(t).compile(g.clone());
            c.run_typed(&[("a", &ab, DType::F64), ("b", &bb, DType::F64)])
                .iter()
                .map(|o| as_f64(&o.0, DType::F64))
                .collect()
        })
        .collect();
    for (k, what) in ["solve", "cholesky", "qr r", "singular values"]
        .iter()
        .enumerate()
    {
        close(what, &results[1][k], &results[0][k], 1e-9);
    }
    let x = &results[1][0];
    let worst = (0..n)
        .map(|i| ((0..n).map(|j| a[i * n + j] * x[j]).sum::<f64>() - b[i]).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-9, "residual {worst}");
}

/// The kernels past the goldens' sizes and at the documented edges, on the CPU against the
/// reference evaluator (f64 and f32): solve with several right-hand sides at 300 rows (past the
/// LU's recursion), `r` of tall, wide and square QR (past its blocks), Cholesky reading the
/// lower triangle only (the strict upper one holds noise), and the errors of a matrix that is
/// not positive definite and of a singular solve (named on the CPU with the node, and on the
/// reference evaluator).
#[test]
fn kernels_at_size_and_at_the_edges_agree_with_the_reference_evaluator() {
    rlx_linalg::register().unwrap();
    let mut rnd = uniform(0x9e37_79b9_7f4a_7c15u64);
    let n = 300;
    let k = 3;
    let general: Vec<f64> = (0..n * n)
        .map(|p| rnd() + if p % (n + 1) == 0 { 4.0 } else { 0.0 })
        .collect();
    // Lower triangle of a symmetric positive definite matrix, noise above the diagonal.
    let mut spd = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let v = if i == j { 2.0 } else { 2.0 * rnd() / n as f64 };
            spd[i * n + j] = v;
        }
        for j in i + 1..n {
            spd[i * n + j] = 10.0 * rnd();
        }
    }
    let rhs: Vec<f64> = (0..n * k).map(|_| rnd()).collect();
    let tall: Vec<f64> = (0..n * 200).map(|_| rnd()).collect();
    let indefinite = vec![1.0, 2.0, 2.0, 1.0];
    let mut singular = general.clone();
    singular[5 * n..6 * n].fill(0.0);
    let r_of_qr = Linalg::Qr {
        output: QrOutput::R,
    };
    type Case<'a> = (&'a str, Linalg, Vec<(&'a [f64], Vec<usize>)>);
    let cases: Vec<Case> = vec![
        (
            "solve",
            Linalg::Solve,
            vec![(&general, vec![n, n]), (&rhs, vec![n, k])],
        ),
        ("cholesky", Linalg::Cholesky, vec![(&spd, vec![n, n])]),
        ("qr r (tall)", r_of_qr, vec![(&tall, vec![n, 200])]),
        ("qr r (wide)", r_of_qr, vec![(&tall, vec![200, n])]),
        ("qr r (square)", r_of_qr, vec![(&general, vec![n, n])]),
        (
            "cholesky (indefinite)",
            Linalg::Cholesky,
            vec![(&indefinite, vec![2, 2])],
        ),
        (
            "solve (singular)",
            Linalg::Solve,
            vec![(&singular, vec![n, n]), (&rhs, vec![n, k])],
        ),
    ];
    for (what, op, ins) in cases {
        for dt in [DType::F64, DType::F32] {
            let mut g = Graph::new("edge");
            let ids: Vec<NodeId> = ins
                .iter()
                .enumerate()
                .map(|(i, (_, d))| g.input(NAMES[i], Shape::new(d, dt)))
                .collect();
            let y = apply(&mut g, op, &ids).unwrap();
            g.set_outputs(vec![y]);
            let tensors: Vec<Tensor> = ins
                .iter()
                .map(|(v, d)| Tensor::from_f64(d, dt, v.to_vec()))
                .collect();
            let feeds: Vec<(&str, Vec<u8>, DType)> = tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (NAMES[i], t.to_bytes(), dt))
                .collect();
            let refs: Vec<(&str, &[u8], DType)> = feeds
                .iter()
                .map(|(n, b, d)| (*n, b.as_slice(), *d))
                .collect();
            let mut c = Session::new(Device::Cpu).compile(g.clone());
            let got = c.try_run_typed(&refs);
            let leaves: BTreeMap<String, Tensor> = tensors
                .into_iter()
                .enumerate()
                .map(|(i, t)| (NAMES[i].to_string(), t))
                .collect();
            let want = rlx::ir::eval::evaluate(&g, &leaves);
            let label = format!("{what} ({dt})");
            // The edges are errors naming the op and what is wrong, on the CPU (with its node)
            // and on the reference evaluator.
            let named = |op: &str, why: &str| {
                let cpu = got
                    .as_ref()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                let reference = want
                    .as_ref()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                assert!(
                    cpu.starts_with(&format!("{op} (node %")) && cpu.contains(why),
                    "{label} on the CPU: {cpu:?}"
                );
                assert!(
                    reference.starts_with(op) && reference.contains(why),
                    "{label} on the reference evaluator: {reference:?}"
                );
            };
            match what {
                "cholesky (indefinite)" => named(
                    "cholesky",
                    "is not positive definite (its leading minor of order 2",
                ),
                "solve (singular)" => named("solve", "the matrix is singular"),
                _ => close(
                    &label,
                    &as_f64(&got.unwrap()[0].0, dt),
                    &want.unwrap()[0].f64s(),
                    if dt == DType::F64 { 1e-10 } else { 1e-4 },
                ),
            }
        }
    }
}
