//! Post-training quantization: calibration and folding against hand-computed cases, the QDQ
//! graph against the integer graph, and the named errors.

use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::quant::fixed::quantize_multiplier;
use rlx_ir::{Activation, DType, Graph, Op, Shape};
use rlx_opt::quant::{
    activation_entry, calibrate, insert_q_dq, quant_propagate, specialize_params, taps, Calibrator,
    QuantMap, RangeMethod, TapKind,
};
use std::collections::BTreeMap;

fn t(dims: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(dims, DType::F32, v.to_vec())
}

fn feed(x: Tensor) -> BTreeMap<String, Tensor> {
    BTreeMap::from([("x".to_string(), x)])
}

/// x [n, 4] @ w [4, 2] + b, relu: one group, three taps (x, the relu, w).
fn linear(n: usize) -> Graph {
    let mut g = Graph::new("linear");
    let x = g.input("x", Shape::new(&[n, 4], DType::F32));
    let w = g.constant_f32(&[4, 2], &[0.5, -1.0, 0.25, 0.5, -0.75, 1.5, 0.125, -0.25]);
    let b = g.constant_f32(&[2], &[0.1, -0.2]);
    let m = g.try_dot(x, w).unwrap();
    let a = g.add(m, b);
    let r = g.try_activation(Activation::Relu, a).unwrap();
    g.set_outputs(vec![r]);
    g
}

#[test]
fn taps_are_inputs_group_ends_and_weights() {
    let g = linear(1);
    let t = taps(&g);
    assert_eq!(
        t.iter().map(|(id, k)| (id.0, *k)).collect::<Vec<_>>(),
        vec![
            (0, TapKind::Activation),
            (1, TapKind::Weight { axis: 1 }),
            (5, TapKind::Activation)
        ]
    );
}

#[test]
fn min_max_calibration_gives_the_hand_computed_parameters() {
    let g = linear(2);
    // x ranges over [-1, 3]: scale 4/255, zero point round(-128 + 1/(4/255)) = -64.
    let map = calibrate(
        &g,
        &[
            feed(t(&[2, 4], &[-1.0, 0.0, 1.0, 2.0, 3.0, 0.5, 0.0, 0.0])),
            feed(t(&[2, 4], &[0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])),
        ],
        RangeMethod::MinMax,
    )
    .unwrap();
    let r = map.record();
    let x = &r[&rlx_ir::NodeId(0)];
    assert_eq!(x.scale, vec![4.0 / 255.0]);
    assert_eq!(x.zero_point, vec![-64]);
    assert_eq!((x.min[0], x.max[0]), (-1.0, 3.0));
    // The weight: per column, max |w| / 127 (columns: 0.75 and 1.5).
    let w = &r[&rlx_ir::NodeId(1)];
    assert_eq!(w.axis, Some(1));
    assert_eq!(w.scale, vec![0.75 / 127.0, 1.5 / 127.0]);
    assert_eq!(w.zero_point, vec![0, 0]);
    // The relu's output is non-negative: its range starts at 0, zero point -128.
    let y = &r[&rlx_ir::NodeId(5)];
    assert_eq!(y.zero_point, vec![-128]);
    assert_eq!(y.min, vec![0.0]);
    // The largest output: row [-1, 0, 1, 2], column 1: 1 + 1.5 - 0.5 - 0.2 = 1.8 (the other
    // rows give at most 3·0.5 + 0.5·0.25 + 0.1 = 1.725).
    assert!((y.max[0] - 1.8).abs() < 1e-6, "{}", y.max[0]);
}

