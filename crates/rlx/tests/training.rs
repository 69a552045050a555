//! Training: optimizer updates against the published formulas computed on the host, schedules,
//! clipping, a small model that learns, and checkpoint round trips.

use rlx::prelude::*;
use rlx::train::{mse, softmax_cross_entropy, Optimizer, Schedule, TrainConfig, Trainer};

/// loss = sum(p * c): the gradient is `c` at every step, so updates are easy to follow.
fn linear(c: &[f32]) -> Graph {
    let mut g = Graph::new("linear");
    let p = g.param("p", Shape::new(&[c.len()], DType::F32));
    let k = g.constant_f32(&[c.len()], c);
    let y = g.mul(p, k);
    let l = g.sum(y, &[0], false);
    g.set_outputs(vec![l]);
    g
}

fn cfg(optimizer: Optimizer, lr: f32) -> TrainConfig {
    TrainConfig {
        optimizer,
        schedule: Schedule::Constant { lr },
        clip_norm: None,
    }
}

/// Host reference of `steps` updates with constant gradient `c`.
fn reference(opt: Optimizer, lr: f64, p0: &[f64], c: &[f64], steps: usize) -> Vec<f64> {
    let mut p = p0.to_vec();
    let (mut m, mut v) = (vec![0.0; p.len()], vec![0.0; p.len()]);
    for t in 1..=steps {
        for i in 0..p.len() {
            let g = c[i];
            match opt {
                Optimizer::Sgd { momentum, nesterov } => {
                    let mu = momentum as f64;
                    m[i] = mu * m[i] + g;
                    let d = if mu == 0.0 {
                        g
                    } else if nesterov {
                        g + mu * m[i]
                    } else {
                        m[i]
                    };
                    p[i] -= lr * d;
                }
                Optimizer::Adam { beta1, beta2, eps }
                | Optimizer::AdamW {
                    beta1, beta2, eps, ..
                } => {
                    let (b1, b2) = (beta1 as f64, beta2 as f64);
                    m[i] = b1 * m[i] + (1.0 - b1) * g;
                    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                    let mh = m[i] / (1.0 - b1.powi(t as i32));
                    let vh = v[i] / (1.0 - b2.powi(t as i32));
                    let mut d = mh / (vh.sqrt() + eps as f64);
                    if let Optimizer::AdamW { weight_decay, .. } = opt {
                        d += weight_decay as f64 * p[i];
                    }
                    p[i] -= lr * d;
                }
            }
        }
    }
    p
}

#[test]
fn optimizers_follow_their_update_rules() {
    let c = [0.5f32, -2.0, 3.0];
    let p0 = [1.0f32, 2.0, -1.0];
    let opts = [
        Optimizer::Sgd {
            momentum: 0.0,
            nesterov: false,
        },
        Optimizer::Sgd {
            momentum: 0.9,
            nesterov: false,
        },
        Optimizer::Sgd {
            momentum: 0.9,
            nesterov: true,
        },
        Optimizer::adam(),
        Optimizer::adamw(0.1),
    ];
    for opt in opts {
        let mut t = Trainer::new(
            &linear(&c),
            &["p"],
            cfg(opt, 0.05),
            &Session::new(Device::Cpu),
        )
        .unwrap();
        t.set_param("p", &p0).unwrap();
        for _ in 0..7 {
            t.step(&[]).unwrap();
        }
        let got = t.get_param("p").unwrap();
        let want = reference(opt, 0.05, &p0.map(f64::from), &c.map(f64::from), 7);
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (*g as f64 - w).abs() < 1e-5 * (1.0 + w.abs()),
                "{opt:?}: {got:?} vs {want:?}"
            );
        }
    }
}

#[test]
fn warmup_cosine_schedule_drives_the_step_size() {
    let sched = Schedule::WarmupCosine {
        lr: 0.1,
        min_lr: 0.01,
        warmup: 3,
        total: 10,
    };
    let c = [1.0f32];
    let mut t = Trainer::new(
        &linear(&c),
        &["p"],
        TrainConfig {
            optimizer: Optimizer::Sgd {
                momentum: 0.0,
                nesterov: false,
            },
            schedule: sched,
            clip_norm: None,
        },
        &Session::new(Device::Cpu),
    )
    .unwrap();
    let mut prev = t.get_param("p").unwrap()[0];
    for step in 1..=12u64 {
        assert!((t.next_lr() - sched.at(step)).abs() < 1e-7);
        t.step(&[]).unwrap();
        let p = t.get_param("p").unwrap()[0];
        let lr = prev - p; // gradient is 1
        assert!(
            (lr - sched.at(step)).abs() < 1e-6,
            "step {step}: lr {lr} vs {}",
            sched.at(step)
        );
        prev = p;
    }
    assert!(
        (sched.at(3) - 0.1).abs() < 1e-7
            && (sched.at(10) - 0.01).abs() < 1e-7
            && sched.at(1) < sched.at(2)
    );
}

