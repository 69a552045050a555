//! Every user-facing error: the `try_` forms return the documented [`Error`] variant, its message
//! names what a user needs to fix the call (op, shapes, names, expected vs actual), and the
//! short forms panic with exactly that message.

use rlx::prelude::*;
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn f32s(dims: &[usize]) -> Shape {
    Shape::new(dims, DType::F32)
}

/// The `Error::Op` fields, or a failure naming what came instead.
fn op_err(r: Result<NodeId>) -> (String, Option<NodeId>, String, String) {
    match r {
        Err(e @ Error::Op { .. }) => {
            let text = e.to_string();
            let Error::Op { op, node, msg } = e else {
                unreachable!()
            };
            (op, node, msg, text)
        }
        Err(e) => panic!("expected Error::Op, got {e:?}"),
        Ok(id) => panic!("expected Error::Op, got node {id}"),
    }
}

fn assert_mentions(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "message {text:?} does not mention {p:?}");
    }
}

/// The panic message of `f`, which must panic.
fn panic_message(f: impl FnOnce()) -> String {
    let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("the short form should panic");
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else {
        panic!("panic payload is neither String nor &str")
    }
}

// ---------------------------------------------------------------- builder errors

#[test]
fn matmul_inner_dimensions_differ() {
    let mut g = Graph::new("g");
    let a = g.input("a", f32s(&[2, 3]));
    let b = g.input("b", f32s(&[4, 5]));
    let (op, node, _, text) = op_err(g.try_dot(a, b));
    assert_eq!(op, "matmul");
    assert_eq!(node, None);
    assert!(text.starts_with("matmul: "), "{text}");
    assert_mentions(
        &text,
        &[
            "inner dimensions",
            "f32[2, 3]",
            "f32[4, 5]",
            "k = 3",
            "k = 4",
        ],
    );
    // try_matmul reports the same problem before looking at the expected shape.
    let (op2, _, _, text2) = op_err(g.try_matmul(a, b, f32s(&[2, 5])));
    assert_eq!(op2, "matmul");
    assert_eq!(text2, text);
    assert_eq!(g.len(), 2, "a failed builder call must not add nodes");
}

#[test]
fn matmul_with_wrong_expected_shape() {
    let mut g = Graph::new("g");
    let a = g.input("a", f32s(&[2, 3]));
    let b = g.input("b", f32s(&[3, 4]));
    let (op, _, _, text) = op_err(g.try_matmul(a, b, f32s(&[2, 5])));
    assert_eq!(op, "matmul");
    assert_mentions(
        &text,
        &[
            "expected",
            "f32[2, 5]",
            "f32[2, 3]",
            "f32[3, 4]",
            "f32[2, 4]",
        ],
    );
    assert_eq!(g.len(), 2, "the rejected matmul node must be removed again");
    // And the right expectation works.
    let y = g.try_matmul(a, b, f32s(&[2, 4])).expect("matching shape");
    assert_eq!(*g.shape(y), f32s(&[2, 4]));
    // Dtype is part of the expected shape.
    let (_, _, _, text) = op_err(g.try_matmul(a, b, Shape::new(&[2, 4], DType::F16)));
    assert_mentions(&text, &["f16[2, 4]", "f32[2, 4]"]);
}

#[test]
fn add_of_shapes_that_do_not_broadcast() {
    let mut g = Graph::new("g");
    let a = g.input("a", f32s(&[2, 3]));
    let b = g.input("b", f32s(&[4, 3]));
    let (op, _, _, text) = op_err(g.try_add(a, b));
    assert_eq!(op, "add");
    assert_mentions(&text, &["add", "broadcast", "f32[2, 3]", "f32[4, 3]"]);
    let (op, _, _, text) = op_err(g.try_mul(b, a));
    assert_eq!(op, "mul");
    assert_mentions(&text, &["f32[4, 3]", "f32[2, 3]"]);
}

#[test]
fn add_with_different_dtypes() {
    let mut g = Graph::new("g");
    let a = g.input("a", f32s(&[2]));
    let b = g.input("b", Shape::new(&[2], DType::I32));
    let (op, _, _, text) = op_err(g.try_add(a, b));
    assert_eq!(op, "add");
    assert_mentions(&text, &["dtype", "f32[2]", "i32[2]", "cast"]);
}

#[test]
fn reduce_axis_out_of_range() {
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[2, 3]));
    let (op, _, _, text) = op_err(g.try_sum(x, &[0, 2], false));
    assert_eq!(op, "reduce");
    assert_mentions(&text, &["axis 2", "f32[2, 3]", "rank 2"]);
    let (_, _, _, text) = op_err(g.try_sum(x, &[1, 0], false));
    assert_mentions(&text, &["[1, 0]", "sorted"]);
}

#[test]
fn transpose_with_a_non_permutation() {
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[2, 3, 4]));
    for perm in [
        &[0, 0, 1][..],
        &[0, 1][..],
        &[0, 1, 3][..],
        &[2, 1, 0, 3][..],
    ] {
        let (op, _, _, text) = op_err(g.try_transpose(x, perm));
        assert_eq!(op, "transpose");
        assert_mentions(
            &text,
            &[&format!("{perm:?}"), "permutation", "f32[2, 3, 4]"],
        );
    }
}

