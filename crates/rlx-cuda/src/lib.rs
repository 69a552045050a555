//! RLX CUDA backend: the same graphs the CPU runs, on NVIDIA GPUs.
//!
//! The backend only lowers: the compiler has already decomposed what it does not run
//! ([`CudaBackend::supports`]) and formed the fused regions it takes ([`CudaBackend::fuses`]).
//! Lowering needs no device ([`lower::lower`] gives a [`Program`]: kernel sources and launches
//! over one arena); each elementwise region becomes one generated CUDA C kernel
//! ([`source::elementwise`]). Kernels are compiled at run time by NVRTC to a CUBIN for the
//! device's exact architecture and cached on disk ([`nvrtc`]); they use no CUDA header, so the
//! driver and `libnvrtc` are all a machine needs. On the device ([`CudaProgram`]) a graph has
//! one arena allocated at compile, params uploaded once, one stream, and each run replays the
//! launches as one captured CUDA graph.
//!
//! What runs: elementwise ops and regions on f32, f64, f16, bf16, the integer types and bool;
//! reductions, softmax, cumsum, top-k, matmul (a tiled kernel, f32 accumulation), LayerNorm,
//! RMSNorm and RoPE, the
//! movement and index ops; the LLM ops: GGUF `DequantMatMul` for every block type (a
//! matrix-vector kernel reading each packed weight once for decode, a tiled one for prompts,
//! activations rounded to int8 blocks as the CPU rounds them), `DequantizeRows`, `CacheWrite`,
//! `CachedAttention` and `PagedAttention`; composites the compiler decomposes into them
//! (dot_general, norms, attention, conv, pool, the quantize ops, ...); c64 values as pairs of
//! f32, with copies for `complex`, `real` and `imag` (the rest of complex arithmetic and the
//! FFT's DFT-matrix decomposition run as real ops on the parts). Not yet: unbounded loops and
//! integer-quantized (`qlinear`, ...) ops; a graph holding one is a compile error naming the op
//! and node ([`unsupported`]).
//!
//! Float products go to cuBLAS where the machine has it ([`gemm`]: each matmul launch carries
//! the `cublasGemmStridedBatchedEx` call that computes the same values); without it, or with
//! `RLX_CUBLAS=0`, RLX's kernel computes them. Prompt-sized GGUF products run on tensor cores in
//! RLX's own kernel ([`source::dequant_mma`], 3xTF32, batch invariant).
//!
//! `RLX_PROFILE` runs each program launch by launch with CUDA events around every launch and
//! prints, when the program is dropped, the time per op kind and the slowest launches.
//!
//! Without a driver or a device, `Device::Cuda.is_available()` is false and a compile is
//! [`rlx_ir::Error::DeviceUnavailable`], never a panic.

#![deny(missing_docs)]

mod cublas;
mod device;
pub mod emulate;
pub mod gemm;
pub mod lower;
pub mod nvrtc;
pub mod registered;
pub mod source;

pub use device::{Cuda, CudaProgram};
pub use lower::{lower, unsupported, Program};
pub use registered::{register_kernel, CudaKernel, CudaKernelBuilder};

use rlx_driver::{Backend, CompileOptions, Executable};
use rlx_ir::{Error, FusionKind, Graph, NodeId, Op, Result};

/// Architectures every kernel is compile-checked for without a device (Ampere and Hopper).
pub const CHECKED_ARCHS: [u32; 2] = [80, 90];

/// The CUDA backend (`Device::Cuda`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaBackend;

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn supports(&self, graph: &Graph, id: NodeId) -> bool {
        unsupported(graph, id).is_none()
    }

    fn refusal(&self, graph: &Graph, id: NodeId) -> Option<String> {
        unsupported(graph, id)
    }

    fn fuses(&self, graph: &Graph, id: NodeId, kind: FusionKind) -> bool {
        let n = graph.node(id);
        let ins: Vec<rlx_ir::DType> = n.inputs.iter().map(|i| graph.shape(*i).dtype()).collect();
        if kind == FusionKind::NormMatMul {
            return lower::takes_norm(graph, id);
        }
        kind == FusionKind::Elementwise
            && matches!(
                n.op,
                Op::Binary(_) | Op::Activation(_) | Op::Compare(_) | Op::Where | Op::Cast { .. }
            )
            && source::elementwise_op(&n.op, n.shape.dtype(), &ins)
            && unsupported(graph, id).is_none()
    }

    fn compile(&self, graph: &Graph, _opts: &CompileOptions) -> Result<Box<dyn Executable>> {
        let prog = lower(graph, &[])?;
        Ok(Box::new(CudaProgram::load(Cuda::get()?, prog, None)?))
    }

    fn compile_sharing(
        &self,
        graph: &Graph,
        _opts: &CompileOptions,
        other: &dyn Executable,
    ) -> Result<Box<dyn Executable>> {
        let other = other
            .as_any()
            .and_then(|a| a.downcast_ref::<CudaProgram>())
            .ok_or_else(|| {
                Error::Invalid(
                    "params can only be shared with another graph compiled for CUDA".into(),
                )
            })?;
        let shared = other.program().shared_params();
        let prog = lower(graph, &shared)?;
        Ok(Box::new(CudaProgram::load(
            Cuda::get()?,
            prog,
            Some(other),
        )?))
    }
}

/// Whether products go to cuBLAS on this machine: the library was found and `RLX_CUBLAS` is
/// not `0` (see the [`gemm`] module).
pub fn cublas_found() -> bool {
    cublas::Cublas::get().is_some()
}

/// Compile every kernel of `prog` with NVRTC for each of `archs` (no device needed): the check
/// that no kernel reaches a user uncompiled ([`nvrtc::Nvrtc::check_all`]: in batches, those
/// the disk cache holds skipped). Returns how many sources were checked.
pub fn compile_check(prog: &Program, archs: &[u32]) -> Result<usize> {
    let nvrtc = nvrtc::Nvrtc::get()?;
    let sources: Vec<&str> = prog.kernels.iter().map(String::as_str).collect();
    for &a in archs {
        nvrtc.check_all(&sources, a)?;
    }
    Ok(prog.kernels.len())
}

/// [`compile_check`] for [`CHECKED_ARCHS`] as the tests run it: without NVRTC, an error under
/// `RLX_REQUIRE_NVRTC=1` (which `scripts/test.sh` sets, having installed NVRTC), else one line
/// on stderr saying that `what`'s kernels were not compiled, and `Ok(0)`.
pub fn compile_check_for_tests(prog: &Program, what: &str) -> Result<usize> {
    match nvrtc::Nvrtc::get() {
        Ok(_) => compile_check(prog, &CHECKED_ARCHS),
        Err(e) if rlx_ir::env::get(rlx_ir::env::REQUIRE_NVRTC).as_deref() == Some("1") => Err(e),
        Err(e) => {
            eprintln!("NVRTC missing, {what}: CUDA kernels lowered but NOT compiled: {e}");
            Ok(0)
        }
    }
}