#[test]
fn clipping_bounds_the_global_gradient_norm() {
    let c = [3.0f32, 4.0]; // norm 5
    let mut t = Trainer::new(
        &linear(&c),
        &["p"],
        TrainConfig {
            optimizer: Optimizer::Sgd {
                momentum: 0.0,
                nesterov: false,
            },
            schedule: Schedule::Constant { lr: 1.0 },
            clip_norm: Some(1.0),
        },
        &Session::new(Device::Cpu),
    )
    .unwrap();
    t.step(&[]).unwrap();
    let p = t.get_param("p").unwrap();
    assert!(
        (p[0] + 0.6).abs() < 1e-5 && (p[1] + 0.8).abs() < 1e-5,
        "{p:?}"
    );
}

/// A 2-layer MLP regressing y = sin(3x) on 64 points.
fn mlp() -> Graph {
    let mut g = Graph::new("mlp");
    let x = g.input("x", Shape::new(&[64, 1], DType::F32));
    let y = g.input("y", Shape::new(&[64, 1], DType::F32));
    let w1 = g.param("w1", Shape::new(&[1, 32], DType::F32));
    let b1 = g.param("b1", Shape::new(&[32], DType::F32));
    let w2 = g.param("w2", Shape::new(&[32, 1], DType::F32));
    let b2 = g.param("b2", Shape::new(&[1], DType::F32));
    let h = g.dot(x, w1);
    let h = g.add(h, b1);
    let h = g.activation(Activation::Tanh, h);
    let o = g.dot(h, w2);
    let o = g.add(o, b2);
    let l = mse(&mut g, o, y).unwrap();
    g.set_outputs(vec![l]);
    g
}

/// The MLP's trainer with freshly zeroed optimizer state and default (zero) params.
fn mlp_trainer_empty() -> Trainer {
    Trainer::new(
        &mlp(),
        &["w1", "b1", "w2", "b2"],
        TrainConfig {
            optimizer: Optimizer::adamw(1e-4),
            schedule: Schedule::WarmupCosine {
                lr: 0.05,
                min_lr: 0.005,
                warmup: 20,
                total: 400,
            },
            clip_norm: Some(5.0),
        },
        &Session::new(Device::Cpu),
    )
    .unwrap()
}

fn mlp_trainer() -> Trainer {
    let mut t = mlp_trainer_empty();
    let w1: Vec<f32> = (0..32)
        .map(|i| ((i * 37 % 17) as f32 - 8.0) / 4.0)
        .collect();
    let b1: Vec<f32> = (0..32).map(|i| ((i * 11 % 7) as f32 - 3.0) / 3.0).collect();
    let w2: Vec<f32> = (0..32)
        .map(|i| ((i * 23 % 13) as f32 - 6.0) / 20.0)
        .collect();
    t.set_param("w1", &w1).unwrap();
    t.set_param("b1", &b1).unwrap();
    t.set_param("w2", &w2).unwrap();
    t
}

fn data() -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..64).map(|i| i as f32 / 32.0 - 1.0).collect();
    let y = x.iter().map(|v| (3.0 * v).sin()).collect();
    (x, y)
}

#[test]
fn an_mlp_learns_and_the_step_returns_only_the_loss() {
    let mut t = mlp_trainer();
    let (x, y) = data();
    let first = t.step(&[("x", &x), ("y", &y)]).unwrap();
    let mut last = first;
    for _ in 0..300 {
        last = t.step(&[("x", &x), ("y", &y)]).unwrap();
    }
    assert!(last < first / 10.0, "loss went from {first} to {last}");
    assert_eq!(t.steps(), 301);
    // The step graph's only visible output is the loss; weights never leave the runtime.
    let out = rlx::train::Trainer::compiled(&t).outputs().len();
    assert_eq!(
        out,
        1 + 4 + 8,
        "loss + 4 params + 8 AdamW slots in the step graph"
    );
}

