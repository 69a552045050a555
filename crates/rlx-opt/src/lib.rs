//! RLX optimizer: graph-to-graph passes, the compile pipeline that runs them, and the memory
//! planner backends use to pack intermediates into one arena.
//!
//! Most passes are rule lists ([`RuleSet`]): named rules indexed by the op kind at their
//! pattern's root, applied to a fixed point while the graph is rebuilt, with optional CSE by
//! structural hash and a count of the rules that fired (see [`rewrite`](mod@rewrite)). Simplification
//! ([`simplify::rules`]), CSE, decomposition and constant folding are such lists; nothing here is
//! specific to one op except the algebraic rules.

#![deny(missing_docs)]

pub mod autodiff;
pub mod dispatch;
pub mod fold;
pub mod fusion;
pub mod memory;
pub mod module;
pub mod passes;
pub mod patterns;
pub mod pipeline;
pub mod plan;
pub mod precision;
pub mod quant;
pub mod rewrite;
pub mod simplify;
pub mod vmap;

pub use autodiff::{grad, grad_with_loss, hvp, jvp, nth_order_grad, value_and_grad};
pub use dispatch::{Dispatch, KernelDispatchReport, NodeDispatch};
pub use fold::ConstantFolding;
pub use fusion::{Accepts, FuseElementwise, FusionOptions, FusionReport, MissReason, Region};
pub use memory::{plan_memory, BufferRequest, MemoryPlan};
pub use module::{
    inspect_hir, inspect_lir, inspect_mir, inspect_mir_diff, inspect_pipeline, maybe_dump_pipeline,
    GraphModule, IoEntry, Lir, LirBuffer, LowerHir, Stage,
};
pub use passes::{Cse, DeadCodeElimination, Decompose};
pub use patterns::{norm_matmul_parts, ropes_into_cache_writes, FusePatterns, NormMatMulParts};
pub use pipeline::{CompilePipeline, CompileResult, Pass, PassRecord};
pub use plan::{prepare, Donation, LoweringOptions, LoweringPlan, Skip};
pub use precision::{
    op_class, AutoMixedPrecision, CustomPrecision, OpClass, Precision, PrecisionPolicy,
};
pub use quant::{
    calibrate, insert_q_dq, integer_core, quant_propagate, specialize_params, CalibrationEntry,
    CalibrationRecord, Calibrator, IntegerCore, QuantMap, QuantPropagate, RangeMethod,
};
pub use rewrite::{rewrite, Rewrite, Rule, RuleSet, RuleSite, Site};
pub use simplify::AlgebraicSimplify;
pub use vmap::{vmap, vmap_axes};
