//! The int8 suite: the digits MLP and CNN (`rlx::models::digits`), trained with RLX and
//! quantized to int8 by `rlx::quant`, run by RLX's CPU backend and by ONNX Runtime's static
//! int8 path (`scripts/digits.py ort --bench`, the same model quantized by ONNX Runtime),
//! at batch 1 and 64 on 1 and 2 threads, in alternating blocks.

use crate::stats::{self, Samples};
use crate::{die, time_reps};
use rlx::models::digits::{DigitsData, DigitsModel, PIXELS};
use rlx::quant::RangeMethod;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn weights_json(model: DigitsModel, params: &BTreeMap<String, Vec<f32>>) -> String {
    let p: serde_json::Map<String, serde_json::Value> = model
        .params()
        .into_iter()
        .map(|(name, dims)| {
            (
                name.to_string(),
                serde_json::json!({"dims": dims, "values": params[name]}),
            )
        })
        .collect();
    serde_json::json!({ "params": p }).to_string()
}

/// ONNX Runtime's seconds per batch, by `b{batch}_t{threads}`.
fn ort_block(
    python: &Path,
    kind: &str,
    weights: &Path,
    data: &Path,
    dir: &Path,
) -> BTreeMap<String, Vec<f64>> {
    let out = dir.join(format!("{kind}.ort.json"));
    let ok = Command::new(python)
        .arg(root().join("scripts/digits.py"))
        .args(["ort", kind])
        .args([weights, data, &out])
        .arg("--bench")
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| die(&format!("digits.py: {e}")));
    if !ok.success() {
        die("digits.py ort --bench failed");
    }
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| die(&format!("digits.py's output: {e}")));
    let mut m = BTreeMap::new();
    if let Some(b) = v["bench"].as_object() {
        for (key, list) in b {
            let times = list
                .as_array()
                .map(|a| a.iter().filter_map(|t| t.as_f64()).collect());
            m.insert(key.clone(), times.unwrap_or_default());
        }
    }
    m
}

/// scikit-learn's split written into `dir` (setting up `.venv-edge` first): its path and data.
pub fn digits(dir: &Path) -> (PathBuf, DigitsData) {
    let path = dir.join("digits.bin");
    let ok = Command::new(root().join("scripts/setup-edge-pyenv.sh"))
        .stdout(std::process::Stdio::null())
        .status();
    if !ok.is_ok_and(|s| s.success()) {
        die("scripts/setup-edge-pyenv.sh failed");
    }
    let ok = Command::new(root().join(".venv-edge/bin/python"))
        .arg(root().join("scripts/digits.py"))
        .arg("data")
        .arg(&path)
        .status();
    if !ok.is_ok_and(|s| s.success()) {
        die("digits.py data failed");
    }
    let d = DigitsData::read(&path).unwrap_or_else(|e| die(&e.to_string()));
    (path, d)
}

/// Run the suite: `rounds` alternations of RLX blocks (`reps` timings per configuration) and
/// one ONNX Runtime run (7 timings per configuration); without `ort`, RLX only. The data and
/// ONNX Runtime come from `.venv-edge` (`scripts/setup-edge-pyenv.sh`).
pub fn suite(threads: &[usize], rounds: usize, reps: usize, ort: bool) {
    let dir = std::env::temp_dir().join(format!("rlx-bench-int8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| die(&e.to_string()));
    let (data_path, d) = digits(&dir);
    let py = root().join(".venv-edge/bin/python");
    println!(
        "\n### Int8 inference of the digits models (RLX's int8 graph on its CPU backend against ONNX Runtime's static int8 QDQ model), µs per batch: median [min–max]\n"
    );
    println!("| model | batch | threads | RLX int8 | ONNX Runtime int8 | ORT / RLX |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (model, kind, epochs) in [(DigitsModel::Mlp, "mlp", 40), (DigitsModel::Cnn, "cnn", 15)] {
        let params = model
            .train(&d, epochs, 7)
            .unwrap_or_else(|e| die(&e.to_string()));
        let map = model
            .calibrate(&params, &d.train_x[..256 * PIXELS], RangeMethod::MinMax)
            .unwrap_or_else(|e| die(&e.to_string()));
        let wpath = dir.join(format!("{kind}.json"));
        std::fs::write(&wpath, weights_json(model, &params))
            .unwrap_or_else(|e| die(&e.to_string()));
        let configs: Vec<(usize, usize)> = [1usize, 64]
            .iter()
            .flat_map(|&b| threads.iter().map(move |&t| (b, t)))
            .collect();
        // Through the user's path: a session compiles the graph, each run copies the batch in
        // and the logits out (as ONNX Runtime's `run` does).
        let mut progs: Vec<(rlx::CompiledGraph, Vec<f32>)> = configs
            .iter()
            .map(|&(b, t)| {
                let g = model
                    .int8(b, &params, &map)
                    .unwrap_or_else(|e| die(&e.to_string()));
                let c = rlx::Session::new(rlx::Device::Cpu)
                    .with_threads(t)
                    .try_compile(g)
                    .unwrap_or_else(|e| die(&e.to_string()));
                (c, d.test_x[..b * PIXELS].to_vec())
            })
            .collect();
        let mut ours: Vec<Samples> = configs.iter().map(|_| Samples::default()).collect();
        let mut theirs: Vec<Samples> = configs.iter().map(|_| Samples::default()).collect();
        for _ in 0..rounds {
            for (i, (c, x)) in progs.iter_mut().enumerate() {
                // Enough runs per timing that a batch-1 timing is not a clock tick.
                let per = (2000 / configs[i].0).max(20);
                let mut run = || {
                    c.try_run(&[("x", x)])
                        .unwrap_or_else(|e| die(&e.to_string()));
                };
                ours[i].extend(
                    time_reps(reps, || (0..per).for_each(|_| run()))
                        .into_iter()
                        .map(|s| s / per as f64 * 1e6),
                );
            }
            if ort {
                let m = ort_block(&py, kind, &wpath, &data_path, &dir);
                for (i, &(b, t)) in configs.iter().enumerate() {
                    if let Some(v) = m.get(&format!("b{b}_t{t}")) {
                        theirs[i].extend(v.iter().map(|s| s * 1e6));
                    }
                }
            }
        }
        for (i, &(b, t)) in configs.iter().enumerate() {
            println!(
                "| {} | {b} | {t} | {} | {} | {} |",
                model.name(),
                ours[i].show(1),
                theirs[i].show(1),
                stats::ratio(&theirs[i], &ours[i])
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
