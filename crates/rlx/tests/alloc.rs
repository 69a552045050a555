//! `run` allocates nothing beyond the vectors it returns: a counting global allocator watches
//! every allocation in the process (worker threads included) across repeated runs.

use rlx::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A small transformer-ish block touching GEMM, broadcasting, views, reductions and norms.
fn block() -> Graph {
    let mut g = Graph::new("block");
    let x = g.input("x", Shape::new(&[64, 96], DType::F32));
    let ids = g.input("ids", Shape::new(&[8], DType::I32));
    let w1 = g.param("w1", Shape::new(&[96, 128], DType::F32));
    let b1 = g.param("b1", Shape::new(&[128], DType::F32));
    let gamma = g.param("gamma", Shape::new(&[128], DType::F32));
    let h = g.dot(x, w1);
    let h = g.add(h, b1);
    let h = g.activation(Activation::Gelu, h);
    let h = g.rms_norm(h, gamma, 1e-6);
    let t = g.transpose(h, &[1, 0]);
    let s = g.softmax(t, 1);
    let r = g.sum(s, &[0], false);
    let e = g.gather(h, ids, 0);
    let q = g.reshape(h, &[1, 2, 32, 128]);
    let a = g.attention(q, q, q, MaskKind::Causal, 0.1);
    g.set_outputs(vec![r, e, a]);
    g
}

#[test]
fn run_allocates_only_its_outputs() {
    let mut c = Session::new(Device::Cpu).with_threads(2).compile(block());
    c.set_param("w1", &vec![0.01; 96 * 128]);
    c.set_param("b1", &vec![0.1; 128]);
    c.set_param("gamma", &vec![1.0; 128]);
    let x: Vec<f32> = (0..64 * 96).map(|i| (i % 17) as f32 / 17.0).collect();
    let ids: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let inputs: [(&str, &[f32]); 2] = [("x", &x), ("ids", &ids)];
    let first = c.run(&inputs); // warm up lazily created state (thread pool, CPU feature detection)
    const RUNS: usize = 20;
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..RUNS {
        let out = c.run(&inputs);
        assert_eq!(out.len(), 3);
    }
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCS.load(Ordering::SeqCst);
    // One outer Vec plus one Vec per output, per run.
    assert_eq!(n, RUNS * (1 + 3), "run allocated {n} times in {RUNS} runs");
    assert_eq!(c.run(&inputs), first, "repeated runs are deterministic");
}