#[test]
fn reshape_with_wrong_element_count() {
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[2, 3]));
    let (op, _, _, text) = op_err(g.try_reshape(x, &[4, 2]));
    assert_eq!(op, "reshape");
    assert_mentions(&text, &["f32[2, 3]", "6 elements", "[4, 2]", "8 elements"]);
}

#[test]
fn reshape_whose_element_count_overflows_is_an_error_not_a_panic() {
    let big = 1usize << 40;
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[4, 4]));
    let r = catch_unwind(AssertUnwindSafe(|| g.try_reshape(x, &[big, big, 16])));
    let r = r.expect("try_reshape must not panic");
    let (op, _, _, text) = op_err(r);
    assert_eq!(op, "reshape");
    assert_mentions(&text, &["f32[4, 4]", &format!("{big}")]);

    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[big, big]));
    let r = catch_unwind(AssertUnwindSafe(|| g.try_reshape(x, &[1])))
        .expect("try_reshape must not panic");
    let (op, _, _, _) = op_err(r);
    assert_eq!(op, "reshape");
}

#[test]
fn narrow_out_of_bounds() {
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[2, 4]));
    let (op, _, _, text) = op_err(g.try_narrow(x, 1, 2, 3));
    assert_eq!(op, "narrow");
    assert_mentions(&text, &["2..5", "axis 1", "f32[2, 4]", "size 4"]);
    // start + len overflowing usize is reported, not a panic.
    let (op, _, _, text) = op_err(g.try_narrow(x, 1, usize::MAX, 2));
    assert_eq!(op, "narrow");
    assert_mentions(&text, &["out of bounds", "f32[2, 4]"]);
    let (_, _, _, text) = op_err(g.try_narrow(x, 2, 0, 1));
    assert_mentions(&text, &["axis 2", "out of range"]);
}

#[test]
fn concat_of_mismatched_operands() {
    let mut g = Graph::new("g");
    let a = g.input("a", f32s(&[2, 3]));
    let b = g.input("b", f32s(&[3, 3]));
    let c = g.input("c", Shape::new(&[2, 1], DType::F16));
    let (op, _, _, text) = op_err(g.try_concat(&[a, b], 1));
    assert_eq!(op, "concat");
    assert_mentions(&text, &["operand 1", "f32[3, 3]", "f32[2, 3]", "axis 1"]);
    // Same dims outside the axis but another dtype.
    let (_, _, _, text) = op_err(g.try_concat(&[a, c], 1));
    assert_mentions(&text, &["operand 1", "f16[2, 1]", "f32[2, 3]"]);
    // Along axis 0 the first two do match.
    let y = g.try_concat(&[a, b], 0).expect("axis 0 is fine");
    assert_eq!(*g.shape(y), f32s(&[5, 3]));
    let (_, _, _, text) = op_err(g.try_concat(&[], 0));
    assert_mentions(&text, &["concat", "at least 1 operand", "got 0"]);
    assert!(!text.contains(&usize::MAX.to_string()), "{text}");
}

#[test]
fn gather_with_float_indices() {
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[5, 3]));
    let i = g.input("i", f32s(&[2]));
    let (op, _, _, text) = op_err(g.try_gather(x, i, 0));
    assert_eq!(op, "gather");
    assert_mentions(&text, &["indices", "integer", "f32[2]"]);
}

#[test]
fn attention_with_bad_head_counts() {
    let mut g = Graph::new("g");
    // 3 query heads cannot be grouped over 2 key/value heads.
    let q = g.input("q", f32s(&[1, 3, 4, 8]));
    let k = g.input("k", f32s(&[1, 2, 4, 8]));
    let v = g.input("v", f32s(&[1, 2, 4, 8]));
    let (op, _, _, text) = op_err(g.try_attention(q, k, v, MaskKind::Causal, 0.35));
    assert_eq!(op, "attention");
    assert_mentions(&text, &["f32[1, 3, 4, 8]", "f32[1, 2, 4, 8]", "heads"]);
    // A multiple is fine (grouped-query attention).
    let q2 = g.input("q2", f32s(&[1, 4, 4, 8]));
    let y = g
        .try_attention(q2, k, v, MaskKind::Causal, 0.35)
        .expect("4 heads over 2");
    assert_eq!(*g.shape(y), f32s(&[1, 4, 4, 8]));
}

#[test]
fn conv_with_kernel_bigger_than_padded_input() {
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[1, 2, 4]));
    let w = g.param("w", f32s(&[3, 2, 7]));
    let attrs = ConvAttrs {
        stride: vec![1],
        padding: vec![(1, 1)],
        dilation: vec![1],
        groups: 1,
    };
    let (op, _, _, text) = op_err(g.try_conv(x, w, attrs.clone()));
    assert_eq!(op, "conv");
    assert_mentions(&text, &["kernel [7]", "f32[1, 2, 4]", "spatial axis 0"]);
    // With padding 2 on the right the window fits exactly once (4 + 1 + 2 = 7).
    let fits = ConvAttrs {
        padding: vec![(1, 2)],
        ..attrs
    };
    let y = g
        .try_conv(x, w, fits)
        .expect("kernel fits the padded input");
    assert_eq!(*g.shape(y), f32s(&[1, 3, 1]));
}

