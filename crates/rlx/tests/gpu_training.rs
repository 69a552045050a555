//! The char-GPT training step (forward, backward, AdamW with warmup and clipping) on the GPU
//! (lavapipe in CI): five steps give the CPU's losses within 1e-4, and the trained weights
//! agree. The same graph and passes, another backend.

mod common;

use common::gpt::train;
use rlx::prelude::*;

#[test]
fn five_adamw_steps_on_the_gpu_match_the_cpu() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let (cpu, cpu_w) = train(Device::Cpu, 5);
    let (gpu, gpu_w) = train(Device::Gpu, 5);
    for (s, (a, b)) in cpu.iter().zip(&gpu).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4,
            "step {}: CPU loss {a}, GPU loss {b} (all: {cpu:?} vs {gpu:?})",
            s + 1
        );
    }
    assert!(cpu[4] < cpu[0], "the model learns: {cpu:?}");
    let worst = cpu_w
        .iter()
        .zip(&gpu_w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "trained weights differ by {worst}");
}
