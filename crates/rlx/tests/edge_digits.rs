//! Post-training int8 quantization end to end on scikit-learn's `digits`: an MLP and a CNN
//! trained with RLX, calibrated, folded into integer ops and run on the CPU, against the float
//! models and ONNX Runtime (its own static int8 quantization for accuracy, and RLX's scales
//! run through its int8 kernels for exact outputs). The data and ONNX Runtime come from PyPI
//! (`scripts/setup-edge-pyenv.sh`, run by the test).

mod common;

use common::digits::{python, root};
use rlx::models::digits::{accuracy, DigitsData, DigitsModel, CLASSES, PIXELS};
use rlx::prelude::*;
use rlx::quant::{QuantMap, RangeMethod};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The split, written once per test process by scikit-learn.
fn data() -> &'static (PathBuf, DigitsData) {
    static D: OnceLock<(PathBuf, DigitsData)> = OnceLock::new();
    D.get_or_init(|| {
        common::digits::data(
            &std::env::temp_dir().join(format!("rlx-digits-{}", std::process::id())),
        )
    })
}

fn run_f32(g: Graph, x: &[f32]) -> Vec<f32> {
    let mut c = Session::new(Device::Cpu).try_compile(g).unwrap();
    c.try_run(&[("x", x)]).unwrap().remove(0)
}

/// RLX's int8 logits from the dequantized outputs (exact: `(q - zp) · s` in f32).
fn int8_logits(y: &[f32], map: &QuantMap) -> Vec<i32> {
    let e = &map
        .taps
        .iter()
        .rev()
        .find(|(_, e)| e.axis.is_none())
        .unwrap()
        .1;
    y.iter()
        .map(|&v| (v / e.scale[0]).round() as i32 + e.zero_point[0] as i32)
        .collect()
}

/// The weights and RLX's quantization as `digits.py ort` reads them.
fn weights_json(model: DigitsModel, params: &BTreeMap<String, Vec<f32>>, map: &QuantMap) -> String {
    let g = model.forward(1).unwrap();
    let names: BTreeMap<NodeId, &str> = g.params().into_iter().map(|(n, id)| (id, n)).collect();
    let mut p = serde_json::Map::new();
    for (name, dims) in model.params() {
        p.insert(
            name.into(),
            serde_json::json!({"dims": dims, "values": params[name]}),
        );
    }
    let activations: Vec<_> = map
        .taps
        .iter()
        .filter(|(_, e)| e.axis.is_none())
        .map(|(_, e)| serde_json::json!([e.scale[0], e.zero_point[0]]))
        .collect();
    let weights: serde_json::Map<String, serde_json::Value> = map
        .taps
        .iter()
        .filter(|(_, e)| e.axis.is_some())
        .map(|(id, e)| (names[id].to_string(), serde_json::json!(e.scale)))
        .collect();
    serde_json::json!({"params": p, "rlx_qdq": {"activations": activations, "weights": weights}})
        .to_string()
}