#[test]
fn conv_and_pool_with_absurd_attributes_are_errors_not_panics() {
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[1, 2, 4]));
    let w = g.param("w", f32s(&[3, 2, 3]));
    let huge_pad = ConvAttrs {
        stride: vec![1],
        padding: vec![(usize::MAX, 1)],
        dilation: vec![1],
        groups: 1,
    };
    let r = catch_unwind(AssertUnwindSafe(|| g.try_conv(x, w, huge_pad)))
        .expect("try_conv must not panic");
    let (op, _, _, text) = op_err(r);
    assert_eq!(op, "conv");
    assert_mentions(&text, &["f32[1, 2, 4]"]);

    // groups * (C / groups) overflowing must not wrap around to C.
    let x0 = g.input("x0", f32s(&[1, 0, 4]));
    let w0 = g.param("w0", f32s(&[0, 2, 3]));
    let groups = usize::MAX / 2 + 1;
    let attrs = ConvAttrs {
        stride: vec![1],
        padding: vec![(0, 0)],
        dilation: vec![1],
        groups,
    };
    let r = catch_unwind(AssertUnwindSafe(|| g.try_conv(x0, w0, attrs)))
        .expect("try_conv must not panic");
    let (op, _, _, text) = op_err(r);
    assert_eq!(op, "conv");
    assert_mentions(&text, &["f32[0, 2, 3]", "f32[1, 0, 4]", "groups"]);

    let pool = PoolAttrs {
        kind: PoolKind::Max,
        kernel: vec![usize::MAX],
        stride: vec![1],
        padding: vec![(usize::MAX - 1, 5)],
    };
    let r =
        catch_unwind(AssertUnwindSafe(|| g.try_pool(x, pool))).expect("try_pool must not panic");
    let (op, _, _, text) = op_err(r);
    assert_eq!(op, "pool");
    assert_mentions(&text, &["f32[1, 2, 4]"]);
}

#[test]
fn non_finite_float_attributes() {
    // JSON has no NaN or infinity: a graph holding one would serialize but never read back.
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[1, 2, 4, 8]));
    let gamma = g.param("gamma", f32s(&[8]));
    let beta = g.param("beta", f32s(&[8]));
    let pos = g.input("pos", Shape::new(&[4], DType::I32));
    let cases: Vec<(&str, &str, Result<NodeId>)> = vec![
        (
            "layer_norm",
            "eps",
            g.try_layer_norm(x, gamma, beta, f32::NAN),
        ),
        ("rms_norm", "eps", g.try_rms_norm(x, gamma, f32::INFINITY)),
        (
            "attention",
            "scale",
            g.try_attention(x, x, x, MaskKind::None, f32::NEG_INFINITY),
        ),
        ("rope", "theta", g.try_rope(x, pos, f32::NAN, false)),
    ];
    for (want_op, attr, r) in cases {
        let (op, _, _, text) = op_err(r);
        assert_eq!(op, want_op);
        assert_mentions(&text, &[attr, "finite"]);
    }
    assert_eq!(g.len(), 4);
    // Finite values are fine and survive JSON.
    let y = g.try_layer_norm(x, gamma, beta, 1e-5).expect("finite eps");
    let z = g
        .try_attention(y, x, x, MaskKind::None, 0.125)
        .expect("finite scale");
    g.set_outputs(vec![z]);
    assert_eq!(Graph::from_json(&g.to_json()).expect("round trip"), g);
}

#[test]
fn operand_that_is_not_a_node_of_the_graph() {
    let mut g = Graph::new("small");
    let x = g.input("x", f32s(&[2]));
    let mut other = Graph::new("other");
    for i in 0..5 {
        other.input(&format!("i{i}"), f32s(&[2]));
    }
    let foreign = other.input("far", f32s(&[2]));
    let (op, _, _, text) = op_err(g.try_add(x, foreign));
    assert_eq!(op, "add");
    assert_mentions(&text, &["%5", "not a node", "\"small\"", "1 nodes"]);
    let (op, _, _, _) = op_err(g.try_activation(Activation::Exp, NodeId(77)));
    assert_eq!(op, "exp");
}

#[test]
fn duplicate_input_or_param_name() {
    let mut g = Graph::new("g");
    g.input("x", f32s(&[2]));
    let (op, _, _, text) = op_err(g.try_input("x", f32s(&[3])));
    assert_eq!(op, "input");
    assert_mentions(&text, &["\"x\"", "already used"]);
    let (op, _, _, text) = op_err(g.try_param("x", f32s(&[3])));
    assert_eq!(op, "param");
    assert_mentions(&text, &["\"x\"", "already used"]);
    assert_eq!(g.len(), 1);
}

#[test]
fn scalar_that_does_not_fit_its_dtype() {
    let mut g = Graph::new("g");
    for (v, dt) in [(1.5, DType::I32), (300.0, DType::U8), (-1.0, DType::U32)] {
        let (op, _, _, text) = op_err(g.try_scalar(v, dt));
        assert_eq!(op, "constant");
        assert_mentions(&text, &[&v.to_string(), dt.name()]);
    }
    assert!(g.is_empty());
    let (op, _, _, text) = op_err(g.try_constant_f32(&[2, 2], &[1.0, 2.0, 3.0]));
    assert_eq!(op, "constant");
    assert_mentions(&text, &["f32[2, 2]"]);
}

