//! Helpers shared by the integration tests: encode / decode typed buffers.

#![allow(dead_code)]

pub mod digits;
pub mod gpt;
pub mod llm;
pub mod table;
pub mod tiny;

use rlx::ir::convert;
use rlx::prelude::*;

/// Encode f64 values as the little-endian bytes of `dt` (values must fit).
pub fn encode(values: &[f64], dt: DType) -> Vec<u8> {
    if dt == DType::C64 {
        // Each c64 element is two values: its real and imaginary parts.
        return encode(values, DType::F32);
    }
    let w = dt.size_bytes();
    let mut out = vec![0u8; values.len() * w];
    for (v, o) in values.iter().zip(out.chunks_exact_mut(w)) {
        convert::f64_to_bytes(*v, dt, o).unwrap_or_else(|e| panic!("encoding {v} as {dt}: {e}"));
    }
    out
}

/// Decode little-endian bytes of `dt` as f64.
pub fn decode(bytes: &[u8], dt: DType) -> Vec<f64> {
    if dt == DType::C64 {
        return decode(bytes, DType::F32);
    }
    bytes
        .chunks_exact(dt.size_bytes())
        .map(|b| convert::bytes_to_f64(b, dt))
        .collect()
}

/// `n` deterministic values in `[lo, hi)` (xorshift from `seed`): inputs for tests that must
/// not depend on a crate's random stream.
pub fn uniform(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

/// Fail unless a CUDA device is here. Called first by the tests that need one, which are
/// `#[ignore]`d so that `cargo test` never reports them `ok` without a device; the GPU check
/// (`scripts/gpu-check.sh`) runs them with `--ignored`.
pub fn require_cuda(what: &str) {
    assert!(
        Device::Cuda.is_available(),
        "{what} needs a CUDA device: {}",
        Device::Cuda.availability_hint()
    );
}

/// Compile every CUDA kernel source of `kernels` with NVRTC for the checked architectures when
/// NVRTC is at hand (`RLX_REQUIRE_NVRTC=1` makes its absence a failure); one line says how many
/// (`what`: which kernels).
pub fn compile_cuda_kernels<'a>(kernels: impl IntoIterator<Item = &'a String>, what: &str) {
    compile_cuda_kernels_for(kernels, &rlx_cuda::CHECKED_ARCHS, what)
}

/// [`compile_cuda_kernels`] for the architectures `archs`.
pub fn compile_cuda_kernels_for<'a>(
    kernels: impl IntoIterator<Item = &'a String>,
    archs: &[u32],
    what: &str,
) {
    match rlx_cuda::nvrtc::Nvrtc::get() {
        Ok(nvrtc) => {
            let sources: Vec<&str> = kernels.into_iter().map(String::as_str).collect();
            for &arch in archs {
                nvrtc
                    .check_all(&sources, arch)
                    .unwrap_or_else(|e| panic!("{what}: sm_{arch}: {e}"));
            }
            let n = sources.len();
            eprintln!("{what}: {n} distinct CUDA kernels compiled for sm_{archs:?}");
        }
        Err(e) => {
            assert!(
                rlx::ir::env::get(rlx::ir::env::REQUIRE_NVRTC).as_deref() != Some("1"),
                "RLX_REQUIRE_NVRTC=1 and {e}"
            );
            eprintln!("NVRTC missing, {what}: CUDA kernels lowered but NOT compiled: {e}");
        }
    }
}
