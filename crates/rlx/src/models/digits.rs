//! Two small classifiers of scikit-learn's `digits` set (1,797 images of handwritten digits,
//! 8×8 pixels of 0..16, ten classes), an MLP and a CNN, written in RLX ops and trained with
//! [`crate::train`]. They are the float models the int8 pipeline (`rlx::opt::quant`) and the
//! edge writers are shown and tested on.
//!
//! The data comes from the scikit-learn wheel (`scripts/digits.py data` writes the split this
//! module reads: scikit-learn's `train_test_split` with a quarter held out, stratified, seed 0;
//! pixels scaled to `[0, 1]`).

use crate::train::{softmax_cross_entropy, Optimizer, Schedule, TrainConfig, Trainer};
use rlx_ir::eval::Tensor;
use rlx_ir::{Activation, ConvAttrs, DType, Error, Graph, PoolAttrs, PoolKind, Result, Shape};
use rlx_opt::quant::{
    calibrate, insert_q_dq, quant_propagate, specialize_params, QuantMap, RangeMethod,
};
use rlx_runtime::Session;
use std::collections::BTreeMap;
use std::path::Path;

/// Pixels per image.
pub const PIXELS: usize = 64;
/// Classes.
pub const CLASSES: usize = 10;

/// The digits split: images as `PIXELS` floats in `[0, 1]` each, labels `0..10`.
#[derive(Clone, Debug)]
pub struct DigitsData {
    /// Training images, row after row.
    pub train_x: Vec<f32>,
    /// Training labels.
    pub train_y: Vec<i32>,
    /// Held-out images.
    pub test_x: Vec<f32>,
    /// Held-out labels.
    pub test_y: Vec<i32>,
}

const MAGIC: &[u8; 8] = b"RLXDIGIT";

impl DigitsData {
    /// Read the file `scripts/digits.py data` writes: `RLXDIGIT`, the train and test counts
    /// (u32 LE), then per split its images (f32 LE) and labels (u8).
    pub fn read(path: &Path) -> Result<DigitsData> {
        let b = std::fs::read(path)
            .map_err(|e| Error::Invalid(format!("digits data {}: {e}", path.display())))?;
        let bad = |what: &str| Error::Invalid(format!("digits data {}: {what}", path.display()));
        if b.len() < 16 || &b[..8] != MAGIC {
            return Err(bad("not an RLXDIGIT file"));
        }
        let count =
            |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
        let (ntr, nte) = (count(8), count(12));
        let want = 16 + (ntr + nte) * (PIXELS * 4 + 1);
        if b.len() != want {
            return Err(bad(&format!(
                "{} bytes where {ntr} training and {nte} test images take {want}",
                b.len()
            )));
        }
        let mut at = 16;
        let mut split = |n: usize| -> Result<(Vec<f32>, Vec<i32>)> {
            let x: Vec<f32> = b[at..at + n * PIXELS * 4]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            at += n * PIXELS * 4;
            let y: Vec<i32> = b[at..at + n].iter().map(|&v| v as i32).collect();
            at += n;
            if let Some(v) = y.iter().find(|&&v| v as usize >= CLASSES) {
                return Err(bad(&format!("label {v} is not a digit")));
            }
            Ok((x, y))
        };
        let (train_x, train_y) = split(ntr)?;
        let (test_x, test_y) = split(nte)?;
        Ok(DigitsData {
            train_x,
            train_y,
            test_x,
            test_y,
        })
    }
}

/// Which classifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigitsModel {
    /// 64 → 64 → 32 → 10, ReLU between.
    Mlp,
    /// conv 3×3 (16) → ReLU → max pool 2 → conv 3×3 (32) → ReLU → max pool 2 → 128 → 10.
    Cnn,
}