#[test]
fn set_outputs_with_a_node_not_in_the_graph() {
    let mut g = Graph::new("g");
    let x = g.input("x", f32s(&[2]));
    let y = g.add(x, x);
    let err = g
        .try_set_outputs(vec![y, NodeId(9)])
        .expect_err("%9 does not exist");
    assert_eq!(
        err,
        Error::BadOutput {
            node: NodeId(9),
            nodes: 2
        }
    );
    assert_mentions(&err.to_string(), &["%9", "2 nodes"]);
    assert!(
        g.outputs().is_empty(),
        "a rejected output list must not be stored"
    );
    g.try_set_outputs(vec![y]).expect("valid output");
    assert_eq!(g.outputs(), &[y]);
}

// ---------------------------------------------------------------- compiling

fn doubler() -> Graph {
    let mut g = Graph::new("doubler");
    let x = g.input("x", f32s(&[3]));
    let y = g.add(x, x);
    g.set_outputs(vec![y]);
    g
}

#[test]
fn compiling_a_graph_without_outputs() {
    let mut g = Graph::new("no_outputs");
    let x = g.input("x", f32s(&[3]));
    g.add(x, x);
    let err = Session::new(Device::Cpu)
        .try_compile(g)
        .err()
        .expect("no outputs");
    assert!(matches!(err, Error::Invalid(_)), "{err:?}");
    assert_mentions(
        &err.to_string(),
        &["\"no_outputs\"", "no outputs", "set_outputs"],
    );
}

#[test]
fn compiling_for_an_unavailable_device() {
    let err = Session::new(Device::Metal)
        .try_compile(doubler())
        .err()
        .expect("no Metal backend");
    match &err {
        Error::DeviceUnavailable { device, hint } => {
            assert_eq!(device, "Metal");
            assert!(hint.contains("`metal`"), "{hint}");
        }
        e => panic!("expected DeviceUnavailable, got {e:?}"),
    }
    assert_mentions(
        &err.to_string(),
        &["Metal", "not available", "`metal` feature", "Device::Cpu"],
    );
}

#[test]
fn device_availability() {
    assert!(Device::Cpu.is_available());
    assert!(!Device::Metal.is_available());
    // Every device without a backend says so when compiling, naming its feature.
    for d in Device::ALL {
        if d.is_available() {
            continue;
        }
        let err = Session::new(d)
            .try_compile(doubler())
            .err()
            .unwrap_or_else(|| panic!("{d} compiled"));
        assert!(
            matches!(err, Error::DeviceUnavailable { .. }),
            "{d}: {err:?}"
        );
        // Built in but without an adapter (DirectX on Linux) or a CUDA driver: the error names
        // the device and what is missing; not built in: the feature that builds it.
        let want = if d == Device::Cuda {
            "CUDA".to_string()
        } else if d.is_built_in() {
            "adapter".to_string()
        } else {
            format!("`{}` feature", d.feature())
        };
        assert_mentions(&err.to_string(), &[&d.to_string(), &want]);
    }
}

#[test]
fn compiling_symbolic_dimensions_for_the_cpu() {
    let mut g = Graph::new("dynamic");
    let x = g.input(
        "x",
        Shape::with_dims(vec![Dim::Dynamic("seq".into()), Dim::Static(4)], DType::F32),
    );
    let y = g.add(x, x);
    g.set_outputs(vec![y]);
    let err = Session::new(Device::Cpu)
        .try_compile(g)
        .err()
        .expect("symbolic dims");
    match &err {
        Error::Unsupported {
            backend, op, node, ..
        } => {
            assert_eq!(
                (backend.as_str(), op.as_str(), *node),
                ("cpu", "input", NodeId(0))
            );
        }
        e => panic!("expected Unsupported, got {e:?}"),
    }
    assert_mentions(
        &err.to_string(),
        &["cpu", "input", "%0", "f32[?seq, 4]", "symbolic", "bind"],
    );
}

#[test]
fn compiling_complex_values_for_the_cpu() {
    // c64 values pass through; an op with no complex form is refused by name.
    let mut g = Graph::new("complex");
    let x = g.input("x", Shape::new(&[2], DType::C64));
    g.set_outputs(vec![x]);
    let mut c = Session::new(Device::Cpu)
        .try_compile(g)
        .expect("c64 in and out");
    let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let out = c.try_run_typed(&[("x", &bytes, DType::C64)]).unwrap();
    assert_eq!(out[0], (bytes, DType::C64));

    let mut g = Graph::new("complex");
    let x = g.input("x", Shape::new(&[2, 3], DType::C64));
    let (y, _) = g.try_topk(x, 1).expect("top_k infers any dtype");
    g.set_outputs(vec![y]);
    let err = Session::new(Device::Cpu)
        .try_compile(g)
        .err()
        .expect("no complex top_k");
    assert_mentions(&err.to_string(), &["topk", "%1", "complex", "c64[2, 3]"]);
}

