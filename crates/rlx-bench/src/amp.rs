//! Mixed-precision training benchmark: the character GPT trained on Genesis twice from the same
//! initialization and batches, once in f32 and once under a low-precision policy, one step of
//! each in turn, so both see the same machine load. Reports the median step time of each and
//! the loss of each at the end (mean of the last 20 steps, and on held-out batches).

use crate::stats::Samples;
use rlx::models::{Gpt, GptConfig};
use rlx::prelude::*;
use rlx::train::{Optimizer, Schedule, TrainConfig, Trainer};
use std::time::Instant;

const TEXT: &str = include_str!("../../rlx/examples/data/genesis.txt");

/// The text as character ids, and the vocabulary size.
fn corpus() -> (Vec<i32>, usize) {
    let mut chars: Vec<char> = TEXT.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    let ids = TEXT
        .chars()
        .map(|c| chars.binary_search(&c).expect("in vocabulary") as i32)
        .collect();
    (ids, chars.len())
}

/// Batches of `batch` random windows of `ctx + 1` characters (inputs and next-character
/// targets), from a fixed seed.
struct Batches {
    state: u64,
    batch: usize,
    ctx: usize,
}

impl Batches {
    fn next(&mut self, ids: &[i32]) -> (Vec<u8>, Vec<u8>) {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for _ in 0..self.batch {
            self.state = self
                .state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let s = (self.state >> 33) as usize % (ids.len() - self.ctx - 1);
            for i in 0..self.ctx {
                x.extend(ids[s + i].to_le_bytes());
                y.extend(ids[s + i + 1].to_le_bytes());
            }
        }
        (x, y)
    }
}

/// A trainer for `model` under `policy`, with the params `init` gives.
fn trainer(
    model: &Gpt,
    batch: usize,
    steps: usize,
    threads: usize,
    policy: PrecisionPolicy,
    init: &[(String, Vec<f32>)],
) -> Trainer {
    let session = Session::new(Device::Cpu)
        .with_threads(threads)
        .with_precision(policy);
    let g = model.training_graph(batch).expect("valid graph");
    let names: Vec<&str> = init.iter().map(|(n, _)| n.as_str()).collect();
    let config = TrainConfig {
        optimizer: Optimizer::adamw(0.01),
        schedule: Schedule::WarmupCosine {
            lr: 3e-3,
            min_lr: 3e-4,
            warmup: (steps / 20).max(1) as u64,
            total: steps as u64,
        },
        clip_norm: Some(1.0),
    };
    let mut t = Trainer::new(&g, &names, config, &session).expect("trainer");
    for (n, v) in init {
        t.set_param(n, v).expect("param");
    }
    t
}

fn step(t: &mut Trainer, x: &[u8], y: &[u8]) -> f32 {
    t.step_typed(&[("tokens", x, DType::I32), ("targets", y, DType::I32)])
        .expect("step")
}

/// Run the comparison for each `(dim, layers)` and thread count.
pub fn suite(
    configs: &[(usize, usize)],
    threads: &[usize],
    steps: usize,
    policy: &PrecisionPolicy,
) {
    let (ids, vocab) = corpus();
    let split = ids.len() * 9 / 10;
    let (train, held) = (&ids[..split], &ids[split..]);
    println!(
        "\n### Training the character GPT in f32 and under {} ({steps} steps each, alternating), ms per step: median [min–max]\n",
        policy.name()
    );
    println!(
        "| dim × layers (ctx 64, batch 16) | threads | f32 | {p} | f32 / {p} | final loss f32 | final loss {p} | difference | held-out f32 | held-out {p} |",
        p = policy.name()
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &(dim, layers) in configs {
        let model = Gpt::new(GptConfig {
            vocab,
            ctx: 64,
            dim,
            heads: dim / 32,
            layers,
        })
        .expect("valid config");
        let init: Vec<(String, Vec<f32>)> = model
            .params()
            .into_iter()
            .enumerate()
            .map(|(i, (n, s, scale))| {
                let count: usize = s.iter().product();
                let v = match scale {
                    None => vec![1.0; count],
                    Some(sc) => crate::train::fill(count, 7 + i as u64, sc * 1.7),
                };
                (n, v)
            })
            .collect();
        for &t in threads {
            let mut a = trainer(&model, 16, steps, t, PrecisionPolicy::AlwaysF32, &init);
            let mut b = trainer(&model, 16, steps, t, policy.clone(), &init);
            let mut data = Batches {
                state: 1,
                batch: 16,
                ctx: 64,
            };
            let (mut ta, mut tb) = (Samples::default(), Samples::default());
            let (mut la, mut lb) = (Vec::new(), Vec::new());
            for s in 0..steps {
                let (x, y) = data.next(train);
                // Alternate which runs first, so neither always follows the other.
                let order: [bool; 2] = if s % 2 == 0 {
                    [true, false]
                } else {
                    [false, true]
                };
                for first in order {
                    let (tr, ts, ls) = if first {
                        (&mut a, &mut ta, &mut la)
                    } else {
                        (&mut b, &mut tb, &mut lb)
                    };
                    let t0 = Instant::now();
                    let l = step(tr, &x, &y);
                    if s >= 5 {
                        ts.push(t0.elapsed().as_secs_f64() * 1e3);
                    }
                    ls.push(l as f64);
                }
            }
            let tail = |l: &[f64]| {
                l[l.len().saturating_sub(20)..].iter().sum::<f64>() / 20f64.min(l.len() as f64)
            };
            let (fa, fb) = (tail(&la), tail(&lb));
            // Held-out loss: the forward graph under each policy with each trainer's weights.
            let mut held_data = Batches {
                state: 99,
                batch: 16,
                ctx: 64,
            };
            let batches: Vec<_> = (0..4).map(|_| held_data.next(held)).collect();
            let held_loss = |tr: &Trainer, p: PrecisionPolicy| -> f64 {
                let mut e = Session::new(Device::Cpu)
                    .with_threads(t)
                    .with_precision(p)
                    .compile(model.training_graph(16).expect("graph"));
                for (n, _) in &init {
                    e.set_param(n, &tr.get_param(n).expect("param"));
                }
                batches
                    .iter()
                    .map(|(x, y)| {
                        let o =
                            e.run_typed(&[("tokens", x, DType::I32), ("targets", y, DType::I32)]);
                        f32::from_le_bytes(o[0].0[..4].try_into().expect("f32")) as f64
                    })
                    .sum::<f64>()
                    / batches.len() as f64
            };
            let (ha, hb) = (
                held_loss(&a, PrecisionPolicy::AlwaysF32),
                held_loss(&b, policy.clone()),
            );
            println!(
                "| {dim} × {layers} | {t} | {} | {} | {} | {fa:.4} | {fb:.4} | {:+.2}% | {ha:.4} | {hb:.4} |",
                ta.show(2),
                tb.show(2),
                crate::stats::ratio(&ta, &tb),
                (fb - fa) / fa * 100.0,
            );
        }
    }
}
