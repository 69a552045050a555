//! The attention op on the CPU backend (f32 takes the GEMM path, query blocks of 64, or with
//! AVX-512 and heads of at most 64 the register-blocked path) against the reference evaluator
//! (f64), at every instruction-set level, for every mask kind, grouped heads, fewer queries than
//! keys, query counts that do not fill a block, head widths that do not fill a vector, broadcast
//! custom masks, strided operands (queries, keys and values) and a result stored in the head
//! merge's order; f64 through the generic kernel.
//! bf16 (AVX-512 BF16 dot products, or widened to f32 below that level) and f16 (widened)
//! against the same evaluator within their rounding.

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
    /// Give K and V as `[B, H, D, Sk]` transposed (elements of a key or value row apart).
    strided_kv: bool,
    /// The dtype of every operand and the result.
    dtype: DType,
    /// Read the result through the head merge `[B, Sq, Hq, Dv]` (the plan then stores the
    /// attention in that order: output rows `Hq · Dv` apart).
    merged_out: bool,
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
    let dt = c.dtype;
    let q0 = g.input("q", Shape::new(&qd, dt));
    let q = if c.strided_q {
        g.transpose(q0, &[0, 2, 1, 3])
    } else {
        q0
    };
    let (k, v) = if c.strided_kv {
        let k = g.input("k", Shape::new(&[c.b, c.hkv, c.d, c.sk], dt));
        let v = g.input("v", Shape::new(&[c.b, c.hkv, c.dv, c.sk], dt));
        (g.transpose(k, &[0, 1, 3, 2]), g.transpose(v, &[0, 1, 3, 2]))
    } else {
        let k = g.input("k", Shape::new(&[c.b, c.hkv, c.sk, c.d], dt));
        let v = g.input("v", Shape::new(&[c.b, c.hkv, c.sk, c.dv], dt));
        (k, v)
    };
    let scale = 1.0 / (c.d as f32).sqrt();
    let y = if c.mask == MaskKind::Custom {
        let m = g.input("m", Shape::new(&c.mask_dims, dt));
        g.attention_masked(q, k, v, m, scale)
    } else {
        g.attention(q, k, v, c.mask, scale)
    };
    let y = if c.merged_out {
        let t = g.transpose(y, &[0, 2, 1, 3]);
        g.reshape(t, &[c.b * c.sq, c.hq * c.dv])
    } else {
        y
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
        let bytes = encode(&vals, dt);
        leaves.insert(
            name.to_string(),
            Tensor::from_bytes(&shape, &bytes).unwrap(),
        );
        feeds.push(bytes);
    }
    let want = evaluate(&g, &leaves).unwrap()[0].f64s();
    rlx_cpu::isa::for_each_level(|_| check_against(&g, &feeds, &want, c));
}

/// `vals` as little-endian bytes of `dt` (rounded to nearest).
fn encode(vals: &[f32], dt: DType) -> Vec<u8> {
    match dt {
        DType::F32 => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F64 => vals
            .iter()
            .flat_map(|&x| (x as f64).to_le_bytes())
            .collect(),
        DType::BF16 => vals
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        DType::F16 => vals
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        other => panic!("no values of {other}"),
    }
}

/// Little-endian bytes of `dt` as f64.
fn decode(bytes: &[u8], dt: DType) -> Vec<f64> {
    match dt {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        DType::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        other => panic!("no values of {other}"),
    }
}

fn check_against(g: &Graph, feeds: &[Vec<u8>], want: &[f64], c: &Case) {
    for threads in [1, 2] {
        let mut p = rlx_cpu::compile(g, threads).unwrap();
        for (i, f) in feeds.iter().enumerate() {
            p.write_input(i, f);
        }
        p.execute();
        let mut o = vec![0u8; want.len() * c.dtype.size_bytes()];
        p.read_output(0, &mut o);
        // f32 sums in f32 (the evaluator in f64); f16 is computed in f32 and rounded once (as
        // the evaluator rounds); bf16 also rounds the probabilities to bf16 for the second
        // product: within a unit in the last place of both roundings.
        let tol = match c.dtype {
            DType::F64 => 1e-9,
            DType::F32 => 1e-5,
            DType::F16 => 2e-3,
            _ => 2e-2,
        };
        for (i, (x, w)) in decode(&o, c.dtype).into_iter().zip(want).enumerate() {
            assert!(
                (x - w).abs() <= tol * (1.0 + w.abs()),
                "{} {:?} Sq {} Sk {} D {} Dv {} threads {threads} [{i}]: {x} vs {w}",
                c.dtype,
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
    every_case(DType::F32);
}

#[test]
fn bf16_attention_matches_the_reference_evaluator() {
    every_case(DType::BF16);
}

#[test]
fn f16_attention_matches_the_reference_evaluator() {
    every_case(DType::F16);
}

/// f64 takes the generic kernel (sums in f64, element by element).
#[test]
fn f64_attention_matches_the_reference_evaluator() {
    every_case(DType::F64);
}

fn every_case(dtype: DType) {
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
        strided_kv: false,
        dtype,
        merged_out: false,
    };
    let kinds = [
        MaskKind::None,
        MaskKind::Causal,
        MaskKind::SlidingWindow(5),
        MaskKind::Custom,
    ];
    for mask in kinds {
        for (sq, sk) in [(70, 70), (3, 70), (1, 9), (130, 130)] {
            for (strided_q, strided_kv, merged_out) in [
                (false, false, false),
                (true, false, false),
                (false, true, false),
                (false, false, true),
            ] {
                check(&Case {
                    sq,
                    sk,
                    mask,
                    // A key-padding mask [B, 1, 1, Sk], as an encoder's.
                    mask_dims: vec![base.b, 1, 1, sk],
                    strided_q,
                    strided_kv,
                    merged_out,
                    ..base
                });
            }
        }
    }
    // Head widths around the register-blocked path's: values filling one, three and four
    // vectors or part of one, queries wider than it, an odd depth (a half-filled bf16 pair),
    // values wider than four vectors.
    for (d, dv) in [(64, 40), (8, 64), (20, 33), (80, 16), (19, 80), (7, 130)] {
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

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

    /// bf16 attention of arbitrary sizes (grouped heads, fewer queries than keys, depths and
    /// value widths that fill no vector or pair, every mask kind, strided operands) against
    /// the reference evaluator, at every instruction-set level (the dot-product kernel with
    /// AVX-512 BF16, the widened f32 kernels below it).
    #[test]
    fn bf16_attention_of_any_size_matches_the_reference_evaluator(
        b in 1usize..3,
        hkv in 1usize..3,
        group in 1usize..3,
        sk in 1usize..80,
        q_frac in 0.0f64..1.0,
        d in 1usize..70,
        dv in 1usize..90,
        kind in 0usize..4,
        window in 1usize..12,
        strided in 0usize..4,
    ) {
        let sq = ((sk as f64 * q_frac) as usize).clamp(1, sk);
        let mask = match kind {
            0 => MaskKind::None,
            1 => MaskKind::Causal,
            2 => MaskKind::SlidingWindow(window),
            _ => MaskKind::Custom,
        };
        check(&Case {
            b,
            hq: hkv * group,
            hkv,
            sq,
            sk,
            d,
            dv,
            mask,
            mask_dims: vec![b, 1, 1, sk],
            strided_q: strided == 1,
            strided_kv: strided == 2,
            dtype: DType::BF16,
            merged_out: strided == 3,
        });
    }
}
