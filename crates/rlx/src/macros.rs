//! `#[rlx_model]`: a function that builds a graph becomes a lazily compiled model, as
//! `jax.jit` turns a Python function into a compiled one.
//!
//! ```
//! use rlx::prelude::*;
//! use rlx::macros::rlx_model;
//!
//! /// `x · w + b` for a batch of `rows`.
//! #[rlx_model(threads = 1)]
//! fn affine(g: &mut Graph, rows: usize) -> Result<NodeId> {
//!     let x = g.try_input("x", Shape::new(&[rows, 3], DType::F32))?;
//!     let w = g.try_param("w", Shape::new(&[3, 2], DType::F32))?;
//!     let b = g.try_param("b", Shape::new(&[2], DType::F32))?;
//!     let y = g.try_dot(x, w)?;
//!     g.try_add(y, b)
//! }
//!
//! let mut m = affine(2);              // nothing built or compiled yet
//! assert!(!m.is_compiled());
//! m.set_param("w", &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0])?;   // builds and compiles, once
//! m.set_param("b", &[0.5, -0.5])?;
//! let y = m.run(&[("x", &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])])?;
//! assert_eq!(y, vec![vec![4.5, 4.5, 10.5, 10.5]]);
//! assert!(m.is_compiled());
//! # Ok::<(), rlx::Error>(())
//! ```
//!
//! The function takes `&mut Graph` first and returns `rlx::Result` of its outputs (a `NodeId`,
//! a `Vec<NodeId>` or an array of them); its other arguments are kept by the model until it is
//! built, so they are taken by value. Options: `device = "cpu" | "gpu" | "vulkan"`, `threads = N`,
//! `precision = "auto_mixed_bf16"` (any [`PrecisionPolicy`](crate::PrecisionPolicy) name);
//! [`LazyModel::with_session`] replaces the session before the first compile.
//!
//! Misuse is a compile error that says what to write instead, for example a function without
//! the graph argument:
//!
//! ```compile_fail
//! #[rlx::macros::rlx_model]
//! fn no_graph(rows: usize) -> rlx::Result<rlx::NodeId> {
//!     Err(rlx::Error::Invalid(format!("{rows} rows but no graph to put them in")))
//! }
//! ```
//!
//! an extra argument taken by reference (the model outlives the call):
//!
//! ```compile_fail
//! #[rlx::macros::rlx_model]
//! fn borrowed(g: &mut rlx::Graph, name: &str) -> rlx::Result<rlx::NodeId> {
//!     g.try_input(name, rlx::Shape::new(&[1], rlx::DType::F32))
//! }
//! ```
//!
//! a generic or async function, an unknown option or policy:
//!
//! ```compile_fail
//! #[rlx::macros::rlx_model(precision = "f8")]
//! fn wrong_policy(g: &mut rlx::Graph) -> rlx::Result<rlx::NodeId> {
//!     g.try_input("x", rlx::Shape::new(&[1], rlx::DType::F32))
//! }
//! ```
//!
//! ```compile_fail
//! #[rlx::macros::rlx_model]
//! fn generic<T>(g: &mut rlx::Graph) -> rlx::Result<rlx::NodeId> {
//!     g.try_input("x", rlx::Shape::new(&[1], rlx::DType::F32))
//! }
//! ```
//!
//! and a function whose outputs are not node ids:
//!
//! ```compile_fail,E0277
//! #[rlx::macros::rlx_model]
//! fn not_nodes(g: &mut rlx::Graph) -> rlx::Result<f32> {
//!     Ok(1.0)
//! }
//! ```

pub use rlx_macros::rlx_model;

use rlx_ir::{DType, Error, Graph, NodeId, Result};
use rlx_runtime::{CompiledGraph, Session};

/// What a `#[rlx_model]` function may return as its outputs.
pub trait IntoOutputs {
    /// The output nodes, in order.
    fn into_outputs(self) -> Result<Vec<NodeId>>;
}

impl IntoOutputs for NodeId {
    fn into_outputs(self) -> Result<Vec<NodeId>> {
        Ok(vec![self])
    }
}

