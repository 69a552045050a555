//! The serving engine on `Device::Cuda` with the CUDA backend's programs run in host emulation
//! (`rlx_cuda::emulate`): a tiny Llama with random weights (two layers, so emulation is quick),
//! served through the engine's paged cache, chunked prompts and shared params. Each request's
//! greedy tokens are the same decoded beside the others as alone and after preemption, and its
//! first token is the CPU engine's.

mod common;
use common::tiny::{greedy_tokens as run_all, tiny_llama};
use rlx::serve::{Engine, EngineOptions};
use rlx::Device;

#[test]
fn the_engine_on_cuda_programs_keeps_each_requests_tokens_beside_others_and_after_preemption() {
    // This process only: Device::Cuda runs the CUDA backend's programs on the host.
    rlx::driver::register_backend(
        Device::Cuda,
        std::sync::Arc::new(rlx_cuda::emulate::EmulatedBackend),
    );
    let path = tiny_llama();
    // Prompts of 1 to 40 tokens: the long ones are computed in pieces of at least 16 rows.
    let prompts: Vec<Vec<u32>> = [3usize, 1, 9, 40, 17, 6]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            (0..len)
                .map(|j| (7 + 31 * i + 13 * j) as u32 % 380 + 3)
                .collect()
        })
        .collect();
    let n = 24;
    let load = |device: Device, parallel: usize, ctx_size: Option<usize>| {
        Engine::load(
            &path,
            EngineOptions {
                parallel,
                ctx_size,
                prefill_budget: 32,
                device,
                ..EngineOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("loading the engine on {device:?}: {e}"))
    };
    let cpu = run_all(&mut load(Device::Cpu, prompts.len(), None), &prompts, n);
    let alone = run_all(&mut load(Device::Cuda, 1, None), &prompts, n);
    let mut engine = load(Device::Cuda, prompts.len(), None);
    let together = run_all(&mut engine, &prompts, n);
    assert!(
        engine.stats().steps < (prompts.len() * n) as u64,
        "rows were batched: {:?}",
        engine.stats()
    );
    // The short prompts fit a cache of three blocks at first, then outgrow it while decoding.
    let short = [0, 1, 2, 5];
    let some: Vec<Vec<u32>> = short.iter().map(|&i| prompts[i].clone()).collect();
    let mut small = load(Device::Cuda, some.len(), Some(48));
    let preempted = run_all(&mut small, &some, n);
    assert!(small.stats().preemptions > 0, "{:?}", small.stats());
    for i in 0..prompts.len() {
        assert_eq!(alone[i].len(), n, "prompt {i} stopped early");
        assert_eq!(together[i], alone[i], "prompt {i} beside the others");
        // Random weights magnify rounding differences between backends (an activation
        // rounded to the next int8 level): the prompt's own result, not the whole run, is
        // compared with the CPU.
        assert_eq!(
            alone[i][0], cpu[i][0],
            "prompt {i}: CUDA programs and the CPU"
        );
    }
    for (k, &i) in short.iter().enumerate() {
        assert_eq!(preempted[k], alone[i], "prompt {i} after preemption");
    }
    let _ = std::fs::remove_file(&path);
}
