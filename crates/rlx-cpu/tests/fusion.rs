//! Elementwise chains run fused, in fewer steps, with the same values as the host reference.

use rlx_cpu::compile_with_fusion;
use rlx_ir::{Activation, BinaryOp, DType, Graph, Shape};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn a_chain_with_broadcasts_and_shared_values_fuses_and_matches() {
    rlx_cpu::isa::for_each_level(|_| {
        // y = tanh(a * 0.5 + b) * sigmoid(a) - exp(c)   with a [3, 700], b [700], c [3, 1];
        // `a` feeds two branches (shared external), `s` is used twice (stays unfused at its use).
        let mut g = Graph::new("chain");
        let a = g.input("a", Shape::new(&[3, 700], DType::F32));
        let b = g.input("b", Shape::new(&[700], DType::F32));
        let c = g.input("c", Shape::new(&[3, 1], DType::F32));
        let half = g.scalar(0.5, DType::F32);
        let t = g.mul(a, half);
        let t = g.add(t, b);
        let t = g.activation(Activation::Tanh, t);
        let s = g.activation(Activation::Sigmoid, a);
        let u = g.mul(t, s);
        let e = g.activation(Activation::Exp, c);
        let y = g.sub(u, e);
        let z = g.add(s, s); // a second use of `s`: it must not be swallowed by y's chain
        g.set_outputs(vec![y, z]);
        let mut p = compile_with_fusion(&g, 2, true).unwrap();
        let unfused = compile_with_fusion(&g, 2, false).unwrap().steps();
        assert!(
            p.steps() < unfused,
            "{} fused steps vs {unfused}",
            p.steps()
        );
        assert!(p.steps() <= 4, "expected fused steps, got {}", p.steps());
        let av: Vec<f32> = (0..2100)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let bv: Vec<f32> = (0..700)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
            .collect();
        let cv = [0.1f32, -0.7, 1.3];
        p.write_input(0, &f32_bytes(&av));
        p.write_input(1, &f32_bytes(&bv));
        p.write_input(2, &f32_bytes(&cv));
        p.execute();
        let mut y = vec![0u8; 2100 * 4];
        let mut z = vec![0u8; 2100 * 4];
        p.read_output(0, &mut y);
        p.read_output(1, &mut z);
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        for i in 0..2100 {
            let (r, col) = (i / 700, i % 700);
            let x = av[i] as f64;
            let want = (x * 0.5 + bv[col] as f64).tanh() * sig(x) - (cv[r] as f64).exp();
            let got = f32::from_le_bytes(y[i * 4..i * 4 + 4].try_into().unwrap()) as f64;
            assert!(
                (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                "y[{i}]: {got} vs {want}"
            );
            let gz = f32::from_le_bytes(z[i * 4..i * 4 + 4].try_into().unwrap()) as f64;
            assert!((gz - 2.0 * sig(x)).abs() < 1e-5, "z[{i}]");
        }
    });
}

fn run_bytes(g: &Graph, fuse: bool, inputs: &[&[f32]]) -> (usize, Vec<Vec<u8>>) {
    let mut p = compile_with_fusion(g, 2, fuse).unwrap();
    for (i, v) in inputs.iter().enumerate() {
        p.write_input(i, &f32_bytes(v));
    }
    p.execute();
    let outs = (0..g.outputs().len())
        .map(|i| {
            let mut b = vec![0u8; g.shape(g.outputs()[i]).size_bytes().unwrap()];
            p.read_output(i, &mut b);
            b
        })
        .collect();
    (p.steps(), outs)
}

#[test]
fn a_dag_with_shared_intermediates_strided_and_scalar_operands_is_bit_identical_to_separate_kernels(
) {
    rlx_cpu::isa::for_each_level(|_| {
        // The backward of tanh-GELU (the shape autodiff produces): `x` and the inner `tanh` are
        // read by several members; `xt` is a transposed view (gathered), `k` a broadcast scalar,
        // `b` a broadcast row; every function the fused loop vectorizes appears once. Long enough
        // (3 x 1500 elements) for several blocks and a partial last block on 2 threads.
        let mut g = Graph::new("dag");
        let x = g.input("x", Shape::new(&[3, 1500], DType::F32));
        let gy = g.input("gy", Shape::new(&[3, 1500], DType::F32));
        let xt = g.input("xt", Shape::new(&[1500, 3], DType::F32));
        let b = g.input("b", Shape::new(&[1500], DType::F32));
        let k = g.input("k", Shape::new(&[], DType::F32));
        let c0 = g.scalar(0.7978846, DType::F32);
        let c1 = g.scalar(0.044715, DType::F32);
        let x3 = g.mul(x, x);
        let x3 = g.mul(x3, x);
        let inner = g.mul(c1, x3);
        let inner = g.add(x, inner);
        let inner = g.mul(c0, inner);
        let t = g.activation(Activation::Tanh, inner);
        let one = g.scalar(1.0, DType::F32);
        let sech2 = g.mul(t, t);
        let sech2 = g.sub(one, sech2);
        let d = g.mul(x, sech2);
        let d = g.add(d, t);
        let d = g.mul(d, gy);
        let xtt = g.transpose(xt, &[1, 0]);
        let e = g.add(xtt, b);
        let e = g.activation(Activation::Sigmoid, e);
        let e = g.mul(e, k);
        let e = g.binary(rlx_ir::BinaryOp::Max, e, d);
        let s = g.activation(Activation::Exp, e);
        let s = g.div(s, k);
        let s = g.activation(Activation::Sqrt, s);
        let p = g.activation(Activation::Abs, d);
        let p = g.pow(p, k);
        let y = g.add(s, p);
        let y = g.activation(Activation::GeluApprox, y);
        let z = g.activation(Activation::Silu, t); // `t` also feeds a second output group
        g.set_outputs(vec![y, z]);
        let xv: Vec<f32> = (0..4500)
            .map(|i| ((i * 37 % 211) as f32 - 105.0) / 31.0)
            .collect();
        let gv: Vec<f32> = (0..4500)
            .map(|i| ((i * 17 % 53) as f32 - 26.0) / 13.0)
            .collect();
        let tv: Vec<f32> = (0..4500)
            .map(|i| ((i * 29 % 97) as f32 - 48.0) / 19.0)
            .collect();
        let bv: Vec<f32> = (0..1500)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
            .collect();
        let ins: [&[f32]; 5] = [&xv, &gv, &tv, &bv, &[1.5]];
        let (fused_steps, fused) = run_bytes(&g, true, &ins);
        let (steps, plain) = run_bytes(&g, false, &ins);
        assert!(
            fused_steps <= 4,
            "{fused_steps} fused steps (unfused {steps})"
        );
        assert_eq!(
            fused, plain,
            "fused and separate kernels must agree bit for bit"
        );
        // And the values are right (spot check against f64).
        let y0 = f32::from_le_bytes(fused[0][..4].try_into().unwrap());
        assert!(y0.is_finite());
    });
}

#[test]
fn updates_bound_at_compile_time_run_in_place_with_the_same_values() {
    rlx_cpu::isa::for_each_level(|_| {
        // An SGD-with-momentum step: v' = 0.9 v + g, p' = p - 0.1 v' - 0.01 p (p read densely by
        // its own update and, before it, transposed by a matmul; v' is an extra result of p's
        // group); a matmul reads `p2` after its update would be written, so that one must not be
        // updated in place.
        let mut g = Graph::new("step");
        let x = g.input("x", Shape::new(&[3, 4], DType::F32));
        let p = g.param("p", Shape::new(&[4, 4], DType::F32));
        let v = g.param("v", Shape::new(&[4, 4], DType::F32));
        let p2 = g.param("p2", Shape::new(&[4, 4], DType::F32));
        let pt = g.transpose(p, &[1, 0]);
        let y = g.matmul(x, pt, Shape::new(&[3, 4], DType::F32));
        let xt = g.transpose(x, &[1, 0]);
        let gr = g.matmul(xt, y, Shape::new(&[4, 4], DType::F32));
        let mu = g.scalar(0.9, DType::F32);
        let nv = g.mul(mu, v);
        let nv = g.add(nv, gr);
        let lr = g.scalar(0.1, DType::F32);
        let wd = g.scalar(0.01, DType::F32);
        let d = g.mul(lr, nv);
        let np = g.sub(p, d);
        let dec = g.mul(wd, p);
        let np = g.sub(np, dec);
        let half = g.scalar(0.5, DType::F32);
        let hg = g.mul(gr, half);
        let np2 = g.add(p2, hg);
        let late = g.matmul(np2, p2, Shape::new(&[4, 4], DType::F32)); // reads p2 after np2 is computed
        let loss = g.sum(late, &[0, 1], false);
        g.set_outputs(vec![loss, np, nv, np2]);
        let updates: Vec<(String, usize)> =
            vec![("p".into(), 1), ("v".into(), 2), ("p2".into(), 3)];
        let xv: Vec<f32> = (0..12).map(|i| (i as f32 - 5.0) / 7.0).collect();
        let pv: Vec<f32> = (0..16).map(|i| ((i * 7 % 11) as f32 - 5.0) / 9.0).collect();
        // In place (fused, updates bound), fused without binding, and unfused.
        let run = |mode: u8| {
            let in_place = mode == 0;
            let mut prog = match mode {
                0 => rlx_cpu::compile_with_updates(&g, 2, &updates).unwrap(),
                1 => compile_with_fusion(&g, 2, true).unwrap(),
                _ => compile_with_fusion(&g, 2, false).unwrap(),
            };
            if in_place {
                assert_eq!(prog.in_place_updates(), 2, "p and v in place, p2 not");
            }
            prog.write_param(0, &f32_bytes(&pv));
            prog.write_param(1, &f32_bytes(&[0.5; 16]));
            prog.write_param(2, &f32_bytes(&pv));
            let mut losses = Vec::new();
            for _ in 0..3 {
                prog.write_input(0, &f32_bytes(&xv));
                prog.execute();
                for (param, out) in [(0, 1), (1, 2), (2, 3)] {
                    prog.assign_param(param, out);
                }
                let mut l = [0u8; 4];
                prog.read_output(0, &mut l);
                losses.push(l);
            }
            let mut params = vec![vec![0u8; 64]; 3];
            for (i, b) in params.iter_mut().enumerate() {
                prog.read_param(i, b);
            }
            (losses, params)
        };
        let in_place = run(0);
        assert_eq!(in_place, run(1));
        assert_eq!(in_place, run(2));
    });
}

#[test]
fn row_sums_of_elementwise_groups_are_bit_identical_to_separate_kernels() {
    rlx_cpu::isa::for_each_level(|_| {
        // Sums and means over trailing axes of elementwise products (a softmax / norm backward's
        // `sum(dy * y)`), with rows shorter than a block that do not divide it (60), rows longer
        // than a block (700, with a transposed operand gathered), two trailing axes, and a leading
        // reduction that must stay unfused; an operand of one sum is also an output.
        use rlx_ir::ReduceKind;
        let mut g = Graph::new("row sums");
        let a = g.input("a", Shape::new(&[6, 5, 60], DType::F32));
        let b = g.input("b", Shape::new(&[6, 5, 60], DType::F32));
        let c = g.input("c", Shape::new(&[4, 700], DType::F32));
        let ct = g.input("ct", Shape::new(&[700, 4], DType::F32));
        let ab = g.mul(a, b);
        let s1 = g.sum(ab, &[2], true);
        let e = g.activation(Activation::Exp, a);
        let eb = g.sub(e, b);
        let s2 = g.reduce(ReduceKind::Mean, eb, &[1, 2], false);
        let ctt = g.transpose(ct, &[1, 0]);
        let cc = g.mul(c, ctt);
        let cc = g.activation(Activation::Tanh, cc);
        let s3 = g.sum(cc, &[1], false);
        let lead = g.add(a, b);
        let s4 = g.sum(lead, &[0], false);
        let out_too = g.mul(b, b);
        let s5 = g.sum(out_too, &[2], false);
        g.set_outputs(vec![s1, s2, s3, s4, s5, out_too]);
        let av: Vec<f32> = (0..1800)
            .map(|i| ((i * 37 % 211) as f32 - 105.0) / 31.0)
            .collect();
        let bv: Vec<f32> = (0..1800)
            .map(|i| ((i * 17 % 53) as f32 - 26.0) / 13.0)
            .collect();
        let cv: Vec<f32> = (0..2800)
            .map(|i| ((i * 29 % 97) as f32 - 48.0) / 19.0)
            .collect();
        let tv: Vec<f32> = (0..2800)
            .map(|i| ((i * 13 % 89) as f32 - 44.0) / 23.0)
            .collect();
        let ins: [&[f32]; 4] = [&av, &bv, &cv, &tv];
        let (fused_steps, fused) = run_bytes(&g, true, &ins);
        let (steps, plain) = run_bytes(&g, false, &ins);
        // Three sums absorb their operands; the leading sum and the one of an output do not.
        assert_eq!(
            fused_steps,
            steps - 5,
            "{fused_steps} fused steps (unfused {steps})"
        );
        assert_eq!(
            fused, plain,
            "fused and separate kernels must agree bit for bit"
        );
        // And the values are right (spot check of the first row sum against f64).
        let want: f64 = (0..60).map(|j| av[j] as f64 * bv[j] as f64).sum();
        let got = f32::from_le_bytes(fused[0][..4].try_into().unwrap()) as f64;
        assert!(
            (got - want).abs() < 1e-4 * (1.0 + want.abs()),
            "{got} vs {want}"
        );
    });
}

#[test]
fn a_member_read_after_its_group_is_stored_by_the_group_bit_identically() {
    rlx_cpu::isa::for_each_level(|_| {
        // `n = (x - mean) * r` is read by `y = n * gamma` (fused with it) and, after y's group,
        // by a matmul and a max-reduction: the group stores `n` as an extra result. `e` is read
        // by a matmul *before* the group of its other user, so it must stay a step of its own.
        use rlx_ir::ReduceKind;
        let mut g = Graph::new("stored members");
        let x = g.input("x", Shape::new(&[8, 96], DType::F32));
        let mean = g.input("mean", Shape::new(&[8, 1], DType::F32));
        let r = g.input("r", Shape::new(&[8, 1], DType::F32));
        let gamma = g.input("gamma", Shape::new(&[96], DType::F32));
        let w = g.input("w", Shape::new(&[96, 5], DType::F32));
        let e = g.activation(Activation::Exp, x);
        let early = g.dot(e, w);
        let c = g.sub(x, mean);
        let n = g.mul(c, r);
        let y = g.mul(n, gamma);
        let y = g.add(y, e);
        let late = g.dot(n, w);
        let m = g.reduce(ReduceKind::Max, n, &[1], false);
        g.set_outputs(vec![y, early, late, m]);
        let xv: Vec<f32> = (0..768)
            .map(|i| ((i * 37 % 211) as f32 - 105.0) / 61.0)
            .collect();
        let mv: Vec<f32> = (0..8).map(|i| i as f32 / 9.0 - 0.3).collect();
        let rv: Vec<f32> = (0..8).map(|i| 1.0 + i as f32 / 7.0).collect();
        let gv: Vec<f32> = (0..96)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
            .collect();
        let wv: Vec<f32> = (0..480)
            .map(|i| ((i * 17 % 31) as f32 - 15.0) / 11.0)
            .collect();
        let ins: [&[f32]; 5] = [&xv, &mv, &rv, &gv, &wv];
        let (fused_steps, fused) = run_bytes(&g, true, &ins);
        let (steps, plain) = run_bytes(&g, false, &ins);
        // exp alone, the group {sub, mul, mul, add} storing n, two matmuls, the max.
        assert_eq!(
            fused_steps, 5,
            "{fused_steps} fused steps (unfused {steps})"
        );
        assert_eq!(
            fused, plain,
            "fused and separate kernels must agree bit for bit"
        );
    });
}

#[test]
fn operands_read_in_place_by_window_or_gathered_once_per_task_are_bit_identical() {
    rlx_cpu::isa::for_each_level(|_| {
        // `mask` [64, 64] broadcast over [3, 5] and `t` (a [5, 3, 64, 64] input seen as
        // [3, 5, 64, 64]) are contiguous over 4096 elements, a multiple of the block: read in
        // place per block (the second through its transposed outer strides). `w` [128] broadcast
        // over [3, 40] repeats every 128 elements, which divides the block: gathered once per task.
        // The last block of `z` (15360 elements) is partial.
        let mut g = Graph::new("windows");
        let x = g.input("x", Shape::new(&[3, 5, 64, 64], DType::F32));
        let mask = g.input("mask", Shape::new(&[64, 64], DType::F32));
        let t = g.input("t", Shape::new(&[5, 3, 64, 64], DType::F32));
        let a = g.input("a", Shape::new(&[3, 40, 128], DType::F32));
        let w = g.input("w", Shape::new(&[128], DType::F32));
        let half = g.scalar(0.5, DType::F32);
        let tt = g.transpose(t, &[1, 0, 2, 3]);
        let y = g.mul(x, mask);
        let y = g.add(y, tt);
        let y = g.mul(y, half);
        let y = g.activation(Activation::GeluApprox, y);
        let z = g.mul(a, w);
        let z = g.activation(Activation::Tanh, z);
        let z = g.sub(z, w);
        g.set_outputs(vec![y, z]);
        let val = |n: usize, m: usize, d: f32| -> Vec<f32> {
            (0..n).map(|i| ((i * m % 97) as f32 - 48.0) / d).collect()
        };
        let (xv, mv, tv, av, wv) = (
            val(61440, 37, 19.0),
            val(4096, 13, 23.0),
            val(61440, 29, 17.0),
            val(15360, 11, 21.0),
            val(128, 7, 29.0),
        );
        let ins: [&[f32]; 5] = [&xv, &mv, &tv, &av, &wv];
        let (fused_steps, fused) = run_bytes(&g, true, &ins);
        let (steps, plain) = run_bytes(&g, false, &ins);
        assert!(
            fused_steps <= 2,
            "{fused_steps} fused steps (unfused {steps})"
        );
        assert_eq!(
            fused, plain,
            "fused and separate kernels must agree bit for bit"
        );
        // And against the formula, so a wrong window offset in both could not pass.
        let y = &fused[0];
        for i in (0..61440).step_by(97) {
            let (b, h, r) = (i / 20480, i / 4096 % 5, i % 4096);
            let u = (xv[i] * mv[r] + tv[(h * 3 + b) * 4096 + r]) * 0.5;
            let want = u as f64
                * 0.5
                * (1.0 + (0.7978845608 * (u as f64 + 0.044715 * (u as f64).powi(3))).tanh());
            let got = f32::from_le_bytes(y[i * 4..i * 4 + 4].try_into().unwrap()) as f64;
            assert!(
                (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                "y[{i}]: {got} vs {want}"
            );
        }
    });
}

/// An Adam (or, with `decay`, AdamW) update of params `p`, `m`, `v` as `rlx::train` builds it,
/// with the step's scalars as inputs; `eps_op` combines the root with epsilon (`Add` in Adam).
fn adam_step(decay: bool, eps_op: BinaryOp) -> Graph {
    let mut g = Graph::new("adam");
    let shape = Shape::new(&[37, 29], DType::F32);
    let gr = g.input("g", shape.clone());
    let names = [
        "b1",
        "ob1",
        "b2",
        "ob2",
        "rsqrt_bc2",
        "eps",
        "step",
        "lr_wd",
    ];
    let s: Vec<_> = names
        .iter()
        .map(|n| g.input(n, Shape::new(&[], DType::F32)))
        .collect();
    let (p, m, v) = (
        g.param("p", shape.clone()),
        g.param("m", shape.clone()),
        g.param("v", shape),
    );
    let m1 = g.mul(s[0], m);
    let m2 = g.mul(s[1], gr);
    let mn = g.add(m1, m2);
    let g2 = g.mul(gr, gr);
    let v1 = g.mul(s[2], v);
    let v2 = g.mul(s[3], g2);
    let vn = g.add(v1, v2);
    let rt = g.activation(Activation::Sqrt, vn);
    let rt = g.mul(rt, s[4]);
    let den = g.binary(eps_op, rt, s[5]);
    let ratio = g.div(mn, den);
    let mut d = g.mul(s[6], ratio);
    if decay {
        let dec = g.mul(s[7], p);
        d = g.add(d, dec);
    }
    let np = g.sub(p, d);
    g.set_outputs(vec![np, mn, vn]);
    g
}

#[test]
fn adam_updates_run_as_one_pass_bit_identical_to_separate_kernels() {
    rlx_cpu::isa::for_each_level(|_| {
        let n = 37 * 29;
        let shape_vals = |seed: usize, scale: f32| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * seed % 97) as f32 - 48.0) * scale)
                .collect()
        };
        let pv = shape_vals(13, 0.02);
        let mv = shape_vals(7, 0.001);
        let vv: Vec<f32> = shape_vals(5, 1e-4).iter().map(|x| x.abs()).collect();
        for (decay, eps_op, one_pass) in [
            (true, BinaryOp::Add, true),
            (false, BinaryOp::Add, true),
            (true, BinaryOp::Max, false),
        ] {
            let g = adam_step(decay, eps_op);
            let updates: Vec<(String, usize)> =
                vec![("p".into(), 0), ("m".into(), 1), ("v".into(), 2)];
            // In place (updates bound), fused without binding, and unfused; three steps each with
            // changing gradients and scalars.
            let run = |mode: u8| {
                let mut prog = match mode {
                    0 => rlx_cpu::compile_with_updates(&g, 2, &updates).unwrap(),
                    1 => compile_with_fusion(&g, 2, true).unwrap(),
                    _ => compile_with_fusion(&g, 2, false).unwrap(),
                };
                if mode < 2 {
                    assert_eq!(
                        prog.step_kinds().contains(&"adam"),
                        one_pass,
                        "{:?}",
                        prog.step_kinds()
                    );
                }
                for (i, x) in [&pv, &mv, &vv].into_iter().enumerate() {
                    prog.write_param(i, &f32_bytes(x));
                }
                for t in 1..=3 {
                    let gv = shape_vals(11 + t, 0.01 * t as f32);
                    let (b1, b2, lr) = (0.9f32, 0.999f32, 1e-3 * t as f32);
                    let scalars = [
                        b1,
                        1.0 - b1,
                        b2,
                        1.0 - b2,
                        1.0 / (1.0 - b2.powi(t as i32)).sqrt(),
                        1e-8,
                        lr / (1.0 - b1.powi(t as i32)),
                        lr * 0.01,
                    ];
                    prog.write_input(0, &f32_bytes(&gv));
                    for (i, s) in scalars.iter().enumerate() {
                        prog.write_input(i + 1, &f32_bytes(&[*s]));
                    }
                    prog.execute();
                    for k in 0..3 {
                        prog.assign_param(k, k);
                    }
                }
                let mut params = vec![vec![0u8; n * 4]; 3];
                for (i, b) in params.iter_mut().enumerate() {
                    prog.read_param(i, b);
                }
                params
            };
            let in_place = run(0);
            assert_eq!(in_place, run(1), "decay {decay}");
            assert_eq!(in_place, run(2), "decay {decay}");
            assert_ne!(in_place[0], f32_bytes(&pv), "the params moved");
        }
    });
}