impl DigitsModel {
    /// The model's name.
    pub fn name(self) -> &'static str {
        match self {
            DigitsModel::Mlp => "digits_mlp",
            DigitsModel::Cnn => "digits_cnn",
        }
    }

    /// Every param with its dims, in order.
    pub fn params(self) -> Vec<(&'static str, Vec<usize>)> {
        match self {
            DigitsModel::Mlp => vec![
                ("w1", vec![64, 64]),
                ("b1", vec![64]),
                ("w2", vec![64, 32]),
                ("b2", vec![32]),
                ("w3", vec![32, 10]),
                ("b3", vec![10]),
            ],
            DigitsModel::Cnn => vec![
                ("c1", vec![16, 1, 3, 3]),
                ("cb1", vec![16, 1, 1]),
                ("c2", vec![32, 16, 3, 3]),
                ("cb2", vec![32, 1, 1]),
                ("w3", vec![128, 10]),
                ("b3", vec![10]),
            ],
        }
    }

    /// The forward graph for `batch` images: input `x f32 [batch, 64]`, output the logits
    /// `f32 [batch, 10]`.
    pub fn forward(self, batch: usize) -> Result<Graph> {
        let mut g = Graph::new(self.name());
        let x = g.try_input("x", Shape::new(&[batch, PIXELS], DType::F32))?;
        let logits = self.logits(&mut g, x, batch)?;
        g.try_set_outputs(vec![logits])?;
        Ok(g)
    }

    fn logits(self, g: &mut Graph, x: rlx_ir::NodeId, batch: usize) -> Result<rlx_ir::NodeId> {
        let mut p = BTreeMap::new();
        for (name, dims) in self.params() {
            p.insert(name, g.try_param(name, Shape::new(&dims, DType::F32))?);
        }
        let relu = |g: &mut Graph, v| g.try_activation(Activation::Relu, v);
        match self {
            DigitsModel::Mlp => {
                let mut h = x;
                for (i, (w, b)) in [("w1", "b1"), ("w2", "b2"), ("w3", "b3")]
                    .into_iter()
                    .enumerate()
                {
                    let m = g.try_dot(h, p[w])?;
                    h = g.try_add(m, p[b])?;
                    if i < 2 {
                        h = relu(g, h)?;
                    }
                }
                Ok(h)
            }
            DigitsModel::Cnn => {
                let conv = ConvAttrs {
                    stride: vec![1, 1],
                    padding: vec![(1, 1), (1, 1)],
                    dilation: vec![1, 1],
                    groups: 1,
                };
                let pool = PoolAttrs {
                    kind: PoolKind::Max,
                    kernel: vec![2, 2],
                    stride: vec![2, 2],
                    padding: vec![(0, 0), (0, 0)],
                };
                let mut h = g.try_reshape(x, &[batch, 1, 8, 8])?;
                for (w, b) in [("c1", "cb1"), ("c2", "cb2")] {
                    let c = g.try_conv(h, p[w], conv.clone())?;
                    let c = g.try_add(c, p[b])?;
                    let r = relu(g, c)?;
                    h = g.try_pool(r, pool.clone())?;
                }
                let f = g.try_reshape(h, &[batch, 128])?;
                let m = g.try_dot(f, p["w3"])?;
                g.try_add(m, p["b3"])
            }
        }
    }

    /// The forward graph for `batch` images with `params` as constants (what quantization
    /// takes).
    pub fn specialized(self, batch: usize, params: &BTreeMap<String, Vec<f32>>) -> Result<Graph> {
        let g = self.forward(batch)?;
        let mut values = BTreeMap::new();
        for (name, dims) in self.params() {
            let v = params.get(name).ok_or_else(|| {
                Error::Invalid(format!("{}: no value for param \"{name}\"", self.name()))
            })?;
            let t = Tensor::from_f64(&dims, DType::F32, v.iter().map(|&x| x as f64).collect());
            if t.numel() != v.len() {
                return Err(Error::Invalid(format!(
                    "{}: param \"{name}\" has {} values for dims {dims:?}",
                    self.name(),
                    v.len()
                )));
            }
            values.insert(name.to_string(), t);
        }
        specialize_params(&g, &values)
    }

    /// Calibrate the model with `params` over the images `calib` (one batch, on the reference
    /// evaluator).
    pub fn calibrate(
        self,
        params: &BTreeMap<String, Vec<f32>>,
        calib: &[f32],
        method: RangeMethod,
    ) -> Result<QuantMap> {
        let n = calib.len() / PIXELS;
        let g = self.specialized(n, params)?;
        let x = Tensor::from_f64(
            &[n, PIXELS],
            DType::F32,
            calib.iter().map(|&v| v as f64).collect(),
        );
        calibrate(&g, &[BTreeMap::from([("x".to_string(), x)])], method)
    }

    /// The integer graph for `batch` images: input `x f32 [batch, 64]` quantized on entry,
    /// int8 ops throughout, the logits dequantized on exit.
    pub fn int8(
        self,
        batch: usize,
        params: &BTreeMap<String, Vec<f32>>,
        map: &QuantMap,
    ) -> Result<Graph> {
        let g = self.specialized(batch, params)?;
        quant_propagate(&insert_q_dq(&g, map)?)
    }

    /// Initial params: He-uniform weights (fan-in), zero biases, from `seed`.
    pub fn init(self, seed: u64) -> BTreeMap<String, Vec<f32>> {
        let mut s = seed;
        let mut next = move || {
            // splitmix64
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        self.params()
            .into_iter()
            .map(|(name, dims)| {
                let n: usize = dims.iter().product();
                let bias = name.starts_with('b') || name.starts_with("cb");
                let fan_in: usize = if dims.len() == 2 {
                    dims[0]
                } else {
                    dims[1..].iter().product()
                };
                let limit = (6.0 / fan_in as f64).sqrt();
                let v = (0..n)
                    .map(|_| {
                        if bias {
                            0.0
                        } else {
                            ((2.0 * next() - 1.0) * limit) as f32
                        }
                    })
                    .collect();
                (name.to_string(), v)
            })
            .collect()
    }

    /// Train on the training split: Adam, `epochs` passes in shuffled batches of 64 (the last
    /// partial batch dropped), learning rate 3e-3. Returns the params.
    pub fn train(
        self,
        data: &DigitsData,
        epochs: usize,
        seed: u64,
    ) -> Result<BTreeMap<String, Vec<f32>>> {
        const BATCH: usize = 64;
        let mut g = Graph::new(self.name());
        let x = g.try_input("x", Shape::new(&[BATCH, PIXELS], DType::F32))?;
        let y = g.try_input("y", Shape::new(&[BATCH], DType::I32))?;
        let logits = self.logits(&mut g, x, BATCH)?;
        let loss = softmax_cross_entropy(&mut g, logits, y)?;
        g.try_set_outputs(vec![loss])?;
        let names: Vec<&str> = self.params().iter().map(|(n, _)| *n).collect();
        let config = TrainConfig {
            optimizer: Optimizer::adam(),
            schedule: Schedule::Constant { lr: 3e-3 },
            clip_norm: None,
        };
        let mut t = Trainer::new(&g, &names, config, &Session::new(crate::Device::Cpu))?;
        for (name, v) in self.init(seed) {
            t.set_param(&name, &v)?;
        }
        let n = data.train_y.len();
        let mut order: Vec<usize> = (0..n).collect();
        let mut s = seed ^ 0x5EED;
        for _ in 0..epochs {
            // Fisher–Yates with an LCG.
            for i in (1..n).rev() {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                order.swap(i, (s >> 33) as usize % (i + 1));
            }
            for chunk in order.chunks_exact(BATCH) {
                let xb: Vec<u8> = chunk
                    .iter()
                    .flat_map(|&i| &data.train_x[i * PIXELS..(i + 1) * PIXELS])
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                let yb: Vec<u8> = chunk
                    .iter()
                    .flat_map(|&i| data.train_y[i].to_le_bytes())
                    .collect();
                t.step_typed(&[("x", &xb, DType::F32), ("y", &yb, DType::I32)])?;
            }
        }
        names
            .iter()
            .map(|&n| Ok((n.to_string(), t.get_param(n)?)))
            .collect()
    }
}

