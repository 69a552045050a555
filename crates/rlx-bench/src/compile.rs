//! Compile time with and without the compile cache: each sample is a new process (this binary
//! run as `compile-child`) compiling the character GPT's training step, first against an empty
//! cache directory (a miss: the passes run and the entry is written), then against the filled
//! one (a hit read from disk), and in the same process a second compile from memory.

use crate::stats::Samples;
use rlx::models::Gpt;
use rlx::prelude::*;
use rlx::runtime::CompileCache;
use rlx::train::{Optimizer, Schedule, TrainConfig, Trainer};
use std::process::Command;
use std::time::Instant;

/// One `Trainer::new` (gradient graph, optimizer graph, compile) of the GPT step, in ms.
fn compile_once(session: &Session) -> f64 {
    let m = Gpt::new(crate::train::char_gpt()).expect("valid config");
    let g = m.training_graph(16).expect("valid graph");
    let names: Vec<String> = m.params().into_iter().map(|p| p.0).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let cfg = TrainConfig {
        optimizer: Optimizer::adamw(0.01),
        schedule: Schedule::Constant { lr: 1e-3 },
        clip_norm: None,
    };
    let t0 = Instant::now();
    let t = Trainer::new(&g, &refs, cfg, session).expect("trainer");
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    std::hint::black_box(t);
    ms
}

/// One compile of Gemma 3's one-token decode graph (context 4096, f16 cache, as `rlx generate`
/// builds it), in ms; the weights are not loaded (only the graph is compiled).
fn compile_gemma(session: &Session) -> f64 {
    let path = rlx::hub::ensure(rlx::hub::KnownModel::Gemma3, false).expect("Gemma 3 fetched");
    let f = rlx::gguf::GgufFile::open(&path).expect("gguf");
    let cfg = rlx::llm::LlmConfig::from_gguf(&f).expect("config");
    let spec = rlx::llm::StepSpec {
        tokens: 1,
        all_logits: false,
        ctx: cfg.ctx_train.min(4096),
        cache_dtype: DType::F16,
    };
    let g = rlx::llm::build_step(&cfg, &f, spec).expect("graph");
    let t0 = Instant::now();
    let c = session.try_compile(g).expect("compile");
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    std::hint::black_box(c);
    ms
}

/// The child: compile `what` (`gpt` or `gemma3`) with a cache in `dir`, then again in the same
/// process; print both times and what the cache answered.
pub fn child(what: &str, dir: &str) {
    let cache = CompileCache::at(dir);
    let s = Session::new(Device::Cpu).with_compile_cache(cache.clone());
    let once = |s: &Session| {
        if what == "gemma3" {
            compile_gemma(s)
        } else {
            compile_once(s)
        }
    };
    let first = once(&s);
    let again = once(&s);
    let st = cache.stats();
    println!("{first} {again} {} {}", st.disk_hits, st.misses);
}

fn run_child(what: &str, dir: &std::path::Path) -> (f64, f64, usize, usize) {
    let out = Command::new(std::env::current_exe().expect("own path"))
        .arg("compile-child")
        .arg(what)
        .arg(dir)
        .output()
        .expect("run child");
    let s = String::from_utf8_lossy(&out.stdout);
    let v: Vec<&str> = s.split_whitespace().collect();
    match v[..] {
        [a, b, h, m] => (
            a.parse().expect("ms"),
            b.parse().expect("ms"),
            h.parse().expect("count"),
            m.parse().expect("count"),
        ),
        _ => panic!(
            "compile-child printed {s:?}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// `rounds` pairs of new processes (empty cache, then filled cache) for each graph.
pub fn suite(rounds: usize) {
    println!("\n### Compiling in a new process without and with the compile cache, ms: median [min–max] of {rounds} processes each\n");
    println!("| graph | new process, empty cache | new process, entry on disk | miss / disk hit | same process, entry in memory | miss / memory hit |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (what, label) in [
        ("gpt", "character GPT training step (Trainer::new)"),
        ("gemma3", "Gemma 3 270M decode graph (compile only)"),
    ] {
        let (mut miss, mut disk, mut mem) =
            (Samples::default(), Samples::default(), Samples::default());
        for r in 0..rounds {
            let dir =
                std::env::temp_dir().join(format!("rlx-bench-cache-{}-{r}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let (a, a2, hits, misses) = run_child(what, &dir);
            assert_eq!((hits, misses), (0, 1), "the first process compiles");
            miss.push(a);
            mem.push(a2);
            let (b, _, hits, _) = run_child(what, &dir);
            assert_eq!(hits, 1, "the second process reads the entry");
            disk.push(b);
            let _ = std::fs::remove_dir_all(&dir);
        }
        println!(
            "| {label} | {} | {} | {} | {} | {} |",
            miss.show(2),
            disk.show(2),
            crate::stats::ratio(&miss, &disk),
            mem.show(2),
            crate::stats::ratio(&miss, &mem),
        );
    }
}
