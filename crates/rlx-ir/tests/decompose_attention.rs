//! The decomposition of attention (what a backend without a native attention kernel runs)
//! against the op itself in the reference evaluator: in f32, and in bf16, where the
//! decomposition keeps the scale, mask and softmax in f32 as the native kernels do.

use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::{DType, Graph, MaskKind, Op, OpKind, Shape};
use std::collections::BTreeMap;

fn bytes(vals: &[f32], dt: DType) -> Vec<u8> {
    match dt {
        DType::BF16 => vals
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        _ => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn check(dt: DType, mask: MaskKind) {
    let (b, h, sq, sk, d) = (1, 2, 5, 7, 6);
    let mut g = Graph::new("attention");
    let q = g.input("q", Shape::new(&[b, h, sq, d], dt));
    let k = g.input("k", Shape::new(&[b, h, sk, d], dt));
    let v = g.input("v", Shape::new(&[b, h, sk, d], dt));
    let mut ins = vec![q, k, v];
    if mask == MaskKind::Custom {
        ins.push(g.input("m", Shape::new(&[b, 1, 1, sk], dt)));
    }
    let op = Op::Attention { mask, scale: 0.4 };
    let native = g.try_op(op.clone(), &ins).unwrap();
    let decomposed = rlx_ir::ops::decompose(&mut g, &op, &ins).unwrap().unwrap();
    g.set_outputs(vec![native, decomposed]);
    rlx_ir::verify(&g).unwrap();
    if dt == DType::BF16 {
        let softmax: Vec<DType> = g
            .ids()
            .filter(|&i| g.node(i).op.kind() == OpKind::Softmax)
            .map(|i| g.shape(i).dtype())
            .collect();
        assert_eq!(softmax, vec![DType::F32], "{g}");
    }
    let mut leaves = BTreeMap::new();
    for (i, (name, id)) in g.inputs().iter().enumerate() {
        let shape = g.shape(*id).clone();
        let n: usize = shape.static_dims().unwrap().iter().product();
        let vals: Vec<f32> = if *name == "m" {
            (0..n)
                .map(|j| if j == 2 { f32::MIN } else { 0.0 })
                .collect()
        } else {
            (0..n)
                .map(|j| ((j * (17 + 5 * i) + 3 * i) % 23) as f32 / 7.0 - 1.5)
                .collect()
        };
        leaves.insert(
            name.to_string(),
            Tensor::from_bytes(&shape, &bytes(&vals, dt)).unwrap(),
        );
    }
    let out = evaluate(&g, &leaves).unwrap();
    let (a, b) = (out[0].f64s(), out[1].f64s());
    // bf16: the scores are rounded once to bf16 by the first product, the weights by the cast
    // before the second; f32: the same sums in another order.
    let tol = if dt == DType::BF16 { 3e-2 } else { 1e-5 };
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + x.abs()),
            "{dt} {mask:?} [{i}]: native {x}, decomposed {y}"
        );
    }
}

#[test]
fn attention_decomposes_to_its_own_values_in_f32_and_bf16() {
    for dt in [DType::F32, DType::BF16] {
        for mask in [
            MaskKind::None,
            MaskKind::Causal,
            MaskKind::SlidingWindow(3),
            MaskKind::Custom,
        ] {
            check(dt, mask);
        }
    }
}
