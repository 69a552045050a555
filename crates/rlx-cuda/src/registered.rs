//! Native CUDA kernels for ops registered from outside the IR (`rlx_ir::ops::register`): a
//! downstream crate gives the CUDA backend a kernel for its op by name ([`register_kernel`]),
//! as it gives the CPU and wgpu theirs; the backend then lowers the op to one launch of it
//! where the kernel takes its operands, and to its decomposition elsewhere.
//!
//! A kernel is CUDA C statements run for each item `i` (an `i64`) in `0..items`, inside a
//! grid-stride loop of a kernel the backend writes (`extern "C" __global__ void k(const M m)`,
//! compiled by NVRTC like every RLX kernel: no CUDA headers). Its words `m.w[..]` (`i64`):
//! `m.w[0]` the items, `m.w[1]` the result's device address, `m.w[2 + k]` operand `k`'s, then
//! the kernel's own [`CudaKernel::words`]. Values lie dense and row-major in their storage
//! types: `float`, `double`, `int`, `i64`, `short`, `signed char`, `u32`, `unsigned char`
//! (u8 and bool), and f16 / bf16 as `u16` bits (`h2f` / `f2h`, `b2f` / `f2b` convert).

use rlx_driver::kernels::{KernelBuilder, KernelRegistry};
use rlx_ir::{Graph, NodeId};

/// A CUDA kernel for one node of a registered op (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaKernel {
    /// The statements run for item `i`.
    pub body: String,
    /// Words the body reads after the operands' addresses (dims, attributes).
    pub words: Vec<i64>,
    /// How many items the grid-stride loop runs.
    pub items: usize,
}

/// Builds the kernel of a node (see [`rlx_driver::kernels::KernelBuilder`]).
pub type CudaKernelBuilder = KernelBuilder<CudaKernel>;

static KERNELS: KernelRegistry<CudaKernel> = KernelRegistry::new();

/// Give the CUDA backend a native kernel for the registered op `name` (replacing one given
/// before).
pub fn register_kernel(name: &'static str, kernel: CudaKernelBuilder) {
    KERNELS.register(name, kernel);
}

/// The kernel of node `id` of `g`, when its op has a registered kernel that takes its operands
/// (static shapes of dtypes CUDA stores).
pub(crate) fn kernel_for(g: &Graph, id: NodeId) -> Option<CudaKernel> {
    KERNELS.kernel_for(g, id, |s| {
        crate::source::storage(s.dtype()).is_some() && s.static_dims().is_some()
    })
}