#[test]
fn resuming_from_a_checkpoint_gives_the_same_next_loss() {
    let (x, y) = data();
    let mut a = mlp_trainer();
    for _ in 0..25 {
        a.step(&[("x", &x), ("y", &y)]).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("rlx-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.safetensors");
    a.save(&path).unwrap();
    let next_a = a.step(&[("x", &x), ("y", &y)]).unwrap();
    let mut b = mlp_trainer_empty();
    b.load(&path).unwrap();
    assert_eq!(b.steps(), 25);
    let next_b = b.step(&[("x", &x), ("y", &y)]).unwrap();
    assert_eq!(next_a.to_bits(), next_b.to_bits(), "{next_a} vs {next_b}");
    assert_eq!(a.get_param("w1::m").unwrap(), b.get_param("w1::m").unwrap());
    // A checkpoint for another model is refused with a clear error.
    let mut other = Trainer::new(
        &linear(&[1.0]),
        &["p"],
        cfg(Optimizer::adam(), 0.1),
        &Session::new(Device::Cpu),
    )
    .unwrap();
    let e = other.load(&path).unwrap_err().to_string();
    assert!(e.contains("no tensor \"p\""), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn softmax_cross_entropy_matches_a_host_reference_and_is_stable() {
    let logits = [2.0f32, -1.0, 0.5, 80.0, 81.0, 79.0];
    let labels = [2.0f32, 1.0];
    let mut g = Graph::new("ce");
    let l = g.input("logits", Shape::new(&[2, 3], DType::F32));
    let y = g.input("labels", Shape::new(&[2], DType::I32));
    let ce = softmax_cross_entropy(&mut g, l, y).unwrap();
    g.set_outputs(vec![ce]);
    let got = Session::new(Device::Cpu)
        .compile(g)
        .run(&[("logits", &logits), ("labels", &labels)])[0][0] as f64;
    let row = |r: &[f32], k: usize| {
        let m = r.iter().cloned().fold(f32::MIN, f32::max) as f64;
        let lse = m + r.iter().map(|v| (*v as f64 - m).exp()).sum::<f64>().ln();
        lse - r[k] as f64
    };
    let want = (row(&logits[..3], 2) + row(&logits[3..], 1)) / 2.0;
    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
}

#[test]
fn malformed_checkpoints_are_errors_and_change_nothing() {
    let mut t = mlp_trainer();
    let before = t.get_param("w1").unwrap();
    for bytes in [
        &b""[..],
        b"\x08\x00\x00\x00\x00\x00\x00\x00{}",
        b"\xff\xff\xff\xff\xff\xff\xff\xff",
        b"not a checkpoint at all",
    ] {
        assert!(t.load_bytes(bytes).is_err());
    }
    assert_eq!(t.get_param("w1").unwrap(), before);
    assert_eq!(t.steps(), 0);
}

/// A small character GPT trained in f32 and under `AutoMixedBf16` from the same start on the
/// same (synthetic, learnable) sequences: the mixed step runs its products in bf16, keeps its
/// params and optimizer state in f32, and follows the f32 loss curve closely.
#[test]
fn auto_mixed_bf16_training_follows_the_f32_loss_curve() {
    use rlx::models::{Gpt, GptConfig};
    let model = Gpt::new(GptConfig {
        vocab: 16,
        ctx: 16,
        dim: 64,
        heads: 2,
        layers: 1,
    })
    .unwrap();
    let g = model.training_graph(4).unwrap();
    let names: Vec<String> = model.params().into_iter().map(|p| p.0).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut s = 7u64;
    let mut rand = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let init: Vec<(String, Vec<f32>)> = model
        .params()
        .into_iter()
        .map(|(n, shape, sc)| {
            let c: usize = shape.iter().product();
            let v = match sc {
                None => vec![1.0; c],
                Some(sc) => (0..c).map(|_| rand() * sc * 3.4).collect(),
            };
            (n, v)
        })
        .collect();
    let train = |policy: PrecisionPolicy| {
        let session = Session::new(Device::Cpu).with_precision(policy);
        let mut t = Trainer::new(&g, &refs, cfg(Optimizer::adamw(0.01), 3e-3), &session).unwrap();
        for (n, v) in &init {
            t.set_param(n, v).unwrap();
        }
        let mut losses = Vec::new();
        for step in 0..40 {
            // Sequences counting up by a step size that depends on the batch row.
            let tok: Vec<i32> = (0..4 * 16)
                .map(|i| (i % 16) * (1 + (i / 16 + step) % 3) % 16)
                .collect();
            let tgt: Vec<i32> = (0..4 * 16)
                .map(|i| ((i % 16) + 1) * (1 + (i / 16 + step) % 3) % 16)
                .collect();
            let b = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            let (tb, yb) = (b(&tok), b(&tgt));
            losses.push(
                t.step_typed(&[("tokens", &tb, DType::I32), ("targets", &yb, DType::I32)])
                    .unwrap(),
            );
        }
        (t, losses)
    };
    let (t32, l32) = train(PrecisionPolicy::AlwaysF32);
    let (tmix, lmix) = train(PrecisionPolicy::AutoMixedBf16);
    let products = |t: &Trainer| -> Vec<DType> {
        let g = t.compiled().graph();
        g.ids()
            .filter(|&i| g.node(i).op.kind() == OpKind::MatMul)
            .map(|i| g.shape(i).dtype())
            .collect()
    };
    assert!(products(&t32).iter().all(|&d| d == DType::F32));
    let low = products(&tmix);
    assert!(
        !low.is_empty() && low.iter().all(|&d| d == DType::BF16),
        "{low:?}"
    );
    // Trained params and optimizer slots keep their f32 master copies.
    assert!(tmix
        .compiled()
        .params()
        .iter()
        .all(|p| p.shape.dtype() == DType::F32));
    assert!(l32[39] < 0.6 * l32[0], "f32 learns: {l32:?}");
    for (s, (a, b)) in l32.iter().zip(&lmix).enumerate() {
        assert!(
            (a - b).abs() <= 0.02 * a.abs() + 1e-3,
            "step {s}: f32 loss {a}, mixed {b}\n{l32:?}\n{lmix:?}"
        );
    }
    // The runs differ (the policy is applied), by far less than training moves the loss.
    assert!(l32.iter().zip(&lmix).any(|(a, b)| a != b));
}
