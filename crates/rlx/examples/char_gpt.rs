//! Train a small character-level GPT on the Book of Genesis (KJV, public domain) with RLX's
//! autodiff and AdamW, then sample from it.
//!
//! ```sh
//! cargo run --release -p rlx --example char_gpt                 # defaults: 2 layers, 600 steps
//! cargo run --release -p rlx --example char_gpt -- --help
//! ```
//!
//! Writes `loss.svg` (train and validation loss per step) and `char_gpt.safetensors` into
//! `--out` (default `target/char_gpt`), and prints the unigram baseline it must beat.

use indicatif::{ProgressBar, ProgressStyle};
use rlx::models::{Gpt, GptConfig};
use rlx::prelude::*;
use rlx::train::{Optimizer, Schedule, TrainConfig, Trainer};
use std::time::Instant;

const HELP: &str = "\
char_gpt: train a character-level GPT on Genesis (KJV) with RLX, then sample text

OPTIONS:
    --steps N      training steps                  [default: 600]
    --layers N     transformer blocks              [default: 2]
    --dim N        model width                     [default: 128]
    --heads N      attention heads                 [default: 4]
    --ctx N        context length (characters)     [default: 64]
    --batch N      sequences per step              [default: 16]
    --lr F         peak learning rate (AdamW)      [default: 0.003]
    --threads N    CPU threads                     [default: all cores]
    --precision P  f32, auto_mixed_bf16 (products in bf16), auto_mixed (f16), always_bf16,
                   always_f16                      [default: f32]
    --sample N     characters to sample at the end [default: 400]
    --out DIR      where loss.svg and the checkpoint go [default: target/char_gpt]
    --seed N       data order, init and sampling seed   [default: 1]";

#[derive(Clone)]
struct Cfg {
    steps: usize,
    layers: usize,
    dim: usize,
    heads: usize,
    ctx: usize,
    batch: usize,
    lr: f32,
    threads: Option<usize>,
    precision: PrecisionPolicy,
    sample: usize,
    out: std::path::PathBuf,
    seed: u64,
}

fn parse() -> Cfg {
    let mut c = Cfg {
        steps: 600,
        layers: 2,
        dim: 128,
        heads: 4,
        ctx: 64,
        batch: 16,
        lr: 3e-3,
        threads: None,
        precision: PrecisionPolicy::AlwaysF32,
        sample: 400,
        out: "target/char_gpt".into(),
        seed: 1,
    };
    let mut a = std::env::args().skip(1);
    while let Some(k) = a.next() {
        if k == "-h" || k == "--help" {
            println!("{HELP}");
            std::process::exit(0);
        }
        let v = a
            .next()
            .unwrap_or_else(|| fail(&format!("{k} needs a value")));
        let n = || {
            v.parse::<usize>()
                .unwrap_or_else(|_| fail(&format!("{k}: not a whole number: {v}")))
        };
        match k.as_str() {
            "--steps" => c.steps = n(),
            "--layers" => c.layers = n(),
            "--dim" => c.dim = n(),
            "--heads" => c.heads = n(),
            "--ctx" => c.ctx = n(),
            "--batch" => c.batch = n(),
            "--threads" => c.threads = Some(n()),
            "--sample" => c.sample = n(),
            "--seed" => c.seed = n() as u64,
            "--lr" => {
                c.lr = v
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("--lr: not a number: {v}")))
            }
            "--out" => c.out = v.into(),
            "--precision" => {
                c.precision = PrecisionPolicy::from_name(&v)
                    .unwrap_or_else(|| fail(&format!("--precision: unknown policy {v}")))
            }
            _ => fail(&format!("unknown option {k}")),
        }
    }
    if !c.dim.is_multiple_of(c.heads) {
        fail("--dim must be a multiple of --heads");
    }
    c
}

fn fail(msg: &str) -> ! {
    eprintln!("char_gpt: {msg} (see --help)");
    std::process::exit(2)
}

/// A small deterministic generator for data order, init and sampling.
struct Rng(u64);
impl Rng {
    fn u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.f32().max(1e-7), self.f32());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f32::consts::PI * v).cos()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.u64() % n as u64) as usize
    }
}

