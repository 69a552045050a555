//! Training-step benchmark: RLX's compiled step (forward + backward + AdamW) against JAX `jit`
//! and PyTorch eager running the same models, alternating blocks in one run.

use crate::stats::Samples;
use rlx::models::{Gpt, GptConfig};
use rlx::prelude::*;
use rlx::train::{softmax_cross_entropy, Optimizer, Schedule, TrainConfig, Trainer};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The python that has jax and torch (the train-bench venv, or the one given).
pub fn reference_python(given: Option<&str>) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    match given {
        Some(p) => PathBuf::from(p),
        None => {
            let p = root.join(".venv-train/bin/python");
            if !p.exists() {
                eprintln!("rlx-bench: no {}; run scripts/setup-train-bench-pyenv.sh (installs jax and torch, several GB) or pass --train-python / --no-numpy", p.display());
                std::process::exit(1);
            }
            p
        }
    }
}

/// The benchmark GPT: `examples/char_gpt`'s (vocab 60, context 64, width 128, 4 heads, 2 layers).
pub(crate) fn char_gpt() -> GptConfig {
    GptConfig {
        vocab: 60,
        ctx: 64,
        dim: 128,
        heads: 4,
        layers: 2,
    }
}

fn config() -> TrainConfig {
    TrainConfig {
        optimizer: Optimizer::adamw(0.01),
        schedule: Schedule::Constant { lr: 1e-3 },
        clip_norm: None,
    }
}

/// The benchmark MLP: 256 → 512 → 512 → 10, GELU (tanh), softmax cross-entropy, batch 64.
fn mlp_graph() -> (Graph, Vec<(String, Vec<usize>)>) {
    let mut g = Graph::new("mlp");
    let x = g.input("x", Shape::new(&[64, 256], DType::F32));
    let y = g.input("labels", Shape::new(&[64], DType::I32));
    let dims = [(256, 512), (512, 512), (512, 10)];
    let mut h = x;
    let mut params = Vec::new();
    for (i, (a, b)) in dims.iter().enumerate() {
        let w = g.param(&format!("w{i}"), Shape::new(&[*a, *b], DType::F32));
        let bias = g.param(&format!("b{i}"), Shape::new(&[*b], DType::F32));
        params.push((format!("w{i}"), vec![*a, *b]));
        params.push((format!("b{i}"), vec![*b]));
        h = g.dot(h, w);
        h = g.add(h, bias);
        if i + 1 < dims.len() {
            h = g.activation(Activation::GeluApprox, h);
        }
    }
    let l = softmax_cross_entropy(&mut g, h, y).expect("valid shapes");
    g.set_outputs(vec![l]);
    (g, params)
}

/// `n` values uniform in `[-scale, scale)` from a xorshift seeded with `seed`.
pub(crate) fn fill(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        })
        .collect()
}

fn i32_bytes(v: impl Iterator<Item = i32>) -> Vec<u8> {
    v.flat_map(|x| x.to_le_bytes()).collect()
}

struct Model {
    name: &'static str,
    trainer: Trainer,
    feeds: Vec<(String, Vec<u8>, DType)>,
    grad_build_s: f64,
    compile_s: f64,
}

fn build(name: &'static str, threads: usize) -> Model {
    let session = Session::new(Device::Cpu).with_threads(threads);
    type Feeds = Vec<(String, Vec<u8>, DType)>;
    let (g, params, feeds): (Graph, Vec<(String, Vec<usize>)>, Feeds) = match name {
        "mlp" => {
            let (g, p) = mlp_graph();
            let x: Vec<u8> = fill(64 * 256, 3, 1.0)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let y = i32_bytes((0..64).map(|i| i * 7 % 10));
            (
                g,
                p,
                vec![
                    ("x".into(), x, DType::F32),
                    ("labels".into(), y, DType::I32),
                ],
            )
        }
        _ => {
            let m = Gpt::new(char_gpt()).expect("valid config");
            let g = m.training_graph(16).expect("valid graph");
            let p = m.params().into_iter().map(|(n, s, _)| (n, s)).collect();
            let t = i32_bytes((0..16 * 64).map(|i| i * 13 % 60));
            let y = i32_bytes((0..16 * 64).map(|i| (i + 1) * 13 % 60));
            (
                g,
                p,
                vec![
                    ("tokens".into(), t, DType::I32),
                    ("targets".into(), y, DType::I32),
                ],
            )
        }
    };
    // Time the gradient transform alone, then the whole trainer build (transform + compile).
    let wrt: Vec<NodeId> = params
        .iter()
        .map(|(n, _)| g.find_leaf(n).expect("param"))
        .collect();
    let t0 = Instant::now();
    let gg = rlx::autodiff::grad_with_loss(&g, &wrt).expect("differentiable");
    let grad_build_s = t0.elapsed().as_secs_f64();
    std::hint::black_box(gg);
    let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    let t1 = Instant::now();
    let mut trainer = Trainer::new(&g, &names, config(), &session).expect("trainer");
    let compile_s = t1.elapsed().as_secs_f64();
    for (i, (n, s)) in params.iter().enumerate() {
        let count: usize = s.iter().product();
        let scale = if s.len() == 1 {
            0.0
        } else {
            1.0 / (s[0] as f32).sqrt()
        };
        let v = if n.contains("norm") {
            vec![1.0; count]
        } else {
            fill(count, 100 + i as u64, scale)
        };
        trainer.set_param(n, &v).expect("param");
    }
    Model {
        name,
        trainer,
        feeds,
        grad_build_s,
        compile_s,
    }
}

