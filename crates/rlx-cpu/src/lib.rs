//! RLX CPU backend.
//!
//! A graph compiles to a list of kernels over one arena: every input and intermediate gets a
//! slot from the liveness-based planner in `rlx-opt`, views (transpose, narrow, broadcast,
//! contiguous reshape) are layouts over their source's slot, and kernels read strided operands
//! directly. f32 matmul uses a packed GEMM with AVX-512 / AVX2 micro-kernels; elementwise,
//! reduction and normalization kernels are generic over dtypes. Work is spread over a spin-then-
//! park thread pool that allocates nothing per dispatch, so `run` allocates nothing.

#![deny(missing_docs)]

pub mod buffer;
pub mod elem;
pub mod isa;
pub mod kernels;
pub mod layout;
pub mod math;
pub mod pool;
mod program;

pub use kernels::gemm;
pub use program::{
    compile, compile_with_fusion, compile_with_updates, fuses, lower, prepare, Program,
};

use rlx_driver::{Backend, CompileOptions, Executable};
use rlx_ir::{FusionKind, Graph, NodeId, Result};

/// The CPU backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

/// Threads used when none are requested: one per available core (asked of the system once per
/// process: on Linux the answer reads cgroup files, which costs more than lowering a node).
pub fn default_threads() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn supports(&self, graph: &Graph, id: NodeId) -> bool {
        kernels::supports(graph, id)
    }

    fn refusal(&self, graph: &Graph, id: NodeId) -> Option<String> {
        kernels::refusal(graph, id)
    }

    fn fuses(&self, graph: &Graph, id: NodeId, kind: FusionKind) -> bool {
        program::fuses(graph, id, kind)
    }

    fn param_panels(&self) -> usize {
        kernels::gemm::half::PANEL
    }

    fn compile(&self, graph: &Graph, opts: &CompileOptions) -> Result<Box<dyn Executable>> {
        let threads = opts.threads.unwrap_or_else(default_threads);
        Ok(Box::new(program::lower(graph, &opts.plan, threads, None)?))
    }

    fn compile_sharing(
        &self,
        graph: &Graph,
        opts: &CompileOptions,
        other: &dyn Executable,
    ) -> Result<Box<dyn Executable>> {
        let threads = opts.threads.unwrap_or_else(default_threads);
        let other = other
            .as_any()
            .and_then(|a| a.downcast_ref::<Program>())
            .ok_or_else(|| {
                rlx_ir::Error::Invalid(
                    "params can only be shared with another graph compiled for the CPU".into(),
                )
            })?;
        Ok(Box::new(program::lower(
            graph,
            &opts.plan,
            threads,
            Some(other),
        )?))
    }
}
