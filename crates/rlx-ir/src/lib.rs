//! RLX tensor IR.
//!
//! - [`DType`] and [`Shape`] (static or named dimensions) describe values.
//! - [`Op`] names the operations; their rules (shape/dtype inference, decompositions) live in
//!   one family file each under [`ops`].
//! - [`Graph`] is an arena of [`Node`]s addressed by [`NodeId`], built with checked methods
//!   (`try_add`, `try_matmul`, ...) that return structured [`Error`]s naming op and shapes.
//! - [`verify`] checks all invariants at once. The [`text`] form prints (`Display`) and parses
//!   ([`Graph::parse`]); [`Graph::to_json`] and [`Graph::from_json`] round-trip too. Both readers
//!   verify what they read.

#![deny(missing_docs)]

mod builders;
pub mod convert;
mod dtype;
pub mod env;
mod error;
pub mod eval;
mod graph;
pub mod hex;
mod op;
pub mod ops;
pub mod quant;
mod shape;
pub mod svg;
pub mod text;
mod verify;

pub use dtype::DType;
pub use error::{Error, Result};
pub use graph::{Graph, Node, NodeId};
pub use op::{
    Activation, BinaryOp, CmpOp, ConvAttrs, CustomFn, DotDims, FusedRegion, FusionKind, MaskKind,
    Op, OpKind, PoolAttrs, PoolKind, ReduceKind, TopKOutput,
};
pub use quant::QuantScheme;
pub use shape::{broadcast_dims, Dim, Shape};
pub use verify::verify;

impl Graph {
    /// Serialize to JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("graphs always serialize")
    }

    /// Read a graph from JSON and verify it; malformed or inconsistent input is an error.
    pub fn from_json(s: &str) -> Result<Graph> {
        let g: Graph = serde_json::from_str(s).map_err(|e| Error::Parse(e.to_string()))?;
        verify(&g)?;
        Ok(g)
    }
}