fn step(m: &mut Model) -> f32 {
    let f: Vec<(&str, &[u8], DType)> = m
        .feeds
        .iter()
        .map(|(n, b, d)| (n.as_str(), b.as_slice(), *d))
        .collect();
    m.trainer.step_typed(&f).expect("step")
}

fn reference(py: &Path, framework: &str, model: &str, threads: usize, steps: usize) -> Vec<f64> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/train_ref.py");
    let out = Command::new(py)
        .arg(&script)
        .args([
            "--framework",
            framework,
            "--model",
            model,
            "--threads",
            &threads.to_string(),
            "--steps",
            &steps.to_string(),
        ])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", py.display()));
    if !out.status.success() {
        panic!(
            "train_ref.py {framework} {model} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    v["times_s"]
        .as_array()
        .expect("times")
        .iter()
        .filter_map(|x| x.as_f64())
        .map(|s| s * 1e3)
        .collect()
}

/// Run the suite for each thread count.
pub fn suite(threads: &[usize], rounds: usize, reps: usize, py: Option<PathBuf>) {
    let mut builds = Vec::new();
    println!("\n### Training step (forward + backward + AdamW), ms per step: median [min–max]\n");
    println!("| model | threads | RLX | JAX jit | PyTorch eager | JAX / RLX | PyTorch / RLX |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for &t in threads {
        for name in ["mlp", "gpt"] {
            let mut m = build(name, t);
            builds.push((name, t, m.grad_build_s, m.compile_s));
            for _ in 0..3 {
                step(&mut m);
            }
            let (mut ours, mut jax, mut torch) =
                (Samples::default(), Samples::default(), Samples::default());
            // The order rotates every round, so no framework always runs right after another
            // (the host may slow whatever follows a heavy process).
            for round in 0..rounds {
                for turn in 0..3 {
                    match (round + turn) % 3 {
                        0 => {
                            // Three warm-up steps per block, as the reference script gives
                            // JAX and PyTorch (train_ref.py --warmup 3).
                            for _ in 0..3 {
                                step(&mut m);
                            }
                            for _ in 0..reps {
                                let t0 = Instant::now();
                                step(&mut m);
                                ours.push(t0.elapsed().as_secs_f64() * 1e3);
                            }
                        }
                        1 => {
                            if let Some(py) = &py {
                                jax.extend(reference(py, "jax", name, t, reps));
                            }
                        }
                        _ => {
                            if let Some(py) = &py {
                                torch.extend(reference(py, "torch", name, t, reps));
                            }
                        }
                    }
                }
            }
            let inv = |a: &Samples, b: &Samples| crate::stats::ratio(a, b);
            println!(
                "| {} | {t} | {} | {} | {} | {} | {} |",
                m.name,
                ours.show(2),
                jax.show(2),
                torch.show(2),
                inv(&jax, &ours),
                inv(&torch, &ours)
            );
        }
    }
    println!("\n### Building the training step (RLX)\n");
    println!("| model | threads | grad_with_loss (graph transform) | Trainer::new (transform + optimizer + compile) |");
    println!("|---|---:|---:|---:|");
    for (n, t, g, c) in builds {
        println!("| {n} | {t} | {:.2} ms | {:.2} ms |", g * 1e3, c * 1e3);
    }
}
