//! Causal attention's products skip the depths where the probabilities (and their gradient)
//! are zero, and the score tiles (and their gradient's) that the mask or a zero probability
//! discards: the results equal, bit for bit, those of the same graph with a mask the skipping
//! does not recognize (-1e30 instead of -inf, which zeroes the same probabilities). That the
//! work is really skipped: the GEMM, given a skip, never reads operand values in the skipped
//! region (NaN there leaves its result finite) and leaves unneeded tiles uncomputed; and the
//! lowering hands each product its plan's skip (a skip claiming too much changes the results).

use rlx_cpu::compile;
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
    run_program(compile(g, threads).unwrap(), g)
}

/// Run a program of `g` (or of its prepared form) on the fixed inputs; its outputs' bytes.
fn run_program(mut p: rlx_cpu::Program, g: &Graph) -> Vec<Vec<u8>> {
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

/// The lowering hands each product the skip its plan names: lowering the -1e30 graph (which
/// proves no zeros) with the -inf graph's skips gives the same results, bit for bit; and with
/// any one of them claiming 8 more zero depths (or unneeded columns) than there are, the results
/// change. (A lowering that ignored the plan's skips would compute the full products and give
/// the right results in both cases.)
#[test]
fn the_lowering_skips_what_the_plan_says() {
    let (t, u) = (64, 64);
    rlx_cpu::isa::for_each_level(|level| {
        let (_, causal) = rlx_cpu::prepare(&attention(t, u, f32::NEG_INFINITY), true, &[]).unwrap();
        let (g, plan) = rlx_cpu::prepare(&attention(t, u, -1e30), true, &[]).unwrap();
        assert_eq!(causal.skips.len(), 6, "{:?}", causal.skips);
        for id in causal.skips.keys() {
            assert_eq!(
                g.node(NodeId(*id)).op.name(),
                "matmul",
                "%{id} of the -1e30 graph"
            );
        }
        let lowered = |skips: &std::collections::BTreeMap<u32, rlx_opt::Skip>| {
            let mut p = plan.clone();
            p.skips = skips.clone();
            run_program(rlx_cpu::lower(&g, &p, 1, None).unwrap(), &g)
        };
        let right = lowered(&causal.skips);
        assert_eq!(
            right,
            run(&attention(t, u, f32::NEG_INFINITY), 1),
            "at {level}: the -1e30 graph lowered with the -inf graph's skips"
        );
        use rlx_opt::Skip;
        for (id, skip) in &causal.skips {
            let wider = match *skip {
                Skip::RowMax(o) => Skip::RowMax(o - 8),
                Skip::RowMin(o) => Skip::RowMin(o - 8),
                Skip::ColMin(o) => Skip::ColMin(o - 8),
                Skip::Unneeded(o) => Skip::Unneeded(o - 8),
            };
            let mut skips = causal.skips.clone();
            skips.insert(*id, wider);
            assert!(
                lowered(&skips) != right,
                "at {level}: %{id} lowered with {wider:?} instead of {skip:?} gives the same \
                 results: the product does not skip what its plan says"
            );
        }
    });
}

/// The largest micro-tile of any instruction-set level (AVX-512: 12 rows × 32 columns; AVX2's
/// 6 × 16 and the portable 4 × 8 divide it): a depth a whole tile of this size does not need is
/// needed by no tile of any level.
const TILE_ROWS: usize = 12;
const TILE_COLS: usize = 32;

/// `C = A·B` (`m×k` by `k×n`, row-major) through `sgemm_tri` with `tri`, at the current level.
fn sgemm_tri(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], tri: gemm::Tri) -> Vec<f32> {
    let mut c = vec![f32::NAN; m * n];
    let mut scratch = vec![0f32; gemm::scratch_len(m, n, k, 1)];
    let (am, bm) = (
        gemm::Mat {
            ptr: a.as_ptr(),
            rs: k,
            cs: 1,
        },
        gemm::Mat {
            ptr: b.as_ptr(),
            rs: n,
            cs: 1,
        },
    );
    // SAFETY: the operands and C are dense buffers of the sizes given; the scratch is one
    // thread's.
    unsafe {
        gemm::sgemm_tri(
            m,
            n,
            k,
            am,
            bm,
            c.as_mut_ptr(),
            n,
            scratch.as_mut_ptr(),
            tri,
        )
    };
    c
}

use rlx_cpu::gemm;

