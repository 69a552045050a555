//! Fuzz checkpoint loading: any bytes must load cleanly or give an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlx::prelude::*;
use rlx::train::{Optimizer, Schedule, TrainConfig, Trainer};
use std::sync::Mutex;

fn trainer() -> Trainer {
    let mut g = Graph::new("fuzz");
    let p = g.param("p", Shape::new(&[3], DType::F32));
    let q = g.param("q", Shape::new(&[2, 2], DType::F32));
    let s = g.sum(p, &[0], false);
    let t = g.sum(q, &[0, 1], false);
    let l = g.add(s, t);
    g.set_outputs(vec![l]);
    let cfg = TrainConfig { optimizer: Optimizer::adam(), schedule: Schedule::Constant { lr: 0.1 }, clip_norm: None };
    Trainer::new(&g, &["p", "q"], cfg, &Session::new(Device::Cpu).with_threads(1)).expect("a valid model")
}

static T: Mutex<Option<Trainer>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut guard = T.lock().unwrap();
    let t = guard.get_or_insert_with(trainer);
    let _ = t.load_bytes(data);
});