#[test]
fn bool_constant_with_a_byte_other_than_0_or_1() {
    let mut g = Graph::new("g");
    let (op, _, _, text) =
        op_err(g.try_constant_bytes(Shape::new(&[3], DType::Bool), vec![1, 0, 2]));
    assert_eq!(op, "constant");
    assert_mentions(&text, &["bool[3]", "byte 2", "index 2"]);
    let ok = g
        .try_constant_bytes(Shape::new(&[3], DType::Bool), vec![1, 0, 1])
        .expect("valid bools");
    g.set_outputs(vec![ok]);
    // The same check when reading JSON.
    let mut v: Value = serde_json::from_str(&g.to_json()).unwrap();
    // Constant bytes are a hex string in JSON.
    let data = &mut v["nodes"][0]["op"]["Constant"]["data"];
    let mut bytes = rlx::ir::hex::decode(data.as_str().expect("hex bytes")).unwrap();
    bytes[1] = 7;
    *data = serde_json::json!(rlx::ir::hex::encode(&bytes));
    assert_mentions(
        &verify_errors(from_value(&v)).join("\n"),
        &["%0", "constant", "byte 7", "index 1"],
    );
}

// ---------------------------------------------------------------- params and inputs

/// `y = x @ w + b` with `x: f32[1, 2]`, `w: f32[2, 2]`, `b: f32[2]`, and an i32 input `n: i32[3]`
/// passed through `n + k` with `k: i32[3]`.
fn compiled() -> CompiledGraph {
    let mut g = Graph::new("affine");
    let x = g.input("x", f32s(&[1, 2]));
    let w = g.param("w", f32s(&[2, 2]));
    let b = g.param("b", f32s(&[2]));
    let n = g.input("n", Shape::new(&[3], DType::I32));
    let k = g.param("k", Shape::new(&[3], DType::I32));
    let xw = g.matmul(x, w, f32s(&[1, 2]));
    let y = g.add(xw, b);
    let m = g.add(n, k);
    g.set_outputs(vec![y, m]);
    Session::new(Device::Cpu).compile(g)
}

#[test]
fn set_param_with_wrong_length() {
    let mut c = compiled();
    let err = c
        .try_set_param("w", &[1.0, 2.0, 3.0])
        .expect_err("w has 4 elements");
    assert_eq!(
        err,
        Error::Length {
            kind: "param",
            name: "w".into(),
            shape: "f32[2, 2]".into(),
            expected: 4,
            actual: 3
        }
    );
    assert_mentions(
        &err.to_string(),
        &["param", "\"w\"", "f32[2, 2]", "4 elements", "3 elements"],
    );
}

#[test]
fn set_param_with_unknown_name() {
    let mut c = compiled();
    let err = c
        .try_set_param("weights", &[1.0])
        .expect_err("no such param");
    match &err {
        Error::UnknownName { kind, name, known } => {
            assert_eq!(*kind, "param");
            assert_eq!(name, "weights");
            assert_eq!(known, &["w", "b", "k"]);
        }
        e => panic!("expected UnknownName, got {e:?}"),
    }
    assert_mentions(
        &err.to_string(),
        &["unknown param", "\"weights\"", "\"w\"", "\"b\"", "\"k\""],
    );
    // An input's name is not a param's.
    let err = c
        .try_set_param("x", &[1.0, 2.0])
        .expect_err("x is an input");
    assert!(
        matches!(err, Error::UnknownName { kind: "param", .. }),
        "{err:?}"
    );
    let err = c.try_get_param("x").expect_err("x is an input");
    assert!(
        matches!(err, Error::UnknownName { kind: "param", .. }),
        "{err:?}"
    );
}

#[test]
fn run_with_unknown_input_name() {
    let mut c = compiled();
    let err = c
        .try_run(&[("x", &[1.0, 2.0]), ("n", &[1.0, 2.0, 3.0]), ("z", &[0.0])])
        .expect_err("z is not an input");
    match &err {
        Error::UnknownName { kind, name, known } => {
            assert_eq!(*kind, "input");
            assert_eq!(name, "z");
            assert_eq!(known, &["x", "n"]);
        }
        e => panic!("expected UnknownName, got {e:?}"),
    }
    assert_mentions(
        &err.to_string(),
        &["unknown input", "\"z\"", "\"x\"", "\"n\""],
    );
    // A param's name is not an input's.
    let err = c
        .try_run(&[
            ("x", &[1.0, 2.0]),
            ("n", &[1.0, 2.0, 3.0]),
            ("w", &[0.0; 4]),
        ])
        .expect_err("w is a param");
    assert!(
        matches!(err, Error::UnknownName { kind: "input", .. }),
        "{err:?}"
    );
}

#[test]
fn run_with_a_missing_input() {
    let mut c = compiled();
    let err = c.try_run(&[("x", &[1.0, 2.0])]).expect_err("n is missing");
    assert_eq!(err, Error::MissingInput { name: "n".into() });
    assert_mentions(&err.to_string(), &["missing input", "\"n\""]);
    let err = c.try_run_typed(&[]).expect_err("both missing");
    assert_eq!(err, Error::MissingInput { name: "x".into() });
}

