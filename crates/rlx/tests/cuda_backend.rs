//! The CUDA backend where this machine allows: without a driver, `Device::Cuda` is unavailable
//! and a compile is a named error (never a panic); without a GPU, the training step of the
//! char GPT (forward, backward, AdamW with clipping) and an MLP under every precision policy
//! lower for CUDA and every kernel they launch compiles with NVRTC for sm_80 and sm_90. The
//! tests named `needs_cuda_device_*` run on a GPU (`scripts/gpu-check.sh`).

mod common;

use common::gpt::train;
use rlx::models::{Gpt, GptConfig};
use rlx::prelude::*;
use rlx::train::{Optimizer, Schedule, TrainConfig};

fn gpt() -> (Gpt, GptConfig) {
    let config = GptConfig {
        vocab: 17,
        ctx: 8,
        dim: 16,
        heads: 2,
        layers: 1,
    };
    (Gpt::new(config).unwrap(), config)
}

fn train_config() -> TrainConfig {
    TrainConfig {
        optimizer: Optimizer::adamw(0.01),
        schedule: Schedule::WarmupCosine {
            lr: 1e-2,
            min_lr: 1e-3,
            warmup: 2,
            total: 5,
        },
        clip_norm: Some(1.0),
    }
}

/// The GPT's training step graph.
fn step_graph() -> Graph {
    let (model, _) = gpt();
    let g = model.training_graph(2).unwrap();
    let names: Vec<String> = model.params().into_iter().map(|p| p.0).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    rlx::train::step_graph(&g, &refs, &train_config()).unwrap()
}

/// A two-layer MLP `relu(x W1 + b1) W2 + b2`.
fn mlp() -> Graph {
    let mut g = Graph::new("mlp");
    let x = g.input("x", Shape::new(&[4, 8], DType::F32));
    let w1 = g.param("w1", Shape::new(&[8, 16], DType::F32));
    let b1 = g.param("b1", Shape::new(&[16], DType::F32));
    let w2 = g.param("w2", Shape::new(&[16, 3], DType::F32));
    let b2 = g.param("b2", Shape::new(&[3], DType::F32));
    let h = g.try_op(Op::MatMul, &[x, w1]).unwrap();
    let h = g.add(h, b1);
    let h = g.activation(Activation::Relu, h);
    let y = g.try_op(Op::MatMul, &[h, w2]).unwrap();
    let y = g.add(y, b2);
    g.set_outputs(vec![y]);
    g
}

fn policies() -> Vec<PrecisionPolicy> {
    vec![
        PrecisionPolicy::AlwaysF32,
        PrecisionPolicy::AutoMixedBf16,
        PrecisionPolicy::AutoMixed,
        PrecisionPolicy::AlwaysBf16,
        PrecisionPolicy::AlwaysF16,
    ]
}

#[test]
fn without_a_driver_cuda_is_unavailable_and_compiling_is_a_named_error() {
    if let Ok(n) = rlx::driver::cuda::devices() {
        eprintln!(
            "{n} CUDA device(s) present: the no-driver behaviour is not what this machine shows"
        );
        return;
    }
    assert!(!Device::Cuda.is_available());
    assert!(Device::Cuda.is_built_in());
    let hint = Device::Cuda.availability_hint();
    assert!(hint.contains("CUDA"), "{hint}");
    let err = Session::new(Device::Cuda)
        .try_compile(mlp())
        .err()
        .expect("no device, no executable");
    let text = err.to_string();
    assert!(
        matches!(err, Error::DeviceUnavailable { .. }),
        "a compile without a device is DeviceUnavailable: {text}"
    );
    assert!(text.contains("Cuda"), "{text}");
    // Lowering needs no device.
    let l = Session::new(Device::Cuda).try_lower(mlp()).unwrap();
    let p = rlx_cuda::lower(&l.graph, &[]).unwrap();
    assert!(!p.launches.is_empty() && p.kernels.len() <= p.launches.len());
}

/// Every kernel of `g` lowered for CUDA under `policy`, compiled with NVRTC when it is at hand;
/// the number of distinct kernels.
fn check(g: Graph, policy: PrecisionPolicy, kernels: &mut std::collections::BTreeSet<String>) {
    let name = g.name().to_string();
    let l = Session::new(Device::Cuda)
        .with_precision(policy.clone())
        .try_lower(g)
        .unwrap_or_else(|e| panic!("{name} under {policy:?}: {e}"));
    let p =
        rlx_cuda::lower(&l.graph, &[]).unwrap_or_else(|e| panic!("{name} under {policy:?}: {e}"));
    kernels.extend(p.kernels);
}

#[test]
fn every_cuda_kernel_of_the_training_step_and_precision_policies_compiles_with_nvrtc() {
    let mut kernels = std::collections::BTreeSet::new();
    check(step_graph(), PrecisionPolicy::AlwaysF32, &mut kernels);
    check(step_graph(), PrecisionPolicy::AutoMixedBf16, &mut kernels);
    for p in policies() {
        check(mlp(), p, &mut kernels);
    }
    common::compile_cuda_kernels(&kernels, "training step and precision policies");
}

