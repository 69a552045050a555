//! Shared by the digits examples: scikit-learn's split (through `scripts/digits.py` in
//! `.venv-edge`, set up on first use) and a trained, calibrated model.

#![allow(dead_code)]

use rlx::models::digits::{DigitsData, DigitsModel, PIXELS};
use rlx::quant::{QuantMap, RangeMethod};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The split, written under `target/digits/` by scikit-learn.
pub fn data() -> DigitsData {
    let dir = root().join("target/digits");
    std::fs::create_dir_all(&dir).expect("target/digits");
    let path = dir.join("digits.bin");
    if !path.exists() {
        let ok = Command::new(root().join("scripts/setup-edge-pyenv.sh")).status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "scripts/setup-edge-pyenv.sh failed"
        );
        let ok = Command::new(root().join(".venv-edge/bin/python"))
            .arg(root().join("scripts/digits.py"))
            .arg("data")
            .arg(&path)
            .status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "scripts/digits.py data failed"
        );
    }
    DigitsData::read(&path).expect("the digits split")
}

/// The model from the first command-line argument (`mlp` or `cnn`, default `cnn`).
pub fn model_from_args() -> DigitsModel {
    match std::env::args().nth(1).as_deref() {
        Some("mlp") => DigitsModel::Mlp,
        None | Some("cnn") => DigitsModel::Cnn,
        Some(other) => panic!("unknown model {other} (mlp or cnn)"),
    }
}

/// `model` trained on the split and calibrated on 256 training images (min/max ranges).
pub fn trained(model: DigitsModel, d: &DigitsData) -> (BTreeMap<String, Vec<f32>>, QuantMap) {
    let epochs = if model == DigitsModel::Mlp { 40 } else { 15 };
    let params = model.train(d, epochs, 7).expect("training");
    let map = model
        .calibrate(&params, &d.train_x[..256 * PIXELS], RangeMethod::MinMax)
        .expect("calibration");
    (params, map)
}

/// The held-out images quantized as the model's input is.
pub fn quantized_inputs(d: &DigitsData, (scale, zp): (f32, i32)) -> Vec<Vec<i8>> {
    d.test_x
        .chunks(PIXELS)
        .map(|img| {
            img.iter()
                .map(|&v| ((v / scale).round_ties_even() as i32 + zp).clamp(-128, 127) as i8)
                .collect()
        })
        .collect()
}

/// The fraction of int8 logits rows whose largest entry is the label.
pub fn int8_accuracy(outputs: &[Vec<i8>], labels: &[i32]) -> f64 {
    let right = outputs
        .iter()
        .zip(labels)
        .filter(|(o, &y)| {
            (0..o.len()).max_by_key(|&i| (o[i], std::cmp::Reverse(i))) == Some(y as usize)
        })
        .count();
    right as f64 / labels.len() as f64
}