/// The GEMM does not do the work a skip names: with NaN in place of the zeros no tile (of any
/// level's size) needs — A's past row `i + off` (`RowMax`), before `i - off` (`RowMin`), B's before
/// column `j - off` (`ColMin`) — the result is finite and equals the full product of the
/// zero-holding operands; a product that read them (as the full GEMM does, checked) gives NaN.
/// With `Unneeded`, the tiles wholly past `j > i + off` are zero, where the full product is not,
/// and every needed element is the full product's.
#[test]
fn the_gemm_does_not_touch_what_a_skip_excludes() {
    use gemm::Tri;
    let (m, n, k) = (40usize, 70usize, 64usize);
    let value =
        |x: usize, y: usize, seed: usize| ((x * 7 + y * 13 + seed) % 23) as f32 / 8.0 - 1.375;
    let ceil = |x: usize, to: usize| x.div_ceil(to) * to;
    let floor = |x: usize, to: usize| x / to * to;
    for tri in [
        Tri::RowMax(0),
        Tri::RowMax(3),
        Tri::RowMin(0),
        Tri::RowMin(2),
        Tri::ColMin(0),
        Tri::ColMin(5),
        Tri::Unneeded(0),
        Tri::Unneeded(4),
    ] {
        // Which elements of A (i, p) and of B (p, j) are zero, and which of those no tile reads.
        let a_zero = |i: usize, p: usize| match tri {
            Tri::RowMax(o) => p as isize > i as isize + o,
            Tri::RowMin(o) => (p as isize) < i as isize - o,
            _ => false,
        };
        let a_unread = |i: usize, p: usize| match tri {
            Tri::RowMax(o) => p as isize >= ceil(i + 1, TILE_ROWS).min(m) as isize + o,
            Tri::RowMin(o) => (p as isize) < floor(i, TILE_ROWS) as isize - o,
            _ => false,
        };
        let b_zero = |p: usize, j: usize| match tri {
            Tri::ColMin(o) => (p as isize) < j as isize - o,
            _ => false,
        };
        let b_unread = |p: usize, j: usize| match tri {
            Tri::ColMin(o) => (p as isize) < floor(j, TILE_COLS) as isize - o,
            _ => false,
        };
        let zeroed = |unread: bool| if unread { f32::NAN } else { 0.0 };
        let (mut a, mut b) = (vec![0f32; m * k], vec![0f32; k * n]);
        let (mut a_nan, mut b_nan) = (a.clone(), b.clone());
        for i in 0..m {
            for p in 0..k {
                let z = a_zero(i, p);
                a[i * k + p] = if z { 0.0 } else { value(i, p, 1) };
                a_nan[i * k + p] = if z {
                    zeroed(a_unread(i, p))
                } else {
                    value(i, p, 1)
                };
            }
        }
        for p in 0..k {
            for j in 0..n {
                let z = b_zero(p, j);
                b[p * n + j] = if z { 0.0 } else { value(p, j, 5) };
                b_nan[p * n + j] = if z {
                    zeroed(b_unread(p, j))
                } else {
                    value(p, j, 5)
                };
            }
        }
        let poisoned = a_nan.iter().chain(&b_nan).filter(|x| x.is_nan()).count();
        rlx_cpu::isa::for_each_level(|level| {
            let full = sgemm_tri(m, n, k, &a, &b, Tri::Full);
            let got = sgemm_tri(m, n, k, &a_nan, &b_nan, tri);
            if let Tri::Unneeded(o) = tri {
                let mut skipped = 0;
                for i in 0..m {
                    for j in 0..n {
                        let (f, g) = (full[i * n + j], got[i * n + j]);
                        if j as isize <= i as isize + o {
                            assert!(f == g, "{tri:?} at {level}: C[{i}][{j}] {g}, full {f}");
                        } else if floor(j, TILE_COLS) as isize - o
                            >= ceil(i + 1, TILE_ROWS).min(m) as isize
                        {
                            assert!(
                                g == 0.0 && f != 0.0,
                                "{tri:?} at {level}: unneeded C[{i}][{j}] is {g} (full {f}): \
                                 computed, not skipped"
                            );
                            skipped += 1;
                        }
                    }
                }
                assert!(skipped > 0, "{tri:?}: no tile wholly unneeded");
                return;
            }
            assert!(poisoned > 0, "{tri:?}: no zero that no tile reads");
            assert!(
                sgemm_tri(m, n, k, &a_nan, &b_nan, Tri::Full)
                    .iter()
                    .any(|x| x.is_nan()),
                "{tri:?}: the full product of the poisoned operands is finite"
            );
            for (e, (f, g)) in full.iter().zip(&got).enumerate() {
                assert!(
                    f == g,
                    "{tri:?} at {level}: C[{}][{}] {g}, full product {f} ({poisoned} NaN where \
                     the skip excludes)",
                    e / n,
                    e % n
                );
            }
        });
    }
}
