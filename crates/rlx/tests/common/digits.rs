//! The digits split from scikit-learn (through `scripts/digits.py` in `.venv-edge`), its images
//! quantized as a model's input, and the host's int8 outputs of an integer core.

use rlx::models::digits::{DigitsData, PIXELS};
use rlx::prelude::*;
use rlx::quant::IntegerCore;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The edge tests' python (`scripts/setup-edge-pyenv.sh` makes it).
pub fn python() -> PathBuf {
    root().join(".venv-edge/bin/python")
}

/// Write the split into `dir` (setting up `.venv-edge` first) and read it: its path and data.
pub fn data(dir: &Path) -> (PathBuf, DigitsData) {
    let ok = Command::new(root().join("scripts/setup-edge-pyenv.sh"))
        .status()
        .expect("run scripts/setup-edge-pyenv.sh");
    assert!(ok.success(), "scripts/setup-edge-pyenv.sh failed");
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("digits.bin");
    let ok = Command::new(python())
        .arg(root().join("scripts/digits.py"))
        .arg("data")
        .arg(&path)
        .status()
        .unwrap();
    assert!(ok.success(), "digits.py data failed");
    let d = DigitsData::read(&path).unwrap();
    (path, d)
}

/// Images quantized as the `quantize` op does (round half to even of `x / scale`, divided in
/// f32, plus the zero point, saturated).
pub fn quantized(x: &[f32], (scale, zp): (f32, i32)) -> Vec<Vec<i8>> {
    x.chunks(PIXELS)
        .map(|img| {
            img.iter()
                .map(|&v| ((v / scale).round_ties_even() as i32 + zp).clamp(-128, 127) as i8)
                .collect()
        })
        .collect()
}

/// The int8 outputs of `core` for `inputs` on the CPU, the first few checked against the
/// reference evaluator.
pub fn host(core: &IntegerCore, inputs: &[Vec<i8>]) -> Vec<Vec<i8>> {
    let g = &core.graph;
    let name = g.inputs()[0].0.to_string();
    let dims = g.shape(g.inputs()[0].1).static_dims().unwrap();
    let mut c = Session::new(Device::Cpu).try_compile(g.clone()).unwrap();
    let outs: Vec<Vec<i8>> = inputs
        .iter()
        .map(|x| {
            let bytes: Vec<u8> = x.iter().map(|&v| v as u8).collect();
            let out = c
                .try_run_typed(&[(name.as_str(), &bytes, DType::I8)])
                .unwrap();
            out[0].0.iter().map(|&b| b as i8).collect()
        })
        .collect();
    for (x, y) in inputs.iter().zip(&outs).take(8) {
        let t = rlx::ir::eval::Tensor::from_i64(
            &dims,
            DType::I8,
            x.iter().map(|&v| v as i64).collect(),
        );
        let r = rlx::ir::eval::evaluate(g, &BTreeMap::from([(name.clone(), t)])).unwrap();
        let r: Vec<i8> = r[0].i64s().into_iter().map(|v| v as i8).collect();
        assert_eq!(&r, y, "CPU and reference evaluator differ");
    }
    outs
}