fn gpt(c: &Cfg, vocab: usize) -> Gpt {
    Gpt::new(GptConfig {
        vocab,
        ctx: c.ctx,
        dim: c.dim,
        heads: c.heads,
        layers: c.layers,
    })
    .unwrap_or_else(|e| fail(&e.to_string()))
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A batch of random windows from `ids`: inputs and next-character targets.
fn batch(ids: &[i32], c: &Cfg, rng: &mut Rng) -> (Vec<i32>, Vec<i32>) {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for _ in 0..c.batch {
        let s = rng.below(ids.len() - c.ctx - 1);
        x.extend_from_slice(&ids[s..s + c.ctx]);
        y.extend_from_slice(&ids[s + 1..s + c.ctx + 1]);
    }
    (x, y)
}

fn svg(train: &[(usize, f32)], val: &[(usize, f32)], baseline: f32, steps: usize) -> String {
    let (w, h, m) = (720.0, 360.0, 50.0);
    let ymax = train
        .iter()
        .chain(val)
        .map(|p| p.1)
        .fold(baseline, f32::max)
        * 1.05;
    let x = |s: usize| m + (w - 2.0 * m) * s as f32 / steps.max(1) as f32;
    let y = |l: f32| h - m - (h - 2.0 * m) * l / ymax;
    let line = |pts: &[(usize, f32)], color: &str| {
        let p: Vec<String> = pts
            .iter()
            .map(|&(s, l)| format!("{:.1},{:.1}", x(s), y(l)))
            .collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
            p.join(" ")
        )
    };
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n");
    s += &format!("<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n");
    s += &format!(
        "<line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - m,
        w - m,
        h - m
    );
    s += &format!(
        "<line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - m
    );
    for i in 0..=4 {
        let l = ymax * i as f32 / 4.0;
        s += &format!("<text x=\"5\" y=\"{:.1}\">{l:.2}</text>\n", y(l) + 4.0);
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\">step ({steps})</text>\n",
        w / 2.0 - 20.0,
        h - 15.0
    );
    s += &format!("<line x1=\"{m}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"gray\" stroke-dasharray=\"4\"/>\n", y(baseline), w - m);
    s += &line(train, "#1f77b4");
    s += "\n";
    s += &line(val, "#d62728");
    s += &format!("\n<text x=\"{}\" y=\"20\"><tspan fill=\"#1f77b4\">train loss</tspan>  <tspan fill=\"#d62728\">validation loss</tspan>  <tspan fill=\"gray\">unigram baseline {baseline:.3}</tspan> (nats/char)</text>\n</svg>\n", m);
    s
}