/// The fraction of rows of `logits` (`CLASSES` per row) whose largest entry is the label (the
/// first of equal largest entries, as int8 logits often tie).
pub fn accuracy(logits: &[f32], labels: &[i32]) -> f64 {
    let right = logits
        .chunks_exact(CLASSES)
        .zip(labels)
        .filter(|(row, &y)| {
            let best = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            best as i32 == y
        })
        .count();
    right as f64 / labels.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any file reads as a split whose labels are digits, or as an error naming the file.
        #[test]
        fn any_file_reads_as_a_split_or_an_error(
            body in proptest::collection::vec(0u8..=255, 0..600),
            header in proptest::bool::ANY,
            ntr in 0u32..4,
            nte in 0u32..4,
        ) {
            let mut bytes = Vec::new();
            if header {
                bytes.extend_from_slice(MAGIC);
                bytes.extend_from_slice(&ntr.to_le_bytes());
                bytes.extend_from_slice(&nte.to_le_bytes());
            }
            bytes.extend_from_slice(&body);
            let path = std::env::temp_dir().join(format!("rlx-digits-prop-{}", std::process::id()));
            std::fs::write(&path, &bytes).unwrap();
            match DigitsData::read(&path) {
                Ok(d) => {
                    proptest::prop_assert_eq!(d.train_x.len(), d.train_y.len() * PIXELS);
                    proptest::prop_assert!(d.test_y.iter().all(|&y| (0..10).contains(&y)));
                }
                Err(e) => proptest::prop_assert!(e.to_string().contains("digits data")),
            }
        }
    }
}
