//! GGUF products of prompt size on CUDA: tensor cores over TF32 with each operand split in two
//! (`source::dequant_mma`), as close to the exact product as an f32 sum, and batch invariant.

use super::*;

/// Prompt-sized GGUF products: 70 rows of every block type, `(name, built)`, and the first 20
/// of those rows on their own.
fn prompt_sized_products() -> Vec<(String, Built, Built)> {
    let (rows, n) = (70, 40);
    let mut rng = rlx::gguf::SplitMix64::new(23);
    let mut cases = Vec::new();
    for scheme in rlx::ir::QuantScheme::GGUF {
        let Some(ty) = scheme.ggml_type() else {
            continue;
        };
        let k = if scheme.act_block(1) == Some(256) {
            512
        } else {
            352
        };
        if let Ok(w) = rlx::gguf::random_tensor(ty, &[n, k], 0.0, 0.5, &mut rng) {
            let name = format!("{scheme:?} {rows}x{k} @ {n}");
            let whole = quantized_product(scheme, rows, k, n, &w);
            let part = quantized_product(scheme, 20, k, n, &w);
            cases.push((name, whole, part));
        }
    }
    cases
}

/// A prompt-sized product from CUDA (`got`) within 1e-5 of the largest result of the exact
/// product and of the CPU's (which takes prompt-sized activations as they are): f32-level, where
/// bf16 operands would be hundreds of times further off.
fn near_the_cpu(name: &str, got: &[f64], b: &Built, what: &str) {
    let cpu = run_on(Device::Cpu, b, true).expect("runs on the CPU");
    let want = run_reference(b).expect("reference");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let off = |a: &[f64]| {
        a.iter()
            .zip(got)
            .map(|(p, q)| (p - q).abs())
            .fold(0f64, f64::max)
    };
    let (exact, cpu) = (off(&want), off(&cpu));
    eprintln!("{name}: {what} - exact {exact:.2e}, - CPU {cpu:.2e} (of {scale:.3})");
    assert!(
        exact <= 1e-5 * scale && cpu <= 1e-5 * scale,
        "{name}: {what} is {exact:e} from the exact product and {cpu:e} from the CPU's"
    );
}

/// [`prompt_sized_products`] as CUDA programs in host emulation (the tensor-core instruction
/// played with PTX's fragment layouts): one launch each, near the CPU's product, and the first
/// 20 rows bit for bit those of the 20-row product. The kernel also compiles for a GPU before
/// Ampere (sm_75: the same sums by shuffles) with NVRTC.
///
/// The bit-for-bit rows check the lowering (both products take the same tiles and k-steps),
/// not batch invariance itself: the emulator computes each element on its own, and the 20
/// rows lie in the same tile either way, so it holds by construction here. Batch invariance is
/// a property of the device's tensor cores, checked by
/// [`needs_cuda_device_prompt_sized_quantized_products_agree_and_are_batch_invariant`].
#[test]
fn prompt_sized_quantized_products_on_tensor_cores_agree_with_the_cpu() {
    for (name, whole, part) in prompt_sized_products() {
        let lower = |b: &Built| {
            let l = Session::new(Device::Cuda)
                .try_lower(b.g.clone())
                .expect("lowers");
            rlx_cuda::lower(&l.graph, &[]).expect("lowers for CUDA")
        };
        let (p, q) = (lower(&whole), lower(&part));
        let ops: Vec<&str> = p.launches.iter().map(|l| l.op).collect();
        assert_eq!(ops, ["dequant_matmul"], "{name}: launches");
        assert!(
            p.kernels[0].contains("mma8"),
            "{name}: the tensor-core kernel"
        );
        common::compile_cuda_kernels_for(&p.kernels[..1], &[75], &format!("{name}, sm_75"));
        let emu = rlx_cuda::emulate::Emulator::build(p.kernels.iter().chain(&q.kernels))
            .expect("compiles for the host");
        let run = |p: &rlx_cuda::Program, b: &Built| {
            let (feeds, params) = (
                values_for(&p.inputs, &b.feeds),
                values_for(&p.params, &b.params),
            );
            decode(&emu.run(p, &feeds, &params).unwrap()[0], DType::F32)
        };
        let got = run(&p, &whole);
        near_the_cpu(&name, &got, &whole, "CUDA (emulated)");
        let few = run(&q, &part);
        assert!(
            few.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: 20 rows alone differ from the same rows among 70"
        );
    }
}

/// On a CUDA device: [`prompt_sized_products`] near the CPU's products, and the first 20 rows
/// bit for bit those of the 20-row product: the batch invariance of the tensor-core kernel (a
/// row's bits do not depend on the rows beside it), which only a device can show.
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_prompt_sized_quantized_products_agree_and_are_batch_invariant() {
    common::require_cuda("CUDA prompt-sized products");
    for (name, whole, part) in prompt_sized_products() {
        let got = run_on(Device::Cuda, &whole, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        near_the_cpu(&name, &got, &whole, "CUDA");
        let few = run_on(Device::Cuda, &part, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            few.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: 20 rows alone differ from the same rows among 70"
        );
    }
}
