//! GGUF products of prompt size on CUDA: through cuBLAS (bf16 operands) where the device has
//! it, else the tiled kernel.

use super::*;

/// Prompt-sized GGUF products: 70 rows of every block type, `(name, built)`.
fn prompt_sized_products() -> Vec<(String, Built)> {
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
            cases.push((name, quantized_product(scheme, rows, k, n, &w)));
        }
    }
    cases
}

/// A prompt-sized product through cuBLAS (`got`): weights and activations rounded to bf16,
/// within bf16's rounding (a hundredth of the largest result) of the exact product.
fn bf16_product_near_exact(name: &str, got: &[f64], b: &Built) {
    let want = run_reference(b).expect("reference");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let off = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f64, f64::max);
    eprintln!("{name}: cuBLAS (bf16) - exact {off:.2e} (of {scale:.3})");
    assert!(
        off <= 1e-2 * scale,
        "{name}: cuBLAS path {off:e} from the exact product"
    );
}

/// [`prompt_sized_products`] as CUDA programs in host emulation: where the device has cuBLAS,
/// the weights are decoded and the activations rounded to bf16 and one cuBLAS call (run by its
/// definition) multiplies them ([`bf16_product_near_exact`]); without it, the tiled kernel
/// agrees with the CPU as [`quantized_agrees`] holds them.
#[test]
fn prompt_sized_quantized_products_take_cublas_or_the_tiled_kernel() {
    for (name, b) in prompt_sized_products() {
        let l = Session::new(Device::Cuda)
            .try_lower(b.g.clone())
            .expect("lowers");
        let p = rlx_cuda::lower(&l.graph, &[]).expect("lowers for CUDA");
        let gemms: Vec<_> = p.launches.iter().filter_map(|l| l.gemm).collect();
        assert_eq!(gemms.len(), 1, "{name}: one cuBLAS call");
        let with = p.launches.iter().filter(|l| l.runs(true)).count();
        assert_eq!(with, 3, "{name}: decode, round, multiply");
        let emu = rlx_cuda::emulate::Emulator::build(&p.kernels).expect("compiles for the host");
        let (feeds, params) = (
            values_for(&p.inputs, &b.feeds),
            values_for(&p.params, &b.params),
        );
        let got = decode(&emu.run(&p, &feeds, &params).unwrap()[0], DType::F32);
        bf16_product_near_exact(&name, &got, &b);
        let own = emu.run_without_cublas(&p, &feeds, &params).unwrap();
        let cpu = run_on(Device::Cpu, &b, true).expect("runs on the CPU");
        let want = run_reference(&b).expect("reference");
        let own = decode(&own[0], DType::F32);
        if let Err(e) = quantized_or_near_exact(&name, &cpu, &own, &want, "the tiled kernel") {
            panic!("{e}");
        }
    }
}

/// On a CUDA device: [`prompt_sized_products`] through cuBLAS where the machine has it, else
/// the tiled kernel against the CPU.
#[test]
fn needs_cuda_device_prompt_sized_quantized_products_agree() {
    if !common::cuda_or_skip("CUDA prompt-sized products") {
        return;
    }
    for (name, b) in prompt_sized_products() {
        let got = run_on(Device::Cuda, &b, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        if rlx_cuda::cublas_found() {
            bf16_product_near_exact(&name, &got, &b);
        } else {
            let cpu = run_on(Device::Cpu, &b, true).expect("runs on the CPU");
            let want = run_reference(&b).expect("reference");
            if let Err(e) = quantized_or_near_exact(&name, &cpu, &got, &want, "CUDA") {
                panic!("{e}");
            }
        }
    }
}