fn main() {
    let c = parse();
    let text = include_str!("data/genesis.txt");
    let mut chars: Vec<char> = text
        .chars()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    chars.sort_unstable();
    let vocab = chars.len();
    let ids: Vec<i32> = text
        .chars()
        .map(|ch| chars.binary_search(&ch).expect("in vocab") as i32)
        .collect();
    let split = ids.len() * 9 / 10;
    let (train_ids, val_ids) = (&ids[..split], &ids[split..]);
    // Unigram baseline: the entropy of the training characters, in nats.
    let mut counts = vec![0usize; vocab];
    train_ids.iter().for_each(|&i| counts[i as usize] += 1);
    let baseline: f32 = counts
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| {
            let p = n as f64 / train_ids.len() as f64;
            -(p * p.ln()) as f32
        })
        .sum();
    println!(
        "Genesis: {} characters, vocabulary {vocab}; unigram baseline {baseline:.3} nats/char",
        ids.len()
    );

    let mut session = Session::new(Device::Cpu).with_precision(c.precision.clone());
    if let Some(t) = c.threads {
        session = session.with_threads(t);
    }
    let t0 = Instant::now();
    let model = gpt(&c, vocab);
    let g = model.training_graph(c.batch).unwrap();
    let names: Vec<String> = model.params().into_iter().map(|p| p.0).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let config = TrainConfig {
        optimizer: Optimizer::adamw(0.01),
        schedule: Schedule::WarmupCosine {
            lr: c.lr,
            min_lr: c.lr / 10.0,
            warmup: (c.steps / 20).max(1) as u64,
            total: c.steps as u64,
        },
        clip_norm: Some(1.0),
    };
    let mut trainer =
        Trainer::new(&g, &refs, config, &session).unwrap_or_else(|e| fail(&e.to_string()));
    println!(
        "built and compiled the training step ({} nodes) in {:.2} s",
        trainer.compiled().graph().len(),
        t0.elapsed().as_secs_f64()
    );
    let mut rng = Rng(0x9e3779b97f4a7c15 ^ c.seed);
    for (name, shape, scale) in model.params() {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = match scale {
            None => vec![1.0; n],
            Some(s) => (0..n).map(|_| rng.normal() * s).collect(),
        };
        trainer.set_param(&name, &v).unwrap();
    }
    // Validation: a forward-only graph with its own copy of the weights.
    let mut eval = session.compile(model.training_graph(c.batch).unwrap());
    let mut vrng = Rng(12345);
    let val_batches: Vec<(Vec<i32>, Vec<i32>)> =
        (0..4).map(|_| batch(val_ids, &c, &mut vrng)).collect();
    let mut val_loss = |trainer: &Trainer| -> f32 {
        for n in &names {
            eval.set_param(n, &trainer.get_param(n).unwrap());
        }
        let mut s = 0.0;
        for (x, y) in &val_batches {
            let (xb, yb) = (i32_bytes(x), i32_bytes(y));
            let o = eval.run_typed(&[("tokens", &xb, DType::I32), ("targets", &yb, DType::I32)]);
            s += f32::from_le_bytes(o[0].0[..4].try_into().unwrap());
        }
        s / val_batches.len() as f32
    };

    let bar = ProgressBar::new(c.steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}] {msg}").unwrap(),
    );
    let (mut train_curve, mut val_curve) = (Vec::new(), Vec::new());
    val_curve.push((0, val_loss(&trainer)));
    let start = Instant::now();
    let mut smooth = None;
    for step in 1..=c.steps {
        let (x, y) = batch(train_ids, &c, &mut rng);
        let (xb, yb) = (i32_bytes(&x), i32_bytes(&y));
        let loss = trainer
            .step_typed(&[("tokens", &xb, DType::I32), ("targets", &yb, DType::I32)])
            .unwrap();
        train_curve.push((step, loss));
        let s = smooth.map_or(loss, |p: f32| 0.95 * p + 0.05 * loss);
        smooth = Some(s);
        bar.set_message(format!(
            "loss {s:.3}  {:.1} steps/s",
            step as f64 / start.elapsed().as_secs_f64()
        ));
        bar.inc(1);
        if step % (c.steps / 10).max(1) == 0 || step == c.steps {
            val_curve.push((step, val_loss(&trainer)));
        }
    }
    bar.finish();
    let secs = start.elapsed().as_secs_f64();
    let final_val = val_curve.last().unwrap().1;
    println!(
        "{} steps in {secs:.1} s ({:.1} steps/s); validation loss {:.3} -> {final_val:.3} nats/char (unigram baseline {baseline:.3})",
        c.steps,
        c.steps as f64 / secs,
        val_curve[0].1
    );
    std::fs::create_dir_all(&c.out)
        .unwrap_or_else(|e| fail(&format!("creating {}: {e}", c.out.display())));
    let svg_path = c.out.join("loss.svg");
    std::fs::write(&svg_path, svg(&train_curve, &val_curve, baseline, c.steps)).unwrap();
    let ckpt = c.out.join("char_gpt.safetensors");
    trainer.save(&ckpt).unwrap();
    println!("wrote {} and {}", svg_path.display(), ckpt.display());

    // Sampling: batch 1, the last `ctx` characters as context (left-padded with newlines).
    let mut sg = Graph::new("char_gpt_sample");
    let tokens = sg.input("tokens", Shape::new(&[1, c.ctx], DType::I32));
    let logits = model.logits(&mut sg, 1, tokens).unwrap();
    sg.set_outputs(vec![logits]);
    let mut sampler = session.compile(sg);
    for n in &names {
        sampler.set_param(n, &trainer.get_param(n).unwrap());
    }
    let nl = chars.binary_search(&'\n').unwrap_or(0) as i32;
    let prompt = "And God said";
    let mut out: Vec<i32> = prompt
        .chars()
        .map(|ch| chars.binary_search(&ch).map(|i| i as i32).unwrap_or(nl))
        .collect();
    let mut srng = Rng(0xabcdef ^ c.seed);
    for _ in 0..c.sample {
        let mut ctx = vec![nl; c.ctx.saturating_sub(out.len())];
        ctx.extend_from_slice(&out[out.len().saturating_sub(c.ctx)..]);
        let o = sampler.run_typed(&[("tokens", &i32_bytes(&ctx), DType::I32)]);
        let row = (c.ctx - 1) * vocab;
        let l: Vec<f32> = o[0].0[row * 4..(row + vocab) * 4]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // Temperature 0.8.
        let m = l.iter().cloned().fold(f32::MIN, f32::max);
        let p: Vec<f32> = l.iter().map(|v| ((v - m) / 0.8).exp()).collect();
        let total: f32 = p.iter().sum();
        let mut r = srng.f32() * total;
        let mut pick = vocab - 1;
        for (i, pi) in p.iter().enumerate() {
            if r < *pi {
                pick = i;
                break;
            }
            r -= pi;
        }
        out.push(pick as i32);
    }
    let sample: String = out.iter().map(|&i| chars[i as usize]).collect();
    println!("--- sample ---\n{sample}\n--------------");
}
