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

/// A model with the integer ops the digits models lack, for the edge writers: a 3×3
/// convolution (4 channels, ReLU), a second one whose result is added back to the first's
/// (`qadd` with ReLU), a 3×3 mean pool of stride 2 with padding 1 (edge windows hold fewer
/// values), a 2×2 max pool, and a linear layer to 10 logits; random weights, calibrated on
/// `calib` (images of `PIXELS` values), integer core at batch 1.
pub fn residual_core(calib: &[f32]) -> IntegerCore {
    use rlx::ir::eval::Tensor;
    use rlx::quant::{calibrate, insert_q_dq, integer_core, quant_propagate, RangeMethod};
    // The same weights at every batch size: each build draws them from the same seed.
    let build = |batch: usize| -> Graph {
        let mut s = 0x5eed_u64;
        let mut rnd = move |scale: f32| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        };
        let mut g = Graph::new("residual");
        let mut konst = |g: &mut Graph, dims: &[usize], scale: f32| {
            let n: usize = dims.iter().product();
            let v: Vec<u8> = (0..n).flat_map(|_| rnd(scale).to_le_bytes()).collect();
            g.constant_bytes(Shape::new(dims, DType::F32), v)
        };
        let x = g.input("x", Shape::new(&[batch, PIXELS], DType::F32));
        let h = g.reshape(x, &[batch, 1, 8, 8]);
        let conv = ConvAttrs {
            stride: vec![1, 1],
            padding: vec![(1, 1), (1, 1)],
            dilation: vec![1, 1],
            groups: 1,
        };
        let (w1, b1) = (
            konst(&mut g, &[4, 1, 3, 3], 0.3),
            konst(&mut g, &[1, 4, 1, 1], 0.5),
        );
        let c1 = g.conv(h, w1, conv.clone());
        let c1 = g.add(c1, b1);
        let h1 = g.activation(Activation::Relu, c1);
        let (w2, b2) = (
            konst(&mut g, &[4, 4, 3, 3], 0.2),
            konst(&mut g, &[1, 4, 1, 1], 0.5),
        );
        let c2 = g.conv(h1, w2, conv);
        let c2 = g.add(c2, b2);
        let h2 = g.activation(Activation::Relu, c2);
        let sum = g.add(h1, h2);
        let sum = g.activation(Activation::Relu, sum);
        // A square window of `k`, with a stride and padding `p` on every side.
        let square = |kind, k: usize, stride: usize, p: usize| PoolAttrs {
            kind,
            kernel: vec![k, k],
            stride: vec![stride, stride],
            padding: vec![(p, p), (p, p)],
        };
        let mean = g.pool(sum, square(PoolKind::Mean, 3, 2, 1));
        let max = g.pool(mean, square(PoolKind::Max, 2, 2, 0));
        let f = g.reshape(max, &[batch, 16]);
        let (w3, b3) = (konst(&mut g, &[16, 10], 0.4), konst(&mut g, &[10], 0.2));
        let m = g.dot(f, w3);
        let y = g.add(m, b3);
        g.set_outputs(vec![y]);
        g
    };
    let n = calib.len() / PIXELS;
    let calib_graph = build(n);
    let one = build(1);
    let x = Tensor::from_f64(
        &[n, PIXELS],
        DType::F32,
        calib.iter().map(|&v| v as f64).collect(),
    );
    let map = calibrate(
        &calib_graph,
        &[BTreeMap::from([("x".to_string(), x)])],
        RangeMethod::MinMax,
    )
    .unwrap();
    // The map is tied to its graph's name and node count, which batch 1 shares.
    let int8 = quant_propagate(&insert_q_dq(&one, &map).unwrap()).unwrap();
    let core = integer_core(&int8).unwrap();
    let names: Vec<&str> = core.graph.nodes().iter().map(|n| n.op.name()).collect();
    for op in ["qconv2d", "qadd", "qpool", "qlinear"] {
        assert!(names.contains(&op), "no {op} in {names:?}");
    }
    core
}
