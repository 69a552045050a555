//! RLX optimizer: graph-to-graph passes, the compile pipeline that runs them, and the memory
//! planner backends use to pack intermediates into one arena.
//!
//! Passes rebuild the graph through [`rewrite()`]: a rule sees each node with its operands already
//! rewritten and either keeps it or returns a replacement. Nothing here is specific to one op
//! except the algebraic rules, which are a list of small patterns in [`simplify`].

#![deny(missing_docs)]

pub mod autodiff;
pub mod fold;
pub mod memory;
pub mod passes;
pub mod pipeline;
pub mod rewrite;
pub mod simplify;
pub mod vmap;

pub use autodiff::{grad, grad_with_loss, hvp, jvp, nth_order_grad};
pub use fold::ConstantFolding;
pub use memory::{plan_memory, BufferRequest, MemoryPlan};
pub use passes::{Cse, DeadCodeElimination, Decompose};
pub use pipeline::{CompilePipeline, CompileResult, Pass, PassRecord};
pub use rewrite::{rewrite, Rewrite};
pub use simplify::AlgebraicSimplify;
pub use vmap::{vmap, vmap_axes};
