//! Native WGSL kernels for ops registered from outside the IR (`rlx_ir::ops::register`): a
//! downstream crate gives the wgpu backend a kernel for its op by name ([`register_kernel`]),
//! as it gives the CPU one (`rlx_cpu::kernels::registered::register_kernel`); the backend then
//! runs the op natively where the kernel takes its operands, and its decomposition elsewhere.
//!
//! A kernel is the body of `fn main`, run by invocations `i` in `0..invocations` (the backend
//! returns early for the rest), over the graph's words (see [`crate::shaders`]): `rd(a)` reads
//! word `a` as `u32` bits, `wr(a, v)` writes it; f32 values are `bitcast<f32>(rd(a))` and
//! `wr(a, bitcast<u32>(x))`, i32 `bitcast<i32>`, u32 and bool (0 / 1) as they are; f16 and bf16
//! values read and write as f32 bits too (rounded on the way out). The meta words `mt`:
//! `mt[0]` the invocations, `mt[1]` the result's first word, `mt[2 + k]` operand `k`'s first
//! word (elements follow one word each, row-major), then the kernel's own [`WgslKernel::words`].

use rlx_driver::kernels::{KernelBuilder, KernelRegistry};
use rlx_ir::{Graph, NodeId};

/// A WGSL kernel for one node of a registered op (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslKernel {
    /// The statements of `fn main`, run by invocation `i`.
    pub body: String,
    /// Words the body reads after the operands' addresses (dims, attributes).
    pub words: Vec<u32>,
    /// How many invocations run the body.
    pub invocations: usize,
    /// The most loop iterations one invocation runs in all: an adapter that ends long loops
    /// (lavapipe, after 65535) runs the op's decomposition instead when this is above
    /// 65,000 (the backend's loop limit).
    pub longest_loop: usize,
}

/// Builds the kernel of a node (see [`rlx_driver::kernels::KernelBuilder`]).
pub type WgpuKernel = KernelBuilder<WgslKernel>;

static KERNELS: KernelRegistry<WgslKernel> = KernelRegistry::new();

/// Give the wgpu backend a native kernel for the registered op `name` (replacing one given
/// before).
pub fn register_kernel(name: &'static str, kernel: WgpuKernel) {
    KERNELS.register(name, kernel);
}

/// The kernel of node `id` of `g`, when its op has a registered kernel that takes its operands
/// and every value is one the GPU holds as words.
pub(crate) fn kernel_for(g: &Graph, id: NodeId) -> Option<WgslKernel> {
    KERNELS.kernel_for(g, id, |s| {
        crate::shaders::wgsl_type(s.dtype()).is_some() && s.static_dims().is_some()
    })
}