#[test]
fn percentile_and_mse_ranges_clip_outliers() {
    let mut g = Graph::new("id");
    let x = g.input("x", Shape::new(&[1, 1000], DType::F32));
    let r = g.try_activation(Activation::Relu, x).unwrap();
    let two = g.constant_f32(&[1000, 1], &vec![1.0; 1000]);
    let m = g.try_dot(r, two).unwrap();
    g.set_outputs(vec![m]);
    // 0, 1, ..., 998 and one outlier at 100000.
    let mut v: Vec<f64> = (0..999).map(|i| i as f64).collect();
    v.push(100000.0);
    let s = [feed(t(&[1, 1000], &v))];
    let mm = calibrate(&g, &s, RangeMethod::MinMax).unwrap().record();
    let p = calibrate(&g, &s, RangeMethod::Percentile(99.0))
        .unwrap()
        .record();
    let e = calibrate(&g, &s, RangeMethod::Mse).unwrap().record();
    let x0 = rlx_ir::NodeId(0);
    assert_eq!(mm[&x0].max, vec![100000.0]);
    // The 99th percentile of 1000 sorted values: index round(0.99 · 999) = 989.
    assert_eq!(p[&x0].max, vec![989.0]);
    assert_eq!(p[&x0].min, vec![0.0]);
    // One outlier's squared error outweighs the steps of the rest: least error keeps it.
    assert_eq!(e[&x0].max, vec![100000.0]);
    // Many values and an outlier just past them: the finer step over 100,000 values is worth
    // more than the clipped outlier's error (at 1.05: 0.141 for the full range, about 0.13
    // clipped at 1.0).
    let mut many: Vec<f64> = (0..100_000).map(|i| i as f64 / 100_000.0).collect();
    many.push(1.05);
    let mut g2 = Graph::new("many");
    let x = g2.input("x", Shape::new(&[1, 100_001], DType::F32));
    let ones = g2.constant_f32(&[100_001, 1], &vec![1.0; 100_001]);
    let m = g2.try_dot(x, ones).unwrap();
    g2.set_outputs(vec![m]);
    let e = calibrate(&g2, &[feed(t(&[1, 100_001], &many))], RangeMethod::Mse)
        .unwrap()
        .record();
    assert!(
        e[&x0].max[0] < 1.05 && e[&x0].max[0] > 0.99,
        "{:?}",
        e[&x0].max
    );
    assert!(Calibrator::new(&g, RangeMethod::Percentile(30.0)).is_err());
}

#[test]
fn the_map_round_trips_json_and_refuses_another_graph() {
    let g = linear(1);
    let map = calibrate(
        &g,
        &[feed(t(&[1, 4], &[1.0, -2.0, 0.5, 0.0]))],
        RangeMethod::MinMax,
    )
    .unwrap();
    let back = QuantMap::from_json(&map.to_json()).unwrap();
    assert_eq!(back, map);
    let mut other = linear(1);
    other = {
        let mut o = Graph::new("other");
        for n in other.nodes() {
            o.push_unchecked(n.op.clone(), n.inputs.clone(), n.shape.clone());
        }
        o.set_outputs(other.outputs().to_vec());
        o
    };
    let e = insert_q_dq(&other, &map).unwrap_err().to_string();
    assert!(e.contains("\"linear\"") && e.contains("\"other\""), "{e}");
    let bad = map
        .to_json()
        .replacen("\"scale\": [", "\"scale\": [-1.0, ", 1);
    let e = QuantMap::from_json(&bad).unwrap_err().to_string();
    assert!(e.contains("scales"), "{e}");
}

/// The QDQ graph and the integer graph agree to within one step of the output's scale (the
/// integer graph requantizes in fixed point, the QDQ graph in float), and the integer graph
/// holds the hand-computed bias and multipliers.
#[test]
fn the_integer_graph_folds_the_qdq_graph() {
    let g = linear(3);
    let xs = t(
        &[3, 4],
        &[
            1.0, -2.0, 0.5, 0.0, 0.3, 0.7, -0.1, 2.0, -1.0, -1.0, 1.0, 1.0,
        ],
    );
    let map = calibrate(&g, &[feed(xs.clone())], RangeMethod::MinMax).unwrap();
    let qdq = insert_q_dq(&g, &map).unwrap();
    let int = quant_propagate(&qdq).unwrap();
    let names: Vec<&str> = int.nodes().iter().map(|n| n.op.name()).collect();
    assert!(
        names.contains(&"qlinear") && !names.contains(&"matmul"),
        "{int}"
    );
    let a = evaluate(&qdq, &feed(xs.clone())).unwrap()[0].f64s();
    let b = evaluate(&int, &feed(xs)).unwrap()[0].f64s();
    let r = map.record();
    let ys = r[&rlx_ir::NodeId(5)].scale[0] as f64;
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() <= ys * 1.0001, "{a:?} vs {b:?}");
    }
    // The qlinear's constants: bias b / (s_x s_w), multiplier of s_x s_w / s_y.
    let (sx, sw) = (
        r[&rlx_ir::NodeId(0)].scale[0] as f64,
        r[&rlx_ir::NodeId(1)].scale.clone(),
    );
    let ql = int
        .ids()
        .find(|&id| int.node(id).op.name() == "qlinear")
        .unwrap();
    let val = |i: usize| {
        let id = int.node(ql).inputs[i];
        let Op::Constant { data } = &int.node(id).op else {
            panic!()
        };
        Tensor::from_bytes(int.shape(id), data).unwrap().i64s()
    };
    let bias: Vec<i64> = [0.1f32, -0.2]
        .iter()
        .zip(&sw)
        .map(|(&b, &s)| (b as f64 / (sx * s as f64)).round() as i64)
        .collect();
    assert_eq!(val(2), bias);
    let (m0, s0) = quantize_multiplier(sx * sw[0] as f64 / ys).unwrap();
    assert_eq!((val(3)[0], val(4)[0]), (m0 as i64, s0 as i64));
    // The weight is transposed to [N, K]: column 1 of w (-1, 0.5, 1.5, -0.25) over 1.5/127.
    assert_eq!(
        int.shape(int.node(ql).inputs[1]).static_dims(),
        Some(vec![2, 4])
    );
    let w = {
        let id = int.node(ql).inputs[1];
        let Op::Constant { data } = &int.node(id).op else {
            panic!()
        };
        Tensor::from_bytes(int.shape(id), data).unwrap().i64s()
    };
    assert_eq!(&w[4..], &[-85, 42, 127, -21]);
}