#[test]
fn needs_cuda_device_five_adamw_steps_give_the_cpus_losses() {
    if !common::cuda_or_skip("the CUDA training check") {
        return;
    }
    let (cpu, cpu_w) = train(Device::Cpu, 5);
    let (gpu, gpu_w) = train(Device::Cuda, 5);
    for (a, b) in cpu.iter().zip(&gpu) {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1.0),
            "losses: CPU {cpu:?}, CUDA {gpu:?}"
        );
    }
    let worst = cpu_w
        .iter()
        .zip(&gpu_w)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-4, "trained weights differ by {worst}");
    eprintln!("CUDA training: losses {gpu:?} (CPU {cpu:?})");
}

#[test]
fn needs_cuda_device_an_mlp_under_every_precision_policy_gives_the_cpus_values() {
    if !common::cuda_or_skip("the CUDA precision check") {
        return;
    }
    let x: Vec<f32> = (0..32).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect();
    let params: Vec<(&str, Vec<f32>)> = vec![
        (
            "w1",
            (0..128)
                .map(|i| ((i * 5 % 17) as f32 - 8.0) / 16.0)
                .collect(),
        ),
        ("b1", (0..16).map(|i| i as f32 / 32.0).collect()),
        (
            "w2",
            (0..48)
                .map(|i| ((i * 3 % 11) as f32 - 5.0) / 10.0)
                .collect(),
        ),
        ("b2", vec![0.1, -0.2, 0.3]),
    ];
    for p in policies() {
        let run = |device| {
            let mut c = Session::new(device)
                .with_precision(p.clone())
                .compile(mlp());
            for (n, v) in &params {
                c.set_param(n, v);
            }
            c.run(&[("x", &x)]).remove(0)
        };
        let (cpu, gpu) = (run(Device::Cpu), run(Device::Cuda));
        // bf16 rounding may land on either side of a tie differently only where the f32
        // accumulation order differs: a few bf16 ulps.
        let tol = match p {
            PrecisionPolicy::AlwaysF32 => 1e-5,
            _ => 3e-2,
        };
        for (a, b) in cpu.iter().zip(&gpu) {
            assert!(
                (a - b).abs() <= tol * a.abs().max(1.0),
                "{p:?}: CPU {cpu:?}, CUDA {gpu:?}"
            );
        }
    }
}

/// Every variant of the LLM kernels the lowering can pick (by scheme, warps per column, query
/// rows and dtypes), compiled with NVRTC when it is at hand: a model whose shapes pick a variant
/// the LLM tests do not reach still gets a kernel that was compiled here.
#[test]
fn every_cuda_llm_kernel_variant_compiles_with_nvrtc() {
    use rlx_cuda::source;
    use rlx_ir::QuantScheme;
    let mut kernels = Vec::new();
    for scheme in QuantScheme::GGUF {
        for split in [1, 2, 4, 8] {
            for staged in [false, true] {
                kernels.push(
                    source::dequant_matvec(scheme, DType::F32, split, staged, false, false)
                        .expect("matvec"),
                );
            }
            if source::norm_fuses(scheme) {
                for add in [false, true] {
                    kernels.push(
                        source::dequant_matvec(scheme, DType::F32, split, true, true, add)
                            .expect("matvec with a norm"),
                    );
                }
            }
        }
        kernels.push(source::dequant_matmul(scheme, DType::F32, false).expect("matmul"));
        if source::offset_decoder(scheme).is_some() {
            kernels.push(source::dequant_matmul(scheme, DType::F32, true).expect("matmul"));
        }
        kernels.push(source::dequantize_rows(scheme, DType::F32).expect("rows"));
    }
    assert!(
        source::dequant_matvec(QuantScheme::GgufQ4_0, DType::F32, 3, true, false, false).is_none()
    );
    kernels.extend([32, 256].map(|b| source::quantize_acts(b).expect("rounding")));
    for cache in [DType::F32, DType::F16, DType::BF16] {
        for warp in [false, true] {
            kernels.push(
                source::attention_scores(DType::F32, cache, DType::I32, warp).expect("scores"),
            );
        }
        for threads in [256, 1024] {
            kernels.push(source::attention_values(cache, DType::F32, threads).expect("values"));
        }
        kernels.push(
            source::attention_decode(DType::F32, cache, DType::I32, DType::F32).expect("decode"),
        );
        kernels.push(source::rope(cache, DType::I32, None).expect("rope"));
        kernels.push(source::rope(DType::F32, DType::I32, Some(cache)).expect("rope into a cache"));
        for t in [32, 256] {
            kernels.push(source::norm(cache, cache, None, cache, true, t).expect("rms norm"));
            kernels.push(
                source::norm(cache, cache, Some(cache), cache, false, t).expect("layer norm"),
            );
        }
    }
    common::compile_cuda_kernels(&kernels, "LLM kernel variants");
}
