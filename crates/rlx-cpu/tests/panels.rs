//! bf16 weights read only as the right operand of products are stored in column panels (the
//! plan's `panel_params`): the products give the same bits as with row-major weights, params
//! are still written and read row-major (whole or in ranges at any byte offset), and a param
//! stored differently in a program it shares storage with is refused with an error.

use rlx_cpu::gemm::half::PANEL;
use rlx_cpu::{lower, prepare, Program};
use rlx_driver::Executable;
use rlx_ir::{DType, Graph, NodeId, Op, Shape};

fn bf16(v: f32) -> [u8; 2] {
    half::bf16::from_f32(v).to_bits().to_le_bytes()
}

fn values(n: usize, s: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| bf16(((i * s % 29) as f32 - 14.0) / 8.0))
        .collect()
}

/// `y = (x · w1 + b) · w2` with `w1` also `[k, n]`-shaped like a row-major weight, `w3` read by
/// a product and an addition (so not panel-stored), and `x` batched (the product folds rows).
fn graph(rows: usize) -> Graph {
    let mut g = Graph::new("panels");
    let x = g.input("x", Shape::new(&[2, rows, 64], DType::BF16));
    let w1 = g.param("w1", Shape::new(&[64, 96], DType::BF16));
    let w2 = g.param("w2", Shape::new(&[96, 32], DType::BF16));
    let w3 = g.param("w3", Shape::new(&[32, 32], DType::BF16));
    let h = g.dot(x, w1);
    let y = g.dot(h, w2);
    let z = g.dot(y, w3);
    let t = g.add(w3, w3);
    g.set_outputs(vec![y, z, t]);
    g
}

fn param_id(g: &Graph, name: &str) -> NodeId {
    g.ids()
        .find(|&i| matches!(&g.node(i).op, Op::Param { name: n } if n == name))
        .unwrap()
}

fn compile(g: &Graph, panels: bool, share: Option<&Program>) -> rlx_ir::Result<Program> {
    let (g, mut plan) = prepare(g, true, &[])?;
    if !panels {
        plan.panel_params.clear();
    }
    lower(&g, &plan, 2, share)
}

fn run(p: &mut Program, x: &[u8]) -> Vec<Vec<u8>> {
    p.write_input(0, x);
    p.execute();
    (0..p.outputs().len())
        .map(|i| {
            let mut o = vec![0u8; p.outputs()[i].shape.size_bytes().unwrap()];
            p.read_output(i, &mut o);
            o
        })
        .collect()
}

#[test]
fn the_plan_picks_weights_read_only_as_the_right_operand() {
    let g = graph(5);
    let (fused, plan) = prepare(&g, true, &[]).unwrap();
    let picked: Vec<&str> = plan
        .panel_params
        .keys()
        .map(|&i| match &fused.node(NodeId(i)).op {
            Op::Param { name } => name.as_str(),
            op => panic!("{op:?} picked"),
        })
        .collect();
    assert_eq!(picked, ["w1", "w2"]);
    assert!(plan.panel_params.values().all(|&w| w == PANEL));
    assert_eq!(plan.panels(param_id(&fused, "w1")), Some(PANEL));
    assert_eq!(plan.panels(param_id(&fused, "w3")), None);
    // Updated params stay row-major.
    let (_, plan) = prepare(&g, true, &[("w1".into(), 0)]).unwrap();
    assert_eq!(plan.panel_params.len(), 1);
}

