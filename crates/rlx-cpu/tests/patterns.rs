//! Pattern regions the CPU runs as one step (a product with its bias and activation, a residual
//! add with its norm): formed where the kernels take them, fewer steps, and bit for bit the
//! values of the same graph run op by op (patterns off), at every ISA level the CPU has.

use rlx_cpu::{fuses, lower, Program};
use rlx_ir::{Activation, DType, FusionKind, Graph, NodeId, Shape};
use rlx_opt::{FusionOptions, LoweringOptions};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 37 + seed * 101) % 199) as f32 - 99.0) / 61.0)
        .collect()
}

/// The graph compiled with or without pattern regions (elementwise fusion on in both), with the
/// kinds of the regions formed.
fn compile(g: &Graph, patterns: bool) -> (Program, Vec<FusionKind>) {
    let options = LoweringOptions {
        fusion: FusionOptions {
            patterns,
            ..FusionOptions::default()
        },
        ..LoweringOptions::default()
    };
    let (fused, plan) = rlx_opt::prepare(g, &options, &fuses, &[]).unwrap();
    let kinds = plan.fusion.regions.iter().map(|r| r.kind).collect();
    (lower(&fused, &plan, 2, None).unwrap(), kinds)
}

fn run(p: &mut Program, g: &Graph, inputs: &[Vec<f32>]) -> Vec<Vec<u8>> {
    for (i, v) in inputs.iter().enumerate() {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        p.write_input(i, &b);
    }
    p.execute();
    (0..g.outputs().len())
        .map(|i| {
            let mut b = vec![0u8; g.shape(g.outputs()[i]).size_bytes().unwrap()];
            p.read_output(i, &mut b);
            b
        })
        .collect()
}

/// Runs `g` with and without patterns at every ISA level: the results must be identical, the
/// regions `want` formed, and the fused program shorter. Returns the outputs.
fn check(g: &Graph, want: &[FusionKind]) -> Vec<Vec<f32>> {
    let inputs: Vec<Vec<f32>> = g
        .ids()
        .filter(|&i| matches!(g.node(i).op, rlx_ir::Op::Input { .. }))
        .enumerate()
        .map(|(k, i)| values(g.shape(i).numel().unwrap(), k))
        .collect();
    let mut last = Vec::new();
    rlx_cpu::isa::for_each_level(|level| {
        let (mut on, kinds) = compile(g, true);
        let (mut off, off_kinds) = compile(g, false);
        for k in want {
            assert!(kinds.contains(k), "{level:?}: no {k:?} region in {kinds:?}");
            assert!(!off_kinds.contains(k), "patterns off formed {k:?}");
        }
        assert!(
            on.steps() < off.steps(),
            "{} vs {} steps",
            on.steps(),
            off.steps()
        );
        let (a, b) = (run(&mut on, g, &inputs), run(&mut off, g, &inputs));
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                x == y,
                "{level:?}: output {i} differs from the op-by-op program"
            );
        }
        last = a
            .iter()
            .map(|o| {
                o.chunks(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            })
            .collect();
    });
    last
}

fn linear(m: usize, k: usize, n: usize, bias: bool, act: Option<Activation>) -> Graph {
    let mut g = Graph::new("linear");
    let x = g.input("x", Shape::new(&[m, k], DType::F32));
    let w = g.input("w", Shape::new(&[k, n], DType::F32));
    let mut y = g.try_dot(x, w).unwrap();
    if bias {
        let b = g.input("b", Shape::new(&[n], DType::F32));
        y = g.add(b, y);
    }
    if let Some(a) = act {
        y = g.activation(a, y);
    }
    g.set_outputs(vec![y]);
    g
}

#[test]
fn products_with_bias_and_activation_match_the_op_by_op_program() {
    let acts = [
        Some(Activation::Gelu),
        Some(Activation::GeluApprox),
        Some(Activation::Silu),
        Some(Activation::Relu),
        Some(Activation::Tanh),
        None,
    ];
    // Small (one thread), tall (shares of rows), wide (shares of columns), deeper than one
    // packed panel.
    for (m, k, n) in [(3, 5, 7), (200, 64, 40), (24, 48, 700), (64, 700, 96)] {
        for act in acts {
            let g = linear(m, k, n, true, act);
            let out = check(&g, &[FusionKind::MatMulEpilogue]);
            // Against a plain loop in f64.
            let (x, w, b) = (values(m * k, 0), values(k * n, 1), values(n, 2));
            for (i, got) in out[0].iter().enumerate() {
                let (r, c) = (i / n, i % n);
                let mut s = b[c] as f64;
                for p in 0..k {
                    s += x[r * k + p] as f64 * w[p * n + c] as f64;
                }
                let want = match act {
                    Some(Activation::Gelu) => 0.5 * s * (1.0 + erf(s / 2f64.sqrt())),
                    Some(Activation::GeluApprox) => {
                        let u = (2.0 / std::f64::consts::PI).sqrt() * (s + 0.044715 * s * s * s);
                        0.5 * s * (1.0 + u.tanh())
                    }
                    Some(Activation::Silu) => s / (1.0 + (-s).exp()),
                    Some(Activation::Relu) => s.max(0.0),
                    Some(Activation::Tanh) => s.tanh(),
                    _ => s,
                };
                let tol = 1e-4 * (1.0 + want.abs()) * (k as f64).sqrt();
                assert!(
                    (*got as f64 - want).abs() < tol,
                    "{m}x{k}x{n} {act:?} [{r},{c}]: {got} vs {want}"
                );
            }
        }
    }
    // An activation without a bias.
    check(
        &linear(50, 30, 70, false, Some(Activation::Silu)),
        &[FusionKind::MatMulEpilogue],
    );
}

