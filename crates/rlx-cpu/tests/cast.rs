//! f32 ↔ f16 casts: the vectorized (F16C) runs and the scalar tail give exactly the `half`
//! crate's conversions (round to nearest even, subnormals, overflow to infinity, NaN), on dense
//! and strided operands.

use half::f16;
use rlx_cpu::compile;
use rlx_ir::{DType, Graph, Shape};

/// Values around every hard case: ties, subnormals, the largest finite f16, overflow, NaN.
fn samples() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        65519.0,
        65520.0,
        1e9,
        -1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    v.extend([6.1e-5, 6.0e-8, 2.9e-8, 3.0e-8, 1e-10, -5.96e-8]);
    // Exact ties between two f16 values (odd and even mantissa below) and their neighbours.
    for m in [1024u32, 1025, 1500, 2047] {
        let tie = (m as f32 + 0.5) / 1024.0;
        v.extend([
            tie,
            f32::from_bits(tie.to_bits() + 1),
            f32::from_bits(tie.to_bits() - 1),
            -tie,
        ]);
    }
    v.extend((0..41).map(|i| (i as f32 * 0.37).sin() * 300.0));
    v
}

fn run(g: &Graph, input: &[u8]) -> Vec<u8> {
    let mut prog = compile(g, 2).unwrap();
    prog.write_input(0, input);
    prog.execute();
    let n = g.node(g.outputs()[0]).shape.numel().unwrap() * 4;
    let mut out = vec![0u8; n];
    prog.read_output(0, &mut out);
    out
}

#[test]
fn f32_to_f16_and_back_match_half_bit_for_bit() {
    rlx_cpu::isa::for_each_level(|_| {
        let x = samples();
        let n = x.len();
        // Dense: F32 -> F16 -> F32 (the f16 values come back exactly).
        let mut g = Graph::new("cast");
        let i = g.input("x", Shape::new(&[n], DType::F32));
        let h = g.cast(i, DType::F16);
        let back = g.cast(h, DType::F32);
        g.set_outputs(vec![back]);
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let out = run(&g, &bytes);
        for (k, c) in out.chunks_exact(4).enumerate() {
            let got = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let want = f16::from_f32(x[k]).to_f32();
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{}: {got} vs {want}",
                x[k]
            );
        }
        // Strided: the transpose of a [2, n/2] matrix goes through the per-element path.
        let half_n = n / 2;
        let mut g = Graph::new("cast_t");
        let i = g.input("x", Shape::new(&[2, half_n], DType::F32));
        let t = g.transpose(i, &[1, 0]);
        let h = g.cast(t, DType::F16);
        let back = g.cast(h, DType::F32);
        g.set_outputs(vec![back]);
        let out = run(&g, &bytes[..2 * half_n * 4]);
        for (k, c) in out.chunks_exact(4).enumerate() {
            let (r, col) = (k / 2, k % 2);
            let src = x[col * half_n + r];
            let got = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let want = f16::from_f32(src).to_f32();
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{src}: {got} vs {want}"
            );
        }
    });
}