#[test]
fn a_value_without_an_int8_form_is_a_named_error() {
    let mut g = Graph::new("soft");
    let x = g.input("x", Shape::new(&[2, 4], DType::F32));
    let w = g.constant_f32(&[4, 4], &[0.5; 16]);
    let m = g.try_dot(x, w).unwrap();
    let s = g.softmax(m, 1);
    let w2 = g.constant_f32(&[4, 2], &[0.25; 8]);
    let y = g.try_dot(s, w2).unwrap();
    g.set_outputs(vec![y]);
    let map = calibrate(
        &g,
        &[feed(t(&[2, 4], &[1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 2.0]))],
        RangeMethod::MinMax,
    )
    .unwrap();
    let qdq = insert_q_dq(&g, &map).unwrap();
    let e = quant_propagate(&qdq).unwrap_err().to_string();
    assert!(e.contains("softmax") && e.contains("no int8 form"), "{e}");
}

#[test]
fn params_become_constants_and_mismatches_are_named() {
    let mut g = Graph::new("p");
    let x = g.input("x", Shape::new(&[1, 2], DType::F32));
    let w = g.param("w", Shape::new(&[2, 2], DType::F32));
    let y = g.try_dot(x, w).unwrap();
    g.set_outputs(vec![y]);
    let e = Calibrator::new(&g, RangeMethod::MinMax)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("\"w\""), "{e}");
    let s = specialize_params(
        &g,
        &BTreeMap::from([("w".into(), t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]))]),
    )
    .unwrap();
    assert!(matches!(s.node(rlx_ir::NodeId(1)).op, Op::Constant { .. }));
    let e = specialize_params(&g, &BTreeMap::from([("w".into(), t(&[4], &[1.0; 4]))]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"w\"") && e.contains("f32[2, 2]"), "{e}");
    // The activation parameters hold zero exactly.
    let e = activation_entry(0.3, 2.0);
    assert_eq!(e.min, vec![0.0]);
    assert_eq!(e.zero_point, vec![-128]);
}

proptest::proptest! {
    /// A quantization map read from any text is a map whose entries are consistent, or an
    /// error: never a panic.
    #[test]
    fn any_text_reads_as_a_map_or_an_error(s in ".{0,400}") {
        let _ = QuantMap::from_json(&s);
    }

    /// A map whose JSON was cut or had a byte changed reads back or fails cleanly, and what
    /// reads back has positive scales and matching lengths.
    #[test]
    fn damaged_maps_fail_cleanly(cut in 0usize..2000, at in 0usize..2000, byte in 0u8..128) {
        let g = linear(1);
        let map = calibrate(&g, &[feed(t(&[1, 4], &[1.0, -2.0, 0.5, 3.0]))], RangeMethod::MinMax).unwrap();
        let mut text = map.to_json().into_bytes();
        if at < text.len() {
            text[at] = byte;
        }
        text.truncate(cut.min(text.len()));
        if let Ok(m) = QuantMap::from_json(&String::from_utf8_lossy(&text)) {
            for (_, e) in &m.taps {
                proptest::prop_assert!(e.scale.iter().all(|s| *s > 0.0 && s.is_finite()));
                proptest::prop_assert_eq!(e.zero_point.len(), e.scale.len());
            }
        }
    }
}