/// erf by its series (enough for the test's range).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = 1.0
        - t * (-x * x - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        y
    } else {
        -y
    }
}

#[test]
fn batched_and_strided_epilogues_match() {
    // A batched product sharing its weight (folded into one GEMM), a bias [1, 1, n].
    let mut g = Graph::new("batched");
    let x = g.input("x", Shape::new(&[3, 20, 33], DType::F32));
    let w = g.input("w", Shape::new(&[33, 45], DType::F32));
    let b = g.input("b", Shape::new(&[1, 1, 45], DType::F32));
    let y = g.try_dot(x, w).unwrap();
    let y = g.add(y, b);
    let y = g.activation(Activation::Gelu, y);
    g.set_outputs(vec![y]);
    check(&g, &[FusionKind::MatMulEpilogue]);

    // Batched weights, a transposed right operand, and a bias that is every other value of
    // an input (strided).
    let mut g = Graph::new("strided");
    let x = g.input("x", Shape::new(&[4, 6, 10], DType::F32));
    let w = g.input("w", Shape::new(&[4, 12, 10], DType::F32));
    let b2 = g.input("b2", Shape::new(&[12, 2], DType::F32));
    let wt = g.transpose(w, &[0, 2, 1]);
    let y = g.try_dot(x, wt).unwrap();
    let b = g.narrow(b2, 1, 1, 1);
    let b = g.reshape(b, &[12]);
    let y = g.add(y, b);
    let y = g.activation(Activation::Relu, y);
    g.set_outputs(vec![y]);
    check(&g, &[FusionKind::MatMulEpilogue]);

    // No depth: the result is the bias's activation.
    let g = linear(4, 0, 9, true, Some(Activation::Sigmoid));
    let out = check(&g, &[FusionKind::MatMulEpilogue]);
    let b = values(9, 2);
    for (i, v) in out[0].iter().enumerate() {
        let want = 1.0 / (1.0 + (-(b[i % 9] as f64)).exp());
        assert!((*v as f64 - want).abs() < 1e-6, "[{i}] {v} vs {want}");
    }
}

fn residual(rows: usize, n: usize, layer: bool, keep_sum: bool, transposed: bool) -> Graph {
    let mut g = Graph::new("residual");
    let x = if transposed {
        let t = g.input("x", Shape::new(&[n, rows], DType::F32));
        g.transpose(t, &[1, 0])
    } else {
        g.input("x", Shape::new(&[rows, n], DType::F32))
    };
    let r = g.input("r", Shape::new(&[rows, n], DType::F32));
    let gain = g.input("g", Shape::new(&[n], DType::F32));
    let s = g.add(x, r);
    let y: NodeId = if layer {
        let shift = g.input("b", Shape::new(&[n], DType::F32));
        g.layer_norm(s, gain, shift, 1e-5)
    } else {
        g.rms_norm(s, gain, 1e-6)
    };
    g.set_outputs(if keep_sum { vec![y, s] } else { vec![y] });
    g
}

#[test]
fn residual_norms_match_the_op_by_op_program() {
    for (rows, n) in [(1, 576), (7, 64), (300, 384)] {
        for layer in [false, true] {
            for keep_sum in [false, true] {
                let out = check(
                    &residual(rows, n, layer, keep_sum, false),
                    &[FusionKind::ResidualNorm],
                );
                // The norm against f64.
                let (x, r, gain) = (values(rows * n, 0), values(rows * n, 1), values(n, 2));
                let shift = values(n, 3);
                for row in 0..rows {
                    let s: Vec<f64> = (0..n)
                        .map(|c| (x[row * n + c] + r[row * n + c]) as f64)
                        .collect();
                    let mean = if layer {
                        s.iter().sum::<f64>() / n as f64
                    } else {
                        0.0
                    };
                    let var = s.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
                    let eps = if layer { 1e-5 } else { 1e-6 };
                    for c in 0..n {
                        let mut want = (s[c] - mean) / (var + eps).sqrt() * gain[c] as f64;
                        if layer {
                            want += shift[c] as f64;
                        }
                        let got = out[0][row * n + c] as f64;
                        assert!(
                            (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "{got} vs {want}"
                        );
                        if keep_sum {
                            assert_eq!(out[1][row * n + c], (x[row * n + c] + r[row * n + c]));
                        }
                    }
                }
            }
        }
    }
    // A strided addend.
    check(
        &residual(33, 48, true, true, true),
        &[FusionKind::ResidualNorm],
    );
}

#[test]
fn half_precision_products_and_norms_stay_op_by_op() {
    // The kernels are f32: a bf16 product with a bias is not made a region.
    let mut g = Graph::new("bf16");
    let x = g.input("x", Shape::new(&[8, 16], DType::BF16));
    let w = g.input("w", Shape::new(&[16, 32], DType::BF16));
    let b = g.input("b", Shape::new(&[32], DType::BF16));
    let y = g.try_dot(x, w).unwrap();
    let y = g.add(y, b);
    g.set_outputs(vec![y]);
    let (_, kinds) = compile(&g, true);
    assert!(!kinds.contains(&FusionKind::MatMulEpilogue), "{kinds:?}");
}
