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

/// Five AdamW steps of a small MLP on a CUDA device give the CPU's losses and weights (within
/// 1e-4).
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_five_adamw_steps_give_the_cpus_losses() {
    common::require_cuda("the CUDA training check");
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

/// An MLP under every precision policy on a CUDA device gives the CPU's values.
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_an_mlp_under_every_precision_policy_gives_the_cpus_values() {
    common::require_cuda("the CUDA precision check");
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
        for out in [DType::F32, DType::F16, DType::BF16] {
            kernels.push(source::dequant_mma(scheme, out).expect("tensor cores"));
        }
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

/// The batched NVRTC check (`Nvrtc::check_all`) fails for one kernel that does not compile
/// among many that do, and names that kernel: its error carries NVRTC's log and that kernel's
/// source alone. The kernels are real variants that define the same macros to other values
/// (each batch must keep them apart), made new to the disk cache by a comment.
#[test]
fn the_batched_nvrtc_check_names_the_one_kernel_that_does_not_compile() {
    use rlx_cuda::source;
    use rlx_ir::QuantScheme;
    let nvrtc = rlx_cuda::nvrtc::Nvrtc::get().expect("NVRTC (scripts/test.sh installs it)");
    let fresh = format!(
        "// {} {:?}\n",
        std::process::id(),
        std::time::SystemTime::now()
    );
    let mut kernels: Vec<String> = QuantScheme::GGUF
        .iter()
        .flat_map(|&q| {
            [1, 2].map(|split| {
                source::dequant_matvec(q, DType::F32, split, true, false, false).expect("matvec")
            })
        })
        .enumerate()
        .map(|(i, k)| format!("{fresh}// kernel {i}\n{k}"))
        .collect();
    assert!(kernels.len() > 8, "{} kernels", kernels.len());
    let sources: Vec<&str> = kernels.iter().map(String::as_str).collect();
    nvrtc
        .check_all(&sources, 80)
        .expect("the real kernels compile together");
    let bad = kernels.len() / 2;
    kernels[bad] = kernels[bad].replacen(
        "__global__ void k(",
        "__global__ void k(int rlx_no_such_type_marker, ",
        1,
    );
    kernels[bad] =
        kernels[bad].replacen("rlx_no_such_type_marker", "undeclared_type_t rlx_marker", 1);
    for k in kernels.iter_mut() {
        *k = format!("// again\n{k}");
    }
    let sources: Vec<&str> = kernels.iter().map(String::as_str).collect();
    let e = nvrtc
        .check_all(&sources, 80)
        .expect_err("a kernel that cannot compile")
        .to_string();
    assert!(e.contains("rejected a kernel for sm_80"), "{e}");
    assert!(e.contains("undeclared_type_t"), "{e}");
    assert!(
        e.contains(&format!("// kernel {bad}\n")),
        "the error names its kernel: {e}"
    );
    assert_eq!(
        e.matches("// kernel ").count(),
        1,
        "one kernel's source in the error: {e}"
    );
}

/// A product of `ad x bd` in `dt` with its operands, the reference evaluator's result, the
/// tolerance relative to its largest value, and the cuBLAS call expected (`[m, k, n, batches]`).
struct Product {
    what: String,
    g: Graph,
    feeds: [Vec<u8>; 2],
    want: Vec<f64>,
    tol: f64,
    call: Option<[usize; 4]>,
}

/// 2-D, dense batches, one right operand for every batch (folded into one product of all rows),
/// a broadcast left operand, size-1 dims, every dtype cuBLAS takes; batches broadcast so that
/// no single stride walks them (no call: the kernel).
fn products() -> Vec<Product> {
    type Case = (
        &'static [usize],
        &'static [usize],
        DType,
        Option<[usize; 4]>,
    );
    let cases: [Case; 10] = [
        (&[5, 7], &[7, 3], DType::F32, Some([5, 7, 3, 1])),
        (&[3, 5, 7], &[3, 7, 4], DType::F32, Some([5, 7, 4, 3])),
        (&[2, 3, 5, 7], &[7, 6], DType::F32, Some([30, 7, 6, 1])),
        (&[5, 7], &[4, 7, 6], DType::F32, Some([5, 7, 6, 4])),
        (&[2, 1, 5, 7], &[1, 3, 7, 6], DType::F32, None),
        (&[1, 1, 9], &[9, 1], DType::F32, Some([1, 9, 1, 1])),
        (&[3, 4, 33], &[3, 33, 17], DType::F16, Some([4, 33, 17, 3])),
        (&[6, 40], &[40, 9], DType::BF16, Some([6, 40, 9, 1])),
        (&[2, 4, 6], &[6, 5], DType::F64, Some([8, 6, 5, 1])),
        (&[130, 300], &[300, 70], DType::F32, Some([130, 300, 70, 1])),
    ];
    cases
        .into_iter()
        .map(|(ad, bd, dt, call)| {
            let mut g = Graph::new("product");
            let a = g.input("a", Shape::new(ad, dt));
            let b = g.input("b", Shape::new(bd, dt));
            let y = g.op(Op::MatMul, &[a, b]);
            g.set_outputs(vec![y]);
            let na: usize = ad.iter().product();
            let nb: usize = bd.iter().product();
            let va: Vec<f64> = (0..na)
                .map(|i| ((i * 7 % 23) as f64 - 11.0) / 8.0)
                .collect();
            let vb: Vec<f64> = (0..nb).map(|i| ((i * 5 % 19) as f64 - 9.0) / 4.0).collect();
            let feeds = [common::encode(&va, dt), common::encode(&vb, dt)];
            let leaf = |id, bytes: &[u8]| rlx::ir::eval::Tensor::from_bytes(g.shape(id), bytes);
            let leaves = [
                ("a".to_string(), leaf(a, &feeds[0]).unwrap()),
                ("b".to_string(), leaf(b, &feeds[1]).unwrap()),
            ]
            .into_iter()
            .collect();
            let want = rlx::ir::eval::evaluate(&g, &leaves).unwrap()[0].f64s();
            // f16 and bf16 results are rounded once from f32 sums, as the evaluator's are.
            let tol = match dt {
                DType::F16 => 1e-3,
                DType::BF16 => 8e-3,
                _ => 1e-6,
            };
            let what = format!("{ad:?} x {bd:?} in {dt:?}");
            Product {
                what,
                g,
                feeds,
                want,
                tol,
                call,
            }
        })
        .collect()
}

fn near(p: &Product, got: &[f64], how: &str) {
    assert_eq!(got.len(), p.want.len(), "{} ({how})", p.what);
    let scale = p.want.iter().fold(1f64, |m, x| m.max(x.abs()));
    let off = got
        .iter()
        .zip(&p.want)
        .map(|(x, y)| (x - y).abs())
        .fold(0f64, f64::max);
    assert!(
        off <= p.tol * scale,
        "{} ({how}): {off:e} from the reference",
        p.what
    );
}

/// [`products`] as cuBLAS computes them (the column-major call each matmul launch carries, run
/// by cuBLAS's definition in host emulation) and as RLX's own kernel does (no cuBLAS): both
/// give the reference evaluator's values, and the calls are the ones expected.
#[test]
fn cublas_calls_and_the_matmul_kernel_agree_with_the_reference_evaluator() {
    for p in products() {
        let dt = p.g.shape(p.g.inputs()[0].1).dtype();
        let lowered = Session::new(Device::Cuda)
            .try_lower(p.g.clone())
            .unwrap()
            .graph;
        let prog = rlx_cuda::lower(&lowered, &[]).unwrap();
        let gemms: Vec<_> = prog.launches.iter().filter_map(|l| l.gemm).collect();
        assert_eq!(
            gemms
                .iter()
                .map(|c| [c.m, c.k, c.n, c.batches])
                .collect::<Vec<_>>(),
            p.call.into_iter().collect::<Vec<_>>(),
            "{}: the cuBLAS calls",
            p.what
        );
        let emu = rlx_cuda::emulate::Emulator::build(&prog.kernels).expect("the kernels compile");
        let inputs: Vec<Vec<u8>> = prog
            .inputs
            .iter()
            .map(|s| p.feeds[(s.name != "a") as usize].clone())
            .collect();
        let with = emu.run(&prog, &inputs, &[]).unwrap();
        near(&p, &common::decode(&with[0], dt), "cuBLAS");
        let without = emu.run_without_cublas(&prog, &inputs, &[]).unwrap();
        near(&p, &common::decode(&without[0], dt), "kernel");
    }
}

/// [`products`] on a CUDA device: through cuBLAS where the machine has it (the output says
/// which), else RLX's kernel.
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_products_match_the_reference_evaluator() {
    common::require_cuda("the CUDA products check");
    let how = if rlx_cuda::cublas_found() {
        "cuBLAS"
    } else {
        "RLX's kernel: no cuBLAS"
    };
    for p in products() {
        let dt = p.g.shape(p.g.inputs()[0].1).dtype();
        let mut c = Session::new(Device::Cuda).try_compile(p.g.clone()).unwrap();
        let out = c.run_typed(&[("a", &p.feeds[0], dt), ("b", &p.feeds[1], dt)]);
        near(&p, &common::decode(&out[0].0, out[0].1), how);
    }
    eprintln!("CUDA products ({how}): agree with the reference evaluator");
}
