//! The char GPT's training run the backend tests compare across devices.

use rlx::models::{Gpt, GptConfig};
use rlx::prelude::*;
use rlx::train::{Optimizer, Schedule, TrainConfig, Trainer};

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Losses of `steps` steps and the final embedding table, on `device`.
pub fn train(device: Device, steps: usize) -> (Vec<f32>, Vec<f32>) {
    let config = GptConfig {
        vocab: 17,
        ctx: 8,
        dim: 16,
        heads: 2,
        layers: 1,
    };
    let model = Gpt::new(config).unwrap();
    let batch = 2;
    let g = model.training_graph(batch).unwrap();
    let names: Vec<String> = model.params().into_iter().map(|p| p.0).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let tc = TrainConfig {
        optimizer: Optimizer::adamw(0.01),
        schedule: Schedule::WarmupCosine {
            lr: 1e-2,
            min_lr: 1e-3,
            warmup: 2,
            total: steps as u64,
        },
        clip_norm: Some(1.0),
    };
    let mut t = Trainer::new(&g, &refs, tc, &Session::new(device))
        .unwrap_or_else(|e| panic!("{device}: {e}"));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (name, shape, scale) in model.params() {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = match scale {
            None => vec![1.0; n],
            Some(s) => (0..n)
                .map(|_| ((next() % 2001) as f32 / 1000.0 - 1.0) * s)
                .collect(),
        };
        t.set_param(&name, &v).unwrap();
    }
    // One batch, seen every step: the loss must fall.
    let x: Vec<i32> = (0..batch * config.ctx)
        .map(|_| (next() % config.vocab as u64) as i32)
        .collect();
    let y: Vec<i32> = (0..batch * config.ctx)
        .map(|_| (next() % config.vocab as u64) as i32)
        .collect();
    let (xb, yb) = (i32_bytes(&x), i32_bytes(&y));
    let mut losses = Vec::new();
    for _ in 0..steps {
        losses.push(
            t.step_typed(&[("tokens", &xb, DType::I32), ("targets", &yb, DType::I32)])
                .unwrap(),
        );
    }
    let emb = t.get_param(&names[0]).unwrap();
    (losses, emb)
}