#[test]
fn run_with_wrong_input_length() {
    let mut c = compiled();
    let err = c
        .try_run(&[("x", &[1.0, 2.0, 3.0]), ("n", &[1.0, 2.0, 3.0])])
        .expect_err("x has 2 elements");
    assert_eq!(
        err,
        Error::Length {
            kind: "input",
            name: "x".into(),
            shape: "f32[1, 2]".into(),
            expected: 2,
            actual: 3
        }
    );
    assert_mentions(
        &err.to_string(),
        &["input \"x\"", "f32[1, 2]", "2 elements", "3 elements"],
    );
}

#[test]
fn run_typed_with_a_byte_count_that_is_not_whole_elements() {
    let mut c = compiled();
    let x = [0u8; 8];
    // n is i32[3] = 12 bytes; 13 bytes are 3.25 elements and must not be reported as "3 given".
    let n = [0u8; 13];
    let err = c
        .try_run_typed(&[("x", &x, DType::F32), ("n", &n, DType::I32)])
        .expect_err("13 bytes");
    let text = err.to_string();
    assert_mentions(&text, &["\"n\"", "13 bytes"]);
    if let Error::Length {
        expected, actual, ..
    } = err
    {
        assert_ne!(expected, actual, "the message contradicts itself: {text}");
    }
}

#[test]
fn input_given_twice() {
    let mut c = compiled();
    let err = c
        .try_run(&[
            ("x", &[1.0, 2.0]),
            ("n", &[1.0, 2.0, 3.0]),
            ("x", &[3.0, 4.0]),
        ])
        .expect_err("x twice");
    assert!(matches!(err, Error::Invalid(_)), "{err:?}");
    assert_mentions(&err.to_string(), &["\"x\"", "more than once"]);
}

