//! `Rope` nodes rotating by the same positions with the same base share one table of rotations
//! per program (made by the first node a run reaches, read by the others). Their results must
//! be bit-identical to those of each node compiled alone, run after run as the positions change
//! (a table kept from an earlier run would rotate by stale positions), and agree with the
//! reference evaluator.

use rlx_driver::Executable;
use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::{DType, Graph, NodeId, Shape};
use std::collections::BTreeMap;

const S: usize = 5;
const D: usize = 8;

/// `(heads, theta, interleaved)` of each rotated input: the first two share a table (same
/// positions and base; interleaving only changes which elements pair up), the third has its own.
const ROPES: [(usize, f32, bool); 3] = [(2, 10_000.0, false), (1, 10_000.0, true), (3, 1e6, false)];

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|x| (((x * (17 + 5 * seed) + 11 * seed) % 89) as f32 - 44.0) / 23.0)
        .collect()
}

fn bytes(v: &[f32], dt: DType) -> Vec<u8> {
    match dt {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => v.iter().flat_map(|&x| (x as f64).to_le_bytes()).collect(),
    }
}

/// Positions, then the inputs of `ropes` (indices into [`ROPES`]), each rotated.
fn graph(dt: DType, ropes: &[usize]) -> Graph {
    let mut g = Graph::new("rope");
    let pos = g.input("pos", Shape::new(&[S], DType::I32));
    let mut outs = Vec::new();
    for &r in ropes {
        let (h, theta, interleaved) = ROPES[r];
        let x = g.input(&format!("x{r}"), Shape::new(&[1, h, S, D], dt));
        outs.push(g.rope(x, pos, theta, interleaved));
    }
    g.set_outputs(outs);
    g
}

/// Run `p` (compiled from `graph(dt, ropes)`) at `positions`; each output's bytes.
fn run(p: &mut dyn Executable, dt: DType, ropes: &[usize], positions: &[i32]) -> Vec<Vec<u8>> {
    let pos: Vec<u8> = positions.iter().flat_map(|p| p.to_le_bytes()).collect();
    p.write_input(0, &pos).unwrap();
    for (i, &r) in ropes.iter().enumerate() {
        p.write_input(1 + i, &bytes(&values(ROPES[r].0 * S * D, r), dt))
            .unwrap();
    }
    p.execute().unwrap();
    (0..ropes.len())
        .map(|i| {
            let mut o = vec![0u8; ROPES[ropes[i]].0 * S * D * dt.size_bytes()];
            p.read_output(i, &mut o).unwrap();
            o
        })
        .collect()
}

#[test]
fn ropes_sharing_positions_give_each_runs_rotations_bit_for_bit() {
    let all = [0, 1, 2];
    let runs: [[i32; S]; 4] = [
        [0, 1, 2, 3, 4],
        [7, 8, 9, 10, 11],
        [3, 3, 3, 3, 3],
        [0, 1, 2, 3, 4],
    ];
    for dt in [DType::F32, DType::F64] {
        let g = graph(dt, &all);
        for threads in [1, 2] {
            let mut shared = rlx_cpu::compile(&g, threads).unwrap();
            for positions in &runs {
                let got = run(&mut shared, dt, &all, positions);
                for (i, &r) in all.iter().enumerate() {
                    let mut alone = rlx_cpu::compile(&graph(dt, &[r]), threads).unwrap();
                    let want = run(&mut alone, dt, &[r], positions);
                    assert_eq!(got[i], want[0], "{dt} rope {r} at {positions:?}");
                }
                // And the reference evaluator (f64; f32 follows llama.cpp's f32 recurrence).
                let mut leaves = BTreeMap::new();
                let pos: Vec<u8> = positions.iter().flat_map(|p| p.to_le_bytes()).collect();
                let shape = |id: NodeId| g.shape(id).clone();
                for (name, id) in g.inputs() {
                    let b = match name.strip_prefix('x') {
                        Some(r) => {
                            let r: usize = r.parse().unwrap();
                            bytes(&values(ROPES[r].0 * S * D, r), dt)
                        }
                        None => pos.clone(),
                    };
                    leaves.insert(
                        name.to_string(),
                        Tensor::from_bytes(&shape(id), &b).unwrap(),
                    );
                }
                let want = evaluate(&g, &leaves).unwrap();
                for (i, w) in want.iter().enumerate() {
                    let got: Vec<f64> = match dt {
                        DType::F32 => got[i]
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
                            .collect(),
                        _ => got[i]
                            .chunks_exact(8)
                            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
                            .collect(),
                    };
                    for (x, w) in got.iter().zip(w.f64s()) {
                        assert!((x - w).abs() <= 1e-4 * (1.0 + w.abs()), "{dt}: {x} vs {w}");
                    }
                }
            }
        }
    }
}
