//! Mamba's selective scan on the CPU (its recurrence kernel: the states of a step as vectors of
//! sixteen, softplus and the SiLU gate vectorized) against the reference evaluator's f64
//! recurrence, at lengths and state sizes the op table's small cases do not reach.

mod common;

use common::{decode, encode, uniform};
use rlx::ir::eval::{evaluate, Tensor};
use rlx::prelude::*;
use std::collections::BTreeMap;

fn check(bs: usize, ds: usize, ls: usize, ns: usize, softplus: bool, extras: usize) {
    let f32s = |d: &[usize]| Shape::new(d, DType::F32);
    let shapes = [
        f32s(&[bs, ds, ls]),
        f32s(&[bs, ds, ls]),
        f32s(&[ds, ns]),
        f32s(&[bs, ns, ls]),
        f32s(&[bs, ns, ls]),
        f32s(&[ds]),
        f32s(&[bs, ds, ls]),
    ];
    let names = ["u", "delta", "a", "b", "c", "d", "z"];
    let count = 5 + extras;
    let mut g = Graph::new("scan");
    let ins: Vec<NodeId> = (0..count)
        .map(|i| g.input(names[i], shapes[i].clone()))
        .collect();
    let y = g.selective_scan(
        [ins[0], ins[1], ins[2], ins[3], ins[4]],
        ins.get(5).copied(),
        ins.get(6).copied(),
        softplus,
    );
    g.set_outputs(vec![y]);
    let mut feeds = Vec::new();
    let mut leaves = BTreeMap::new();
    for i in 0..count {
        let n = shapes[i].numel().unwrap();
        let (lo, hi) = match i {
            1 if !softplus => (0.01, 0.3),
            2 => (-2.0, -0.05),
            _ => (-1.0, 1.0),
        };
        let bytes = encode(&uniform(n, i as u64 + 1, lo, hi), DType::F32);
        leaves.insert(
            names[i].to_string(),
            Tensor::from_bytes(&shapes[i], &bytes).unwrap(),
        );
        feeds.push((names[i], bytes));
    }
    let want = decode(&evaluate(&g, &leaves).unwrap()[0].to_bytes(), DType::F32);
    let mut c = Session::new(Device::Cpu).with_threads(2).compile(g);
    let f: Vec<(&str, &[u8], DType)> = feeds
        .iter()
        .map(|(n, b)| (*n, b.as_slice(), DType::F32))
        .collect();
    rlx_cpu::isa::for_each_level(|level| {
        let got = decode(&c.run_typed(&f)[0].0, DType::F32);
        let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 2e-5 * scale,
                "[{bs}, {ds}, {ls}] state {ns} softplus {softplus} element {i}: {a} vs {b} at {level}"
            );
        }
    });
}

#[test]
fn the_cpu_recurrence_matches_the_reference_at_length() {
    check(2, 5, 257, 16, true, 2);
    check(1, 3, 130, 21, false, 1);
    check(2, 2, 64, 32, true, 0);
    check(1, 4, 33, 7, true, 2);
}
