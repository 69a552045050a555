//! The text form: random graphs over every op kind, with random attribute values, names and
//! shapes, print and parse back to the same graph; malformed text gives errors with a position.

use proptest::prelude::*;
use rlx_ir::text::Attrs;
use rlx_ir::*;

/// An op of `kind` with attributes drawn from `v` (integers), `x` (a float) and `s` (a string).
/// The match is exhaustive, so a new op kind fails to compile here until it has a generator.
fn op_of(kind: OpKind, v: &[usize], x: f32, s: &str, body: &Graph) -> Op {
    use OpKind as K;
    let pick = |i: usize, n: usize| v[i % v.len()] % n;
    let list = |i: usize| {
        v[i % v.len()..]
            .iter()
            .take(v[i % v.len()] % 4)
            .copied()
            .collect::<Vec<_>>()
    };
    let opt = |i: usize| (!v[i % v.len()].is_multiple_of(3)).then(|| v[(i + 1) % v.len()]);
    let pairs = |i: usize| list(i).into_iter().map(|a| (a, a / 2)).collect::<Vec<_>>();
    let schemes: Vec<QuantScheme> = [
        QuantScheme::Int8Block { block_size: v[0] },
        QuantScheme::Int8BlockAsym { block_size: v[1] },
        QuantScheme::Int4Block { block_size: v[2] },
        QuantScheme::Fp8E4m3,
        QuantScheme::Fp8E5m2,
    ]
    .into_iter()
    .chain(QuantScheme::GGUF)
    .collect();
    let plain = || {
        ops::from_attrs(kind, Attrs::new(kind.name(), Vec::new()))
            .expect("an op without attributes")
    };
    match kind {
        K::Input => Op::Input {
            name: s.to_string(),
        },
        K::Param => Op::Param {
            name: format!("{s}{}", v[0]),
        },
        K::Constant => Op::Constant {
            data: v.iter().map(|&b| b as u8).collect(),
        },
        K::Add
        | K::Sub
        | K::Mul
        | K::Div
        | K::Max
        | K::Min
        | K::Pow
        | K::Eq
        | K::Ne
        | K::Lt
        | K::Le
        | K::Gt
        | K::Ge
        | K::Where => plain(),
        K::Gelu
        | K::GeluApprox
        | K::GeluApproxGrad
        | K::Silu
        | K::Relu
        | K::Sigmoid
        | K::Tanh
        | K::Exp
        | K::Log
        | K::Sqrt => plain(),
        K::Rsqrt
        | K::Neg
        | K::Abs
        | K::Sin
        | K::Cos
        | K::Tan
        | K::Atan
        | K::Round
        | K::Erf
        | K::MatMul
        | K::CacheWrite => plain(),
        K::Cast => Op::Cast {
            to: DType::ALL[pick(0, DType::ALL.len())],
        },
        K::DotGeneral => Op::DotGeneral(DotDims {
            lhs_contract: list(0),
            rhs_contract: list(1),
            lhs_batch: list(2),
            rhs_batch: list(3),
        }),
        K::Reduce => Op::Reduce {
            kind: [
                ReduceKind::Sum,
                ReduceKind::Mean,
                ReduceKind::Max,
                ReduceKind::Min,
                ReduceKind::Prod,
            ][pick(0, 5)],
            axes: list(1),
            keepdims: pick(2, 2) == 1,
        },
        K::Softmax => Op::Softmax { axis: v[0] },
        K::Cumsum => Op::Cumsum { axis: v[0] },
        K::TopK => Op::TopK {
            k: v[0],
            output: if pick(1, 2) == 0 {
                TopKOutput::Values
            } else {
                TopKOutput::Indices
            },
        },
        K::LayerNorm => Op::LayerNorm { eps: x },
        K::RmsNorm => Op::RmsNorm { eps: x },
        K::Attention => Op::Attention {
            mask: [
                MaskKind::None,
                MaskKind::Causal,
                MaskKind::SlidingWindow(v[1]),
                MaskKind::Custom,
            ][pick(0, 4)],
            scale: x,
        },
        K::Rope => Op::Rope {
            theta: x,
            interleaved: pick(0, 2) == 1,
        },
        K::Reshape => Op::Reshape { shape: list(0) },
        K::Expand => Op::Expand { shape: list(0) },
        K::Transpose => Op::Transpose { perm: list(0) },
        K::Narrow => Op::Narrow {
            axis: v[0],
            start: v[1],
            len: v[2],
        },
        K::Concat => Op::Concat { axis: v[0] },
        K::Gather => Op::Gather { axis: v[0] },
        K::ScatterAdd => Op::ScatterAdd { axis: v[0] },
        K::Conv => Op::Conv(ConvAttrs {
            stride: list(0),
            padding: pairs(1),
            dilation: list(2),
            groups: v[3 % v.len()],
        }),
        K::Pool => Op::Pool(PoolAttrs {
            kind: if pick(0, 2) == 0 {
                PoolKind::Max
            } else {
                PoolKind::Mean
            },
            kernel: list(1),
            stride: list(2),
            padding: pairs(3),
        }),
        K::Custom => Op::Custom(CustomFn {
            name: s.to_string(),
            body: Box::new(body.clone()),
            vjp: (pick(0, 2) == 0).then(|| Box::new(body.clone())),
            jvp: (pick(1, 2) == 0).then(|| Box::new(body.clone())),
        }),
        K::DequantMatMul => Op::DequantMatMul {
            scheme: schemes[pick(0, schemes.len())],
        },
        K::DequantizeRows => Op::DequantizeRows {
            scheme: schemes[pick(0, schemes.len())],
        },
        K::Defined(name) => {
            let examples = (rlx_ir::ops::registration(name)
                .expect("registered")
                .examples)();
            Op::Defined(examples[pick(0, examples.len())].clone())
        }
        K::CachedAttention => Op::CachedAttention {
            scale: x,
            window: opt(0),
        },
        K::PagedAttention => Op::PagedAttention {
            scale: x,
            window: opt(0),
            block: pick(1, 64) + 1,
        },
        K::Fused => Op::Fused(FusedRegion {
            kind: FusionKind::ALL[pick(0, FusionKind::ALL.len())],
            body: Box::new(body.clone()),
            output: pick(1, body.outputs().len()),
            region: None,
        }),
    }
}