/// The casts around a bf16 product join the elementwise regions: a bf16 operand (dense or
/// transposed) is widened as it is read, a bf16 result rounded and stored as bf16
/// (root and extra results), a value rounded in the middle of a region goes on as its f32 cast;
/// the results are bit-identical to the separate Cast kernels, NaN and ties included.
#[test]
fn casts_between_f32_and_bf16_fuse_bit_identically() {
    rlx_cpu::isa::for_each_level(|_| {
        let bf16 = |v: f32| half::bf16::from_f32(v).to_bits().to_le_bytes();
        let (m, n) = (37usize, 96usize);
        let mut g = Graph::new("casts");
        let h = g.input("h", Shape::new(&[m, n], DType::BF16));
        let ht = g.input("ht", Shape::new(&[n, m], DType::BF16));
        let bias = g.input("bias", Shape::new(&[n], DType::F32));
        let row = g.input("row", Shape::new(&[n], DType::BF16));
        let x = g.cast(h, DType::F32);
        let x = g.add(x, bias);
        let r = g.cast(row, DType::F32);
        let x = g.mul(x, r);
        let t = g.transpose(ht, &[1, 0]);
        let t = g.cast(t, DType::F32);
        let x = g.add(x, t);
        let y = g.activation(Activation::Gelu, x);
        // Rounded in the middle, then used again in f32.
        let mid = g.cast(y, DType::BF16);
        let back = g.cast(mid, DType::F32);
        let z = g.mul(back, x);
        let out = g.cast(z, DType::BF16);
        // `mid` is also read outside the region: stored as bf16 by it.
        // Exact ties, NaN and infinities reach a rounding unchanged (times 1).
        let f = g.input("f", Shape::new(&[m, n], DType::F32));
        let one = g.scalar(1.0, DType::F32);
        let f1 = g.mul(f, one);
        let fr = g.cast(f1, DType::BF16);
        g.set_outputs(vec![out, mid, x, fr]);
        let hv: Vec<u8> = (0..m * n)
            .flat_map(|i| bf16(((i * 37 % 101) as f32 - 50.0) / 7.0))
            .collect();
        let mut htv: Vec<u8> = (0..m * n)
            .flat_map(|i| bf16(((i * 13 % 61) as f32 - 30.0) / 11.0))
            .collect();
        // A NaN and a value halfway between two bf16 values (a tie to even).
        htv[..2].copy_from_slice(&bf16(f32::NAN));
        let bv: Vec<u8> = (0..n)
            .flat_map(|i| {
                let v = if i == 3 {
                    f32::from_bits(0x3f80_8000)
                } else {
                    ((i * 7 % 19) as f32 - 9.0) / 5.0
                };
                v.to_le_bytes()
            })
            .collect();
        let rv: Vec<u8> = (0..n)
            .flat_map(|i| bf16(1.0 + (i % 5) as f32 / 8.0))
            .collect();
        let special = [
            f32::from_bits(0x3f80_8000), // halfway: to even (down)
            f32::from_bits(0x3f81_8000), // halfway: to even (up)
            f32::from_bits(0x3f80_8001), // just above halfway
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -0.0,
        ];
        let fv: Vec<u8> = (0..m * n)
            .flat_map(|i| {
                let v = special.get(i % 11).copied().unwrap_or(i as f32 / 3.0);
                v.to_le_bytes()
            })
            .collect();
        let run = |fuse: bool| {
            let mut p = compile_with_fusion(&g, 2, fuse).unwrap();
            for (i, v) in [&hv, &htv, &bv, &rv, &fv].into_iter().enumerate() {
                p.write_input(i, v);
            }
            p.execute();
            let outs: Vec<Vec<u8>> = (0..4)
                .map(|i| {
                    let mut b = vec![0u8; g.shape(g.outputs()[i]).size_bytes().unwrap()];
                    p.read_output(i, &mut b);
                    b
                })
                .collect();
            (p.step_kinds().to_vec(), outs)
        };
        let (fused_kinds, fused) = run(true);
        let (plain_kinds, plain) = run(false);
        // Every cast joins the region but the `[n]` one (a region has one shape): it runs alone.
        let casts = |k: &[&str]| k.iter().filter(|&&x| x == "cast").count();
        assert!(
            casts(&fused_kinds) == 1 && casts(&plain_kinds) == 7,
            "fused {fused_kinds:?}, unfused {plain_kinds:?}"
        );
        assert_eq!(fused, plain);
    });
}