fn end_to_end(model: DigitsModel, epochs: usize) {
    let (path, d) = data();
    let params = model.train(d, epochs, 7).unwrap();
    let n = d.test_y.len();
    let float = run_f32(model.specialized(n, &params).unwrap(), &d.test_x);
    let float_acc = accuracy(&float, &d.test_y);

    let map = model
        .calibrate(&params, &d.train_x[..256 * PIXELS], RangeMethod::MinMax)
        .unwrap();
    // The map survives JSON.
    assert_eq!(QuantMap::from_json(&map.to_json()).unwrap(), map);
    let int = model.int8(n, &params, &map).unwrap();
    let kinds: Vec<&str> = int.nodes().iter().map(|n| n.op.name()).collect();
    for k in ["matmul", "conv", "relu", "add"] {
        assert!(!kinds.contains(&k), "{k} left in the integer graph:\n{int}");
    }
    let q = run_f32(int.clone(), &d.test_x);
    let int_acc = accuracy(&q, &d.test_y);

    // The CPU's integer kernels agree with the reference evaluator bit for bit.
    let x = rlx::ir::eval::Tensor::from_f64(
        &[n, PIXELS],
        DType::F32,
        d.test_x.iter().map(|&v| v as f64).collect(),
    );
    let reference = rlx::ir::eval::evaluate(&int, &BTreeMap::from([("x".to_string(), x)])).unwrap();
    let reference: Vec<f32> = reference[0].f64s().iter().map(|&v| v as f32).collect();
    assert_eq!(
        q,
        reference,
        "CPU and reference evaluator differ on the int8 {}",
        model.name()
    );

    // ONNX Runtime: the float model, its own int8, and RLX's scales through its int8 kernels.
    let dir = path.parent().unwrap();
    let wpath = dir.join(format!("{}.json", model.name()));
    let opath = dir.join(format!("{}.ort.json", model.name()));
    std::fs::write(&wpath, weights_json(model, &params, &map)).unwrap();
    let kind = match model {
        DigitsModel::Mlp => "mlp",
        DigitsModel::Cnn => "cnn",
    };
    let ok = Command::new(python())
        .arg(root().join("scripts/digits.py"))
        .args(["ort", kind])
        .args([&wpath, path, &opath])
        .status()
        .unwrap();
    assert!(ok.success(), "digits.py ort failed");
    let ort: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&opath).unwrap()).unwrap();
    let ort_float = ort["float_accuracy"].as_f64().unwrap();
    let ort_int8 = ort["ort_int8_accuracy"].as_f64().unwrap();
    let theirs: Vec<i32> = ort["rlx_qdq_int8"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap() as i32)
        .collect();
    let ours = int8_logits(&q, &map);
    let same = ours.iter().zip(&theirs).filter(|(a, b)| a == b).count() as f64 / ours.len() as f64;
    let within_one = ours.iter().zip(&theirs).all(|(a, b)| (a - b).abs() <= 1);
    let argmax = |v: &[i32]| -> Vec<usize> {
        v.chunks(CLASSES)
            .map(|r| {
                (0..CLASSES)
                    .max_by_key(|&i| (r[i], std::cmp::Reverse(i)))
                    .unwrap()
            })
            .collect()
    };
    let agree = argmax(&ours)
        .iter()
        .zip(argmax(&theirs))
        .filter(|(a, b)| **a == *b)
        .count() as f64
        / n as f64;
    // ONNX Runtime's fused int8 kernels saturate without VNNI on x86 (pairs of u8 x s8
    // products summed in int16): there RLX's scales run through its QDQ graph unfused (each
    // pair quantizes and dequantizes in f32 around float products), which the same bounds hold.
    let fused = ort["rlx_qdq_fused"].as_bool().unwrap_or(true);
    println!(
        "{}: float {float_acc:.4} (ONNX Runtime {ort_float:.4}), RLX int8 {int_acc:.4}, ONNX Runtime int8 {ort_int8:.4}; \
         RLX's scales on ONNX Runtime ({}): {:.2}% of int8 logits equal, all within one: {within_one}, predictions agree {:.2}%",
        model.name(),
        if fused { "its int8 kernels" } else { "QDQ unfused: no VNNI here" },
        same * 100.0,
        agree * 100.0
    );
    // The same float model: at most one image on the boundary may go the other way.
    assert!(
        (float_acc - ort_float).abs() <= 1.0 / n as f64 + 1e-12,
        "ONNX Runtime's float model differs"
    );
    assert!(float_acc >= 0.95, "{} trained to {float_acc}", model.name());
    assert!(
        int_acc >= float_acc - 0.01,
        "int8 {int_acc} against float {float_acc}"
    );
    assert!(
        within_one,
        "RLX's and ONNX Runtime's int8 logits differ by more than one step"
    );
    assert!(
        same >= 0.9,
        "only {same} of the int8 logits equal ONNX Runtime's"
    );
}

#[test]
fn the_digits_mlp_quantizes_to_int8_within_a_point() {
    end_to_end(DigitsModel::Mlp, 40);
}

#[test]
fn the_digits_cnn_quantizes_to_int8_within_a_point() {
    end_to_end(DigitsModel::Cnn, 15);
}