fn shape_of(v: &[usize], names: &[String]) -> Shape {
    let dims = v
        .iter()
        .skip(1)
        .take(v[0] % 5)
        .enumerate()
        .map(|(i, &d)| {
            if d % 7 == 0 {
                Dim::Dynamic(names[i % names.len()].clone())
            } else {
                Dim::Static(d)
            }
        })
        .collect();
    Shape::with_dims(dims, DType::ALL[v[0] % DType::ALL.len()])
}

fn float() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<f32>(),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(-0.0f32),
        Just(1e-5f32),
        Just(1e-45f32)
    ]
}

/// A graph over random op kinds with random operands, names and shapes (not meant to verify).
fn graph() -> impl Strategy<Value = Graph> {
    let text = || prop::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter);
    let node = (
        0..OpKind::all().len(),
        prop::collection::vec(0usize..100_000, 4..10),
        float(),
        text(),
        prop::collection::vec(any::<u16>(), 0..4),
    );
    let dims = prop::collection::vec("[a-z_][a-z0-9_]{0,6}", 1..3);
    (
        prop::collection::vec(node, 1..12),
        dims,
        text(),
        prop::collection::vec(any::<u16>(), 0..4),
    )
        .prop_map(|(nodes, names, gname, outs)| {
            let mut body = Graph::new("body");
            let a = body.input("a", Shape::new(&[2], DType::F32));
            let e = body.op(Op::Activation(Activation::Exp), &[a]);
            body.set_outputs(vec![e, a]);
            let mut g = Graph::new(&gname);
            for (i, (k, v, x, s, ins)) in nodes.iter().enumerate() {
                let op = op_of(OpKind::all()[*k], v, *x, &format!("{s}{i}"), &body);
                let inputs = if op.is_leaf() || i == 0 {
                    Vec::new()
                } else {
                    ins.iter().map(|&j| NodeId(j as u32 % i as u32)).collect()
                };
                g.push_unchecked(op, inputs, shape_of(v, &names));
            }
            let n = g.len() as u32;
            g.set_outputs_unchecked(outs.iter().map(|&o| NodeId(o as u32 % n)).collect());
            g
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// print → parse → print gives the same text, and (NaN attributes aside, which are never
    /// equal to themselves) the same graph.
    #[test]
    fn random_graphs_round_trip(g in graph()) {
        let text = g.to_string();
        let back = Graph::parse_unverified(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(back.to_string(), text.clone());
        if !text.contains("NaN") {
            prop_assert_eq!(back, g);
        }
    }

    /// Arbitrary text never panics the parser.
    #[test]
    fn arbitrary_text_gives_an_error_not_a_panic(s in "\\PC{0,200}") {
        let _ = Graph::parse(&s);
    }

    /// A printed graph cut anywhere (on a character boundary) gives an error, not a panic.
    #[test]
    fn truncated_text_gives_an_error(g in graph(), cut in 0usize..10_000) {
        let text = g.to_string();
        let at = (0..=cut.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        let _ = Graph::parse_unverified(&text[..at]);
    }
}

fn parse_err(text: &str) -> String {
    Graph::parse(text).expect_err("must not parse").to_string()
}

#[test]
fn a_hand_written_graph_parses_and_verifies() {
    let text = r#"
        ; comments run to the end of the line
        graph "mlp" {
          %x = input {name = "x"} : f32[2, 3]
          %w = param {name = "w"} : f32[3, 4]
          %y = matmul %x, %w : f32[2, 4]
          %s = reduce %y {kind = sum, axes = [1], keepdims = false} : f32[2]
          return %s
        }"#;
    let g = Graph::parse(text).expect("parses");
    assert_eq!(g.len(), 4);
    assert_eq!(g.to_string(), "graph \"mlp\" {\n  %0 = input {name = \"x\"} : f32[2, 3]\n  %1 = param {name = \"w\"} : f32[3, 4]\n  %2 = matmul %0, %1 : f32[2, 4]\n  %3 = reduce %2 {kind = sum, axes = [1], keepdims = false} : f32[2]\n  return %3\n}");
}

#[test]
fn errors_say_where_and_what() {
    let e = parse_err("graph \"g\" {\n  %0 = input {name = \"x\"} : f32[2]\n  %1 = frobnicate %0 : f32[2]\n  return %1\n}");
    assert!(
        e.contains("line 3") && e.contains("unknown op `frobnicate`"),
        "{e}"
    );
    let e = parse_err("graph \"g\" {\n  %0 = input {name = \"x\"} : f32[2]\n  %1 = exp %9 : f32[2]\n  return %1\n}");
    assert!(e.contains("%9 is not defined"), "{e}");
    let e = parse_err("graph \"g\" {\n  %0 = input {name = \"x\"} : f32[2]\n  %1 = softmax %0 {axis = 0, bogus = 1} : f32[2]\n  return %1\n}");
    assert!(
        e.contains("softmax") && e.contains("unknown attribute `bogus`"),
        "{e}"
    );
    let e = parse_err("graph \"g\" {\n  %0 = input {name = \"x\"} : f32[2]\n  %1 = softmax %0 : f32[2]\n  return %1\n}");
    assert!(e.contains("missing attribute `axis`"), "{e}");
    let e = parse_err("graph \"g\" {\n  %0 = input {name = \"x\"} : f32[2]\n  %1 = softmax %0 {axis = true} : f32[2]\n  return %1\n}");
    assert!(e.contains("attribute `axis` must be an integer"), "{e}");
    // Reads, but the verifier finds the stored shape wrong.
    let e = parse_err("graph \"g\" {\n  %0 = input {name = \"x\"} : f32[2]\n  %1 = exp %0 : f32[3]\n  return %1\n}");
    assert!(
        e.contains("stored shape f32[3] but operands give f32[2]"),
        "{e}"
    );
    let e = parse_err("graph \"g\" {\n  %0 = input {name = \"x\"} : f33[2]\n  return %0\n}");
    assert!(e.contains("`f33` is not a dtype"), "{e}");
}
