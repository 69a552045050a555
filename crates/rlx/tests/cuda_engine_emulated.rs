//! The serving engine on `Device::Cuda` with the CUDA backend's programs run in host emulation
//! (`rlx_cuda::emulate`): a tiny Llama with random weights (two layers, so emulation is quick),
//! served through the engine's paged cache, chunked prompts and shared params. Each request's
//! greedy tokens are the same decoded beside the others as alone and after preemption, and
//! every step's log-probabilities are the CPU engine's (within a stated bound) while the two
//! give the same tokens.

mod common;
use common::tiny::{greedy_tokens as run_all, greedy_with_logprobs, tiny_llama};
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
    let vocab = 384;
    let cpu = greedy_with_logprobs(&mut load(Device::Cpu, 1, None), &prompts, n, vocab);
    let alone_lp = greedy_with_logprobs(&mut load(Device::Cuda, 1, None), &prompts, n, vocab);
    let alone: Vec<Vec<u32>> = alone_lp
        .iter()
        .map(|r| r.iter().map(|(t, _)| *t).collect())
        .collect();
    // Every step's log-softmax (the logits up to their common shift) against the CPU engine's
    // at the same step, while the two have given the same tokens. Almost every step agrees to
    // f32 rounding; a step where an activation lands on the other side of an int8 rounding
    // boundary (the two sum in other orders) moves the log-probabilities by up to a few
    // tenths in this random model. Where the two part, the CPU's two candidates must be
    // within such a step of each other (a near-tie), not a real numerical error.
    let (f32_level, flip) = (1e-5f32, 0.25f32);
    let (mut compared, mut close) = (0, 0);
    for i in 0..prompts.len() {
        for (step, ((tc, lc), (tg, lg))) in cpu[i].iter().zip(&alone_lp[i]).enumerate() {
            let d = lc
                .iter()
                .zip(lg)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                d <= flip,
                "prompt {i} step {step}: CUDA programs' log-probabilities are {d} from the CPU's"
            );
            compared += 1;
            close += (d <= f32_level) as usize;
            if tc != tg {
                let margin = lc[*tc as usize] - lc[*tg as usize];
                assert!(
                    margin <= 2.0 * flip,
                    "prompt {i} step {step}: CPU {tc}, CUDA programs {tg}, but the CPU's margin is {margin}"
                );
                eprintln!("prompt {i}: parts from the CPU at step {step} (CPU margin {margin:.3})");
                break;
            }
        }
    }
    eprintln!("{close} of {compared} steps within {f32_level:e} of the CPU's log-probabilities");
    assert!(
        compared >= 100,
        "only {compared} steps compared with the CPU"
    );
    assert!(
        close * 10 >= compared * 9,
        "only {close} of {compared} steps within {f32_level:e} of the CPU's"
    );
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
    }
    for (k, &i) in short.iter().enumerate() {
        assert_eq!(preempted[k], alone[i], "prompt {i} after preemption");
    }
    let _ = std::fs::remove_file(&path);
}