#[test]
fn set_param_typed_with_wrong_dtype() {
    let mut c = compiled();
    let bytes = [0u8; 8]; // 4 x f16
    let err = c
        .try_set_param_typed("w", &bytes, DType::F16)
        .expect_err("w is f32");
    match &err {
        Error::DType {
            kind,
            name,
            expected,
            actual,
            ..
        } => {
            assert_eq!(
                (*kind, name.as_str(), *expected, *actual),
                ("param", "w", DType::F32, DType::F16)
            );
        }
        e => panic!("expected DType, got {e:?}"),
    }
    assert_mentions(
        &err.to_string(),
        &["param \"w\"", "declared f32", "got f16"],
    );
    // Right dtype, wrong length.
    let err = c
        .try_set_param_typed("k", &[0u8; 8], DType::I32)
        .expect_err("k has 3 elements");
    assert!(
        matches!(
            err,
            Error::Length {
                kind: "param",
                expected: 3,
                actual: 2,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn fractional_f32_for_an_int_input() {
    let mut c = compiled();
    let err = c
        .try_run(&[("x", &[1.0, 2.0]), ("n", &[1.0, 1.5, 3.0])])
        .expect_err("1.5 is not an i32");
    match &err {
        Error::DType {
            kind,
            name,
            expected,
            actual,
            msg,
        } => {
            assert_eq!(
                (*kind, name.as_str(), *expected, *actual),
                ("input", "n", DType::I32, DType::F32)
            );
            assert_mentions(msg, &["1.5", "index 1"]);
        }
        e => panic!("expected DType, got {e:?}"),
    }
    assert_mentions(
        &err.to_string(),
        &["input \"n\"", "i32", "1.5", "index 1", "run_typed"],
    );
    // Out of range for i32 is rejected the same way; exact integers work.
    let err = c
        .try_run(&[("x", &[1.0, 2.0]), ("n", &[1.0, 2.0, 1e10])])
        .expect_err("1e10 overflows i32");
    assert!(matches!(err, Error::DType { .. }), "{err:?}");
    assert_mentions(&err.to_string(), &["index 2"]);
    let err = c
        .try_set_param("k", &[0.0, 0.25, 0.0])
        .expect_err("0.25 is not an i32");
    assert!(
        matches!(
            &err,
            Error::DType {
                kind: "param",
                expected: DType::I32,
                ..
            }
        ),
        "{err:?}"
    );
    assert_mentions(&err.to_string(), &["param \"k\"", "index 1"]);
}

// ---------------------------------------------------------------- short forms panic alike

#[test]
fn short_forms_panic_with_the_try_message() {
    let mut g = Graph::new("g");
    let a = g.input("a", f32s(&[2, 3]));
    let b = g.input("b", f32s(&[4, 5]));
    let want = g.try_matmul(a, b, f32s(&[2, 5])).unwrap_err().to_string();
    let got = panic_message(|| {
        g.matmul(a, b, f32s(&[2, 5]));
    });
    assert_eq!(got, want);

    let want = g.try_reshape(a, &[7]).unwrap_err().to_string();
    assert_eq!(
        panic_message(|| {
            g.reshape(a, &[7]);
        }),
        want
    );
    let want = g.try_set_outputs(vec![NodeId(40)]).unwrap_err().to_string();
    assert_eq!(panic_message(|| g.set_outputs(vec![NodeId(40)])), want);

    let mut c = compiled();
    let want = c.try_set_param("w", &[1.0]).unwrap_err().to_string();
    assert_eq!(panic_message(|| c.set_param("w", &[1.0])), want);
    let want = c.try_run(&[("x", &[1.0, 2.0])]).unwrap_err().to_string();
    assert_eq!(
        panic_message(|| {
            c.run(&[("x", &[1.0, 2.0])]);
        }),
        want
    );
    let want = c
        .try_set_param_typed("w", &[0; 8], DType::F16)
        .unwrap_err()
        .to_string();
    assert_eq!(
        panic_message(|| c.set_param_typed("w", &[0; 8], DType::F16)),
        want
    );

    let want = Session::new(Device::Cuda)
        .try_compile(doubler())
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        panic_message(|| {
            Session::new(Device::Cuda).compile(doubler());
        }),
        want
    );
}

// ---------------------------------------------------------------- reading serialized graphs

fn sample_json() -> (Graph, Value) {
    let mut g = Graph::new("sample");
    let x = g.input("x", f32s(&[2, 3]));
    let w = g.param("w", f32s(&[3, 4]));
    let y = g.matmul(x, w, f32s(&[2, 4]));
    let z = g.activation(Activation::Relu, y);
    let s = g.sum(z, &[1], false);
    g.set_outputs(vec![s]);
    let v: Value = serde_json::from_str(&g.to_json()).expect("to_json is JSON");
    (g, v)
}

fn from_value(v: &Value) -> Result<Graph> {
    let text = serde_json::to_string(v).unwrap();
    catch_unwind(|| Graph::from_json(&text)).expect("from_json must not panic")
}

fn verify_errors(r: Result<Graph>) -> Vec<String> {
    match r {
        Err(Error::Verify(errs)) => {
            assert!(!errs.is_empty());
            errs
        }
        Err(e) => panic!("expected Error::Verify, got {e:?}"),
        Ok(g) => panic!("expected Error::Verify, got a graph:\n{g}"),
    }
}

#[test]
fn from_json_on_garbage() {
    for text in ["", "hello", "{", "[1, 2, 3]", "{\"name\": 3}", "null"] {
        match catch_unwind(|| Graph::from_json(text)).expect("from_json must not panic") {
            Err(e @ Error::Parse(_)) => {
                assert!(e.to_string().starts_with("cannot parse RLX IR"), "{e}")
            }
            other => panic!("{text:?}: expected Error::Parse, got {other:?}"),
        }
    }
}

#[test]
fn from_json_on_truncated_json() {
    let (g, _) = sample_json();
    let text = g.to_json();
    assert_eq!(Graph::from_json(&text).expect("round trip"), g);
    for cut in [1, text.len() / 3, text.len() / 2, text.len() - 1] {
        match catch_unwind(|| Graph::from_json(&text[..cut])).expect("from_json must not panic") {
            Err(Error::Parse(m)) => assert!(!m.is_empty()),
            other => panic!("cut at {cut}: expected Error::Parse, got {other:?}"),
        }
    }
}

#[test]
fn from_json_with_a_wrong_stored_shape() {
    let (_, mut v) = sample_json();
    // Node 2 is the matmul f32[2, 4]; claim it is f32[2, 5].
    assert_eq!(v["nodes"][2]["op"], "MatMul");
    v["nodes"][2]["shape"]["dims"][1] = serde_json::json!({ "Static": 5 });
    let errs = verify_errors(from_value(&v));
    let all = errs.join("\n");
    assert_mentions(&all, &["%2", "matmul", "f32[2, 5]", "f32[2, 4]"]);
    // The relu after it now disagrees with its operand too.
    assert!(errs.len() >= 2, "{errs:?}");
    assert!(Error::Verify(errs)
        .to_string()
        .contains("verification failed"));
}

#[test]
fn from_json_with_a_forward_operand() {
    let (_, mut v) = sample_json();
    // The relu (node 3) reads node 4, defined after it.
    v["nodes"][3]["inputs"][0] = serde_json::json!(4);
    let all = verify_errors(from_value(&v)).join("\n");
    assert_mentions(&all, &["%3", "relu", "%4", "not defined before"]);
    // Pointing past the end is reported the same way.
    v["nodes"][3]["inputs"][0] = serde_json::json!(1000);
    let all = verify_errors(from_value(&v)).join("\n");
    assert_mentions(&all, &["%3", "%1000"]);
}

#[test]
fn from_json_with_inconsistent_nodes() {
    // Output out of range.
    let (_, mut v) = sample_json();
    v["outputs"][0] = serde_json::json!(12);
    assert_mentions(
        &verify_errors(from_value(&v)).join("\n"),
        &["output %12", "5 nodes"],
    );

    // A duplicate leaf name.
    let (_, mut v) = sample_json();
    v["nodes"][1]["op"]["Param"]["name"] = serde_json::json!("x");
    assert_mentions(
        &verify_errors(from_value(&v)).join("\n"),
        &["%1", "\"x\"", "twice"],
    );

    // A constant whose bytes do not fill its shape.
    let mut g = Graph::new("c");
    let c = g.constant_f32(&[2], &[1.0, 2.0]);
    g.set_outputs(vec![c]);
    let mut v: Value = serde_json::from_str(&g.to_json()).unwrap();
    // Written as an array of byte values, the form JSON graphs had before hex strings.
    let data = &mut v["nodes"][0]["op"]["Constant"]["data"];
    let mut bytes = rlx::ir::hex::decode(data.as_str().expect("hex bytes")).unwrap();
    bytes.pop();
    *data = serde_json::json!(bytes);
    let all = verify_errors(from_value(&v)).join("\n");
    assert_mentions(&all, &["%0", "constant", "f32[2]", "8 bytes", "7"]);
    assert!(
        !all.contains("Some("),
        "the message shows a Rust Option: {all}"
    );

    // A leaf with operands.
    let (_, mut v) = sample_json();
    v["nodes"][1]["inputs"] = serde_json::json!([0]);
    assert_mentions(
        &verify_errors(from_value(&v)).join("\n"),
        &["%1", "param", "operands"],
    );

    // A binary op with one operand.
    let (_, mut v) = sample_json();
    v["nodes"][2]["inputs"] = serde_json::json!([0]);
    assert_mentions(
        &verify_errors(from_value(&v)).join("\n"),
        &["%2", "matmul", "2 operands", "got 1"],
    );
}

#[test]
fn from_json_with_a_constant_that_has_operands() {
    let mut g = Graph::new("c");
    let x = g.input("x", f32s(&[2]));
    let c = g.constant_f32(&[2], &[1.0, 2.0]);
    let y = g.add(x, c);
    g.set_outputs(vec![y]);
    let mut v: Value = serde_json::from_str(&g.to_json()).unwrap();
    v["nodes"][1]["inputs"] = serde_json::json!([0]);
    assert_mentions(
        &verify_errors(from_value(&v)).join("\n"),
        &["%1", "constant", "operands"],
    );
}

#[test]
fn from_json_with_an_element_count_that_overflows() {
    // An input of 2^40 x 2^40 elements reshaped: inference must report, not overflow.
    let big = 1u64 << 40;
    let mut g = Graph::new("huge");
    let x = g.input("x", f32s(&[4]));
    let r = g.reshape(x, &[2, 2]);
    g.set_outputs(vec![r]);
    let mut v: Value = serde_json::from_str(&g.to_json()).unwrap();
    v["nodes"][0]["shape"]["dims"] = serde_json::json!([{ "Static": big }, { "Static": big }]);
    let all = verify_errors(from_value(&v)).join("\n");
    assert_mentions(&all, &["%1", "reshape"]);
}

#[test]
fn an_op_the_gpu_lacks_is_a_compile_error_naming_it() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    // The GPU has no integer reductions, and a reduction has no decomposition.
    let mut g = Graph::new("int_sum_on_gpu");
    let x = g.input("x", Shape::new(&[2, 8], DType::I32));
    let r = g.try_sum(x, &[1], false).unwrap();
    g.set_outputs(vec![r]);
    let err = Session::new(Device::Gpu)
        .try_compile(g)
        .err()
        .expect("integer sums do not run on the GPU");
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert_mentions(
        &err.to_string(),
        &[
            "wgpu",
            "reduce on i32[2] has no WGSL kernel",
            "no decomposition",
            "%1",
        ],
    );
}

#[test]
fn memory_a_compile_cannot_have_is_a_named_error() {
    // A 4 TiB param: no machine this runs on has it, so the compile answers which buffer it
    // could not allocate and how large it is, instead of aborting the process.
    let mut g = Graph::new("huge");
    let w = g.param("w", f32s(&[1 << 40]));
    let s = g.reduce(rlx::ops::ReduceKind::Sum, w, &[0], false);
    g.set_outputs(vec![s]);
    match Session::new(Device::Cpu).try_compile(g) {
        Err(e @ Error::OutOfMemory { .. }) => {
            let text = e.to_string();
            assert_mentions(
                &text,
                &["cpu", "4398046511104 bytes", "params of graph \"huge\""],
            );
        }
        Err(e) => panic!("expected Error::OutOfMemory, got {e:?}"),
        Ok(_) => panic!("a 4 TiB param compiled"),
    }
}

#[test]
fn a_node_the_cpu_cannot_run_is_refused_before_lowering_with_its_reason() {
    // Rank 9: the CPU's kernels take rank <= 8. `supports` sees the shapes, so the compiler
    // refuses the node (an add has no decomposition) naming why, before any lowering.
    let mut g = Graph::new("deep");
    let dims = [1usize, 1, 1, 1, 1, 1, 1, 2, 3];
    let x = g.input("x", f32s(&dims));
    let y = g.add(x, x);
    g.set_outputs(vec![y]);
    let Err(e) = Session::new(Device::Cpu).try_compile(g) else {
        panic!("a rank-9 add compiled for the CPU");
    };
    let Error::Unsupported { backend, op, .. } = &e else {
        panic!("expected Error::Unsupported, got {e:?}");
    };
    // The first node refused is the input itself.
    assert_eq!((backend.as_str(), op.as_str()), ("cpu", "input"));
    assert_mentions(
        &e.to_string(),
        &[
            "rank <= 8",
            "f32[1, 1, 1, 1, 1, 1, 1, 2, 3]",
            "no decomposition",
        ],
    );
}
