//! The attention op on the CPU backend (f32 takes the GEMM path, query blocks of 64, or with
//! AVX-512 and heads of at most 64 the register-blocked path) against the reference evaluator
//! (f64), at every instruction-set level, for every mask kind, grouped heads, fewer queries than
//! keys, query counts that do not fill a block, head widths that do not fill a vector, broadcast
//! custom masks and strided operands.

use rlx_driver::Executable;
use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::{DType, Graph, MaskKind, Shape};
use std::collections::BTreeMap;

struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    dv: usize,
    mask: MaskKind,
    /// Dims of the additive mask for [`MaskKind::Custom`].
    mask_dims: Vec<usize>,
    /// Give Q as `[B, Sq, Hq, D]` transposed (a strided operand).
    strided_q: bool,
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|x| (((x * (31 + 7 * seed) + 13 * seed) % 97) as f32 - 48.0) / 29.0)
        .collect()
}

fn check(c: &Case) {
    let mut g = Graph::new("attention");
    let qd = if c.strided_q {
        vec![c.b, c.sq, c.hq, c.d]
    } else {
        vec![c.b, c.hq, c.sq, c.d]
    };
    let q0 = g.input("q", Shape::new(&qd, DType::F32));
    let q = if c.strided_q {
        g.transpose(q0, &[0, 2, 1, 3])
    } else {
        q0
    };
    let k = g.input("k", Shape::new(&[c.b, c.hkv, c.sk, c.d], DType::F32));
    let v = g.input("v", Shape::new(&[c.b, c.hkv, c.sk, c.dv], DType::F32));
    let scale = 1.0 / (c.d as f32).sqrt();
    let y = if c.mask == MaskKind::Custom {
        let m = g.input("m", Shape::new(&c.mask_dims, DType::F32));
        g.attention_masked(q, k, v, m, scale)
    } else {
        g.attention(q, k, v, c.mask, scale)
    };
    g.set_outputs(vec![y]);
    let mut leaves = BTreeMap::new();
    let mut feeds = Vec::new();
    for (i, (name, id)) in g.inputs().iter().enumerate() {
        let shape = g.shape(*id).clone();
        let n = shape.static_dims().unwrap().iter().product();
        let mut vals = values(n, i);
        if *name == "m" {
            // Padding-style masks: some keys get a large negative, the rest zero.
            vals = (0..n)
                .map(|x| if (x * 7 + 3) % 5 == 0 { -1e9 } else { 0.0 })
                .collect();
        }
        let bytes: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
        leaves.insert(
            name.to_string(),
            Tensor::from_bytes(&shape, &bytes).unwrap(),
        );
        feeds.push(bytes);
    }
    let want = evaluate(&g, &leaves).unwrap()[0].f64s();
    rlx_cpu::isa::for_each_level(|_| check_against(&g, &feeds, &want, c));
}

fn check_against(g: &Graph, feeds: &[Vec<u8>], want: &[f64], c: &Case) {
    for threads in [1, 2] {
        let mut p = rlx_cpu::compile(g, threads).unwrap();
        for (i, f) in feeds.iter().enumerate() {
            p.write_input(i, f);
        }
        p.execute();
        let mut o = vec![0u8; want.len() * 4];
        p.read_output(0, &mut o);
        for (i, (x, w)) in o.chunks_exact(4).zip(want).enumerate() {
            let x = f32::from_le_bytes(x.try_into().unwrap()) as f64;
            assert!(
                (x - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{:?} Sq {} Sk {} D {} Dv {} threads {threads} [{i}]: {x} vs {w}",
                c.mask,
                c.sq,
                c.sk,
                c.d,
                c.dv
            );
        }
    }
}

#[test]
fn f32_attention_matches_the_reference_evaluator() {
    let base = Case {
        b: 2,
        hq: 4,
        hkv: 2,
        sq: 70,
        sk: 70,
        d: 32,
        dv: 16,
        mask: MaskKind::None,
        mask_dims: vec![],
        strided_q: false,
    };
    let kinds = [
        MaskKind::None,
        MaskKind::Causal,
        MaskKind::SlidingWindow(5),
        MaskKind::Custom,
    ];
    for mask in kinds {
        for (sq, sk) in [(70, 70), (3, 70), (1, 9), (130, 130)] {
            for strided_q in [false, true] {
                check(&Case {
                    sq,
                    sk,
                    mask,
                    // A key-padding mask [B, 1, 1, Sk], as an encoder's.
                    mask_dims: vec![base.b, 1, 1, sk],
                    strided_q,
                    ..base
                });
            }
        }
    }
    // Head widths around the register-blocked path's: values filling one, three and four
    // vectors or part of one, queries wider than it.
    for (d, dv) in [(64, 40), (8, 64), (20, 33), (80, 16)] {
        for mask in [MaskKind::None, MaskKind::Causal, MaskKind::Custom] {
            check(&Case {
                d,
                dv,
                mask,
                sq: 37,
                sk: 37,
                mask_dims: vec![base.b, 1, 1, 37],
                ..base
            });
        }
    }
    // A full [Sq, Sk] mask broadcast over batch and heads.
    check(&Case {
        mask: MaskKind::Custom,
        mask_dims: vec![70, 70],
        ..base
    });
}
