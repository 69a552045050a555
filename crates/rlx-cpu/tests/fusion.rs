//! Elementwise chains run fused, in fewer steps, with the same values as the host reference.

use rlx_cpu::compile_with_fusion;
use rlx_driver::Executable;
use rlx_ir::{Activation, DType, Graph, Shape};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn a_chain_with_broadcasts_and_shared_values_fuses_and_matches() {
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
    assert!(p.steps() < unfused, "{} fused steps vs {unfused}", p.steps());
    assert!(p.steps() <= 4, "expected fused steps, got {}", p.steps());
    let av: Vec<f32> = (0..2100).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
    let bv: Vec<f32> = (0..700).map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0).collect();
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
        assert!((got - want).abs() < 1e-5 * (1.0 + want.abs()), "y[{i}]: {got} vs {want}");
        let gz = f32::from_le_bytes(z[i * 4..i * 4 + 4].try_into().unwrap()) as f64;
        assert!((gz - 2.0 * sig(x)).abs() < 1e-5, "z[{i}]");
    }
}
