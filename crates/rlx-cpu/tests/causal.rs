//! Causal attention's products skip the depths where the probabilities (and their gradient)
//! are zero, and the score tiles (and their gradient's) that the mask or a zero probability
//! discards: the results equal, bit for bit, those of the same graph with a mask the skipping
//! does not recognize (-1e30 instead of -inf, which zeroes the same probabilities).

use rlx_cpu::compile;
use rlx_driver::Executable;
use rlx_ir::{DType, Graph, NodeId, Shape};

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Attention forward and hand-written backward (as autodiff writes it) over `t` queries and
/// `u >= t` keys, masked past `row + u - t` with `masked`.
fn attention(t: usize, u: usize, masked: f32) -> Graph {
    let (b, h, d) = (2usize, 3usize, 8usize);
    let mut g = Graph::new("causal");
    let q = g.input("q", Shape::new(&[b, h, t, d], DType::F32));
    let k = g.input("k", Shape::new(&[b, h, u, d], DType::F32));
    let v = g.input("v", Shape::new(&[b, h, u, d], DType::F32));
    let dy = g.input("dy", Shape::new(&[b, h, t, d], DType::F32));
    let mask: Vec<u8> = (0..t * u)
        .flat_map(|x| if x % u > x / u + (u - t) { masked } else { 0.0 }.to_le_bytes())
        .collect();
    let mask = g
        .try_constant_bytes(Shape::new(&[t, u], DType::F32), mask)
        .unwrap();
    let scale = g.scalar(0.35, DType::F32);
    let kt = g.transpose(k, &[0, 1, 3, 2]);
    let s = g.dot(q, kt);
    let s = g.mul(s, scale);
    let s = g.add(s, mask);
    let p = g.softmax(s, 3);
    let y = g.dot(p, v);
    let pt = g.transpose(p, &[0, 1, 3, 2]);
    let dv = g.dot(pt, dy);
    let vt = g.transpose(v, &[0, 1, 3, 2]);
    let dp = g.dot(dy, vt);
    let pdp = g.mul(dp, p);
    let r = g.sum(pdp, &[3], true);
    let c = g.sub(dp, r);
    let ds = g.mul(p, c);
    let ds = g.mul(ds, scale);
    let dq = g.dot(ds, k);
    let qt = g.transpose(q, &[0, 1, 3, 2]);
    let dkt = g.dot(qt, ds);
    let outs: Vec<NodeId> = vec![y, dv, dq, dkt];
    g.set_outputs(outs);
    g
}

fn run(g: &Graph, threads: usize) -> Vec<Vec<u8>> {
    let mut p = compile(g, threads).unwrap();
    for i in 0..4 {
        let n = g.shape(g.inputs()[i].1).size_bytes().unwrap() / 4;
        let v: Vec<f32> = (0..n)
            .map(|x| ((x * (31 + 7 * i) % 97) as f32 - 48.0) / 29.0)
            .collect();
        p.write_input(i, &bytes(&v));
    }
    p.execute();
    (0..4)
        .map(|i| {
            let mut o = vec![0u8; g.shape(g.outputs()[i]).size_bytes().unwrap()];
            p.read_output(i, &mut o);
            o
        })
        .collect()
}

#[test]
fn causal_products_skip_zero_depths_with_the_same_results() {
    rlx_cpu::isa::for_each_level(|_| {
        for (t, u) in [(13usize, 13usize), (64, 64), (13, 16), (30, 41)] {
            for threads in [1, 2] {
                let skipped = run(&attention(t, u, f32::NEG_INFINITY), threads);
                let full = run(&attention(t, u, -1e30), threads);
                for (o, (a, b)) in skipped.iter().zip(&full).enumerate() {
                    let fa = a
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()));
                    let fb: Vec<f32> = b
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    for (i, (x, y)) in fa.zip(fb).enumerate() {
                        assert!(
                            x == y,
                            "t {t} u {u} threads {threads} output {o} [{i}]: {x} vs {y}"
                        );
                    }
                }
            }
        }
    });
}

#[test]
fn the_plan_finds_a_skip_for_every_product_of_causal_attention() {
    use rlx_opt::Skip;
    let (_, plan) = rlx_cpu::prepare(&attention(13, 16, f32::NEG_INFINITY), true, &[]).unwrap();
    let kinds: Vec<Skip> = plan.skips.values().copied().collect();
    // scores (unneeded past the mask), P V, P^T dY, dY V^T (unneeded), dS K, Q^T dS.
    assert_eq!(kinds.len(), 6, "{kinds:?}");
    assert!(
        kinds.contains(&Skip::RowMax(3))
            && kinds.contains(&Skip::RowMin(3))
            && kinds.contains(&Skip::ColMin(3))
            && kinds.contains(&Skip::Unneeded(3)),
        "{kinds:?}"
    );
    // A finite mask proves no zeros: the offsets found skip nothing (no column passes row + 15).
    let (_, plan) = rlx_cpu::prepare(&attention(13, 16, -1e30), true, &[]).unwrap();
    let off = |s: &Skip| match *s {
        Skip::RowMax(o) | Skip::RowMin(o) | Skip::ColMin(o) | Skip::Unneeded(o) => o,
    };
    assert!(
        plan.skips.values().all(|s| off(s) >= 15),
        "{:?}",
        plan.skips
    );
}
