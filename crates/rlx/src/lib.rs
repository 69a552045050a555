//! # RLX
//!
//! A small ML compiler and runtime with a JAX-shaped IR. Build a [`Graph`], compile it with a
//! [`Session`] for a [`Device`], set its params and run it:
//!
//! ```
//! use rlx::prelude::*;
//! let mut g = Graph::new("hello");
//! let x = g.input("x", Shape::new(&[1, 4], DType::F32));
//! let w = g.param("w", Shape::new(&[4, 2], DType::F32));
//! let y = g.matmul(x, w, Shape::new(&[1, 2], DType::F32));
//! g.set_outputs(vec![y]);
//! let mut compiled = Session::new(Device::Cpu).compile(g);
//! compiled.set_param("w", &[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]);
//! let out = compiled.run(&[("x", &[1.0, 2.0, 3.0, 4.0])]);
//! assert_eq!(out, vec![vec![4.0, 6.0]]);
//! ```
//!
//! Every call that can fail on user input has a `try_` form returning [`Result`]; the short
//! forms panic with the same message.
//!
//! | module | crate | what |
//! |---|---|---|
//! | [`ir`] | `rlx-ir` | dtypes, shapes, ops and their rules, graph builder, verifier |
//! | [`opt`] | `rlx-opt` | passes, compile pipeline, memory planner |
//! | [`driver`] | `rlx-driver` | `Device`, the `Backend` trait, backend registry |
//! | [`runtime`] | `rlx-runtime` | `Session`, `CompiledGraph` |
//! | [`macros`] | `rlx-macros` | `#[rlx_model]`: a graph-building function as a lazily compiled model |
//! | `linalg` (feature `linalg`) | `rlx-linalg` | solve, cholesky, qr, svd, ... as ops |
//! | `sparse` (feature `sparse`) | `rlx-sparse` | COO and CSR sparse × dense products |
//! | `splat` (feature `splat`) | `rlx-splat` | differentiable Gaussian splatting |

#![deny(missing_docs)]

#[cfg(feature = "cortexm")]
pub use rlx_cortexm as cortexm;
pub use rlx_driver as driver;
#[cfg(feature = "fpga")]
pub use rlx_fpga as fpga;
#[cfg(feature = "gguf")]
pub use rlx_gguf as gguf;
pub use rlx_ir as ir;
#[cfg(feature = "linalg")]
pub use rlx_linalg as linalg;
pub use rlx_opt as opt;
pub use rlx_runtime as runtime;
#[cfg(feature = "sparse")]
pub use rlx_sparse as sparse;
#[cfg(feature = "splat")]
pub use rlx_splat as splat;

pub use rlx_driver::Device;
pub use rlx_ir::{DType, Dim, Error, Graph, Node, NodeId, Op, OpKind, Result, Shape};
pub use rlx_opt::{CompilePipeline, CompileResult, Pass, PassRecord};
pub use rlx_runtime::{CompiledGraph, PrecisionPolicy, Session};

/// Op attribute enums taken by the builder methods (`g.binary`, `g.activation`, ...).
pub mod ops {
    /// Ops defined in one file each ([`OpDef`](rlx_ir::ops::OpDef)), built with
    /// [`Op::defined`](rlx_ir::Op::defined).
    pub use rlx_ir::ops::{
        Dequantize, FakeQuantize, Fft, FftKind, QAdd, QConv2d, QLinear, QOut, QPool, Quantize,
    };
    pub use rlx_ir::{
        Activation, BinaryOp, CmpOp, ConvAttrs, DotDims, FusedRegion, FusionKind, MaskKind,
        PoolAttrs, PoolKind, ReduceKind, TopKOutput,
    };
}

/// Quantization: the layouts of packed weights taken by `Op::DequantMatMul` and
/// `Op::DequantizeRows`, and post-training int8 quantization (calibration, the quantization
/// map, `insert_q_dq`, `quant_propagate`) with its fixed-point arithmetic.
pub mod quant {
    pub use rlx_ir::quant::fixed;
    pub use rlx_ir::QuantScheme;
    pub use rlx_opt::quant::{
        activation_entry, calibrate, insert_q_dq, integer_core, quant_propagate, specialize_params,
        taps, weight_entry, CalibrationEntry, CalibrationRecord, Calibrator, IntegerCore, QuantMap,
        RangeMethod, TapKind,
    };
}

/// Automatic differentiation: reverse mode (`grad_with_loss`, `grad`, `value_and_grad`), forward mode (`jvp`),
/// Hessian-vector products (`hvp`), higher-order derivatives (`nth_order_grad`), and the
/// vectorizing map (`vmap`, `vmap_axes`). They compose: `vmap` of `grad` gives per-example
/// gradients.
pub mod autodiff {
    pub use rlx_opt::autodiff::{
        bake_input, grad, grad_with_loss, hvp, jvp, nth_order_grad, prepare_for_ad, tangent_name,
        value_and_grad, D_OUTPUT,
    };
    pub use rlx_opt::vmap::{vmap, vmap_axes};
}

#[cfg(feature = "embed")]
pub mod embed;
#[cfg(feature = "hub")]
pub mod hub;
#[cfg(feature = "gguf")]
pub mod llm;
pub mod macros;
pub mod models;
#[cfg(feature = "gguf")]
pub mod serve;
pub mod train;

/// Everything most programs need: `use rlx::prelude::*;`.
pub mod prelude {
    pub use crate::ops::*;
    pub use rlx_driver::Device;
    pub use rlx_ir::{DType, Dim, Error, Graph, NodeId, Op, OpKind, Result, Shape};
    pub use rlx_runtime::{CompiledGraph, PrecisionPolicy, Session};
}