impl IntoOutputs for Vec<NodeId> {
    fn into_outputs(self) -> Result<Vec<NodeId>> {
        Ok(self)
    }
}

impl<const N: usize> IntoOutputs for [NodeId; N] {
    fn into_outputs(self) -> Result<Vec<NodeId>> {
        Ok(self.to_vec())
    }
}

type Builder = Box<dyn FnOnce(&mut Graph) -> Result<Vec<NodeId>> + Send>;

/// A model whose graph is built and compiled on first use and kept afterwards: what a
/// `#[rlx_model]` function returns. A failure to build or compile is kept too and returned by
/// every later call.
pub struct LazyModel {
    name: &'static str,
    session: Session,
    builder: Option<Builder>,
    graph: Option<Result<Graph>>,
    compiled: Option<Result<Box<CompiledGraph>>>,
}

impl LazyModel {
    /// A model named `name` whose graph `build` writes (returning its outputs), compiled with
    /// `session` when first needed.
    pub fn new(
        name: &'static str,
        session: Session,
        build: impl FnOnce(&mut Graph) -> Result<Vec<NodeId>> + Send + 'static,
    ) -> LazyModel {
        LazyModel {
            name,
            session,
            builder: Some(Box::new(build)),
            graph: None,
            compiled: None,
        }
    }

    /// The function's name (also the graph's).
    pub fn name(&self) -> &str {
        self.name
    }

    /// The session it compiles with.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Compile with `session` instead (another device, thread count or precision). A compiled
    /// program is dropped, with its param values; the graph is kept and compiled again when
    /// next needed.
    pub fn with_session(mut self, session: Session) -> LazyModel {
        self.session = session;
        self.compiled = None;
        self
    }

    /// Whether the graph has been compiled.
    pub fn is_compiled(&self) -> bool {
        matches!(self.compiled, Some(Ok(_)))
    }

    /// The graph as the function built it (running the function the first time).
    pub fn graph(&mut self) -> Result<&Graph> {
        if self.graph.is_none() {
            let Some(build) = self.builder.take() else {
                return Err(Error::Invalid(format!(
                    "model \"{}\": its builder panicked before",
                    self.name
                )));
            };
            let mut g = Graph::new(self.name);
            let built = build(&mut g).and_then(|outs| g.try_set_outputs(outs));
            self.graph = Some(built.map(|()| g));
        }
        match &self.graph {
            Some(Ok(g)) => Ok(g),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::Invalid(format!(
                "model \"{}\" has no graph",
                self.name
            ))),
        }
    }

    /// The compiled program, building and compiling it on the first call.
    pub fn compiled(&mut self) -> Result<&mut CompiledGraph> {
        if self.compiled.is_none() {
            let c = match self.graph() {
                Ok(g) => {
                    let g = g.clone();
                    self.session.try_compile(g).map(Box::new)
                }
                Err(e) => Err(e),
            };
            self.compiled = Some(c);
        }
        match &mut self.compiled {
            Some(Ok(c)) => Ok(c),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::Invalid(format!(
                "model \"{}\" is not compiled",
                self.name
            ))),
        }
    }

    /// Run with f32 inputs (see [`CompiledGraph::try_run`]), compiling first if needed.
    pub fn run(&mut self, inputs: &[(&str, &[f32])]) -> Result<Vec<Vec<f32>>> {
        self.compiled()?.try_run(inputs)
    }

    /// Run with raw little-endian inputs of any dtype (see [`CompiledGraph::try_run_typed`]).
    pub fn run_typed(&mut self, inputs: &[(&str, &[u8], DType)]) -> Result<Vec<(Vec<u8>, DType)>> {
        self.compiled()?.try_run_typed(inputs)
    }

    /// Set a param from f32 values, compiling first if needed.
    pub fn set_param(&mut self, name: &str, values: &[f32]) -> Result<()> {
        self.compiled()?.try_set_param(name, values)
    }

    /// Read a param back as f32, compiling first if needed.
    pub fn get_param(&mut self, name: &str) -> Result<Vec<f32>> {
        self.compiled()?.try_get_param(name)
    }
}