#[test]
fn panel_stored_weights_give_the_same_bits_and_read_back_row_major() {
    // Few rows (B read in place) and many (B packed).
    for rows in [3usize, 7, 200] {
        let g = graph(rows);
        let (mut plain, mut pan) = (
            compile(&g, false, None).unwrap(),
            compile(&g, true, None).unwrap(),
        );
        let (w1, w2, w3) = (values(64 * 96, 5), values(96 * 32, 7), values(32 * 32, 3));
        for p in [&mut plain, &mut pan] {
            p.write_param(0, &w1);
            // w2 in pieces at odd byte offsets (each a part of an element), as a loader
            // streaming a file may write it.
            for (s, e) in [(0usize, 1usize), (1, 67), (67, 2000), (2000, w2.len())] {
                p.write_param_range(1, s, &w2[s..e]);
            }
            p.write_param(2, &w3);
        }
        let x = values(2 * rows * 64, 11);
        assert_eq!(run(&mut plain, &x), run(&mut pan, &x), "{rows} rows");
        for (i, w) in [&w1, &w2, &w3].into_iter().enumerate() {
            let mut back = vec![0u8; w.len()];
            pan.read_param(i, &mut back);
            assert_eq!(&back, w, "param {i} read back");
        }
    }
}

#[test]
fn sharing_follows_a_row_major_owner_and_refuses_to_read_panels_otherwise() {
    let g = graph(4);
    let owner = compile(&g, true, None).unwrap();
    // The same graph shares every param.
    assert!(compile(&g, true, Some(&owner)).is_ok());
    // A graph reading w1 elementwise too keeps it row-major: it cannot share the panels.
    let mut h = Graph::new("other");
    let x = h.input("x", Shape::new(&[64, 96], DType::BF16));
    let w1 = h.param("w1", Shape::new(&[64, 96], DType::BF16));
    let y = h.add(x, w1);
    h.set_outputs(vec![y]);
    let err = compile(&h, true, Some(&owner))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("w1") && err.contains("panels"), "{err}");
    // The other way round works: the products read the row-major owner's w1 (an evaluation
    // graph sharing a training graph's params, say), with the same results as on their own.
    let mut row_major_owner = compile(&h, true, None).unwrap();
    let mut sharing = compile(&g, true, Some(&row_major_owner)).unwrap();
    let mut alone = compile(&g, true, None).unwrap();
    let (w1, w2, w3) = (values(64 * 96, 5), values(96 * 32, 7), values(32 * 32, 3));
    row_major_owner.write_param(0, &w1);
    alone.write_param(0, &w1);
    for p in [&mut sharing, &mut alone] {
        p.write_param(1, &w2);
        p.write_param(2, &w3);
    }
    let x = values(2 * 4 * 64, 11);
    assert_eq!(run(&mut sharing, &x), run(&mut alone, &x));
}

/// `y = x · w` for a `[k, n]` bf16 weight.
fn one_product(m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("one");
    let x = g.input("x", Shape::new(&[m, k], DType::BF16));
    let w = g.param("w", Shape::new(&[k, n], DType::BF16));
    let y = g.dot(x, w);
    g.set_outputs(vec![y]);
    g
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// A panel-stored weight written in arbitrary byte pieces reads back as written and gives
    /// the products of the same weight stored row-major.
    #[test]
    fn pieces_written_anywhere_read_back_and_multiply_alike(
        m in 1usize..20,
        k in 1usize..70,
        panels in 1usize..4,
        cuts in proptest::collection::vec(0.0f64..1.0, 0..6),
    ) {
        let n = panels * PANEL;
        let g = one_product(m, k, n);
        let (mut plain, mut pan) = (compile(&g, false, None).unwrap(), compile(&g, true, None).unwrap());
        let w = values(k * n, 5);
        let mut at: Vec<usize> = cuts.iter().map(|c| (c * w.len() as f64) as usize).collect();
        at.push(0);
        at.push(w.len());
        at.sort_unstable();
        for p in at.windows(2) {
            pan.write_param_range(0, p[0], &w[p[0]..p[1]]);
        }
        plain.write_param(0, &w);
        let mut back = vec![0u8; w.len()];
        pan.read_param(0, &mut back);
        proptest::prop_assert_eq!(&back, &w);
        let x = values(m * k, 11);
        proptest::prop_assert_eq!(run(&mut plain, &x), run(&mut pan, &x));
    }
}
