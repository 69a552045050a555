//! Structured errors shared by every RLX crate.

use crate::{DType, NodeId};
use std::fmt;

/// Result alias used across RLX.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong building, transforming, compiling or running a graph.
///
/// Each variant names what a user needs to fix it: the op, the node, and expected vs actual
/// shapes, lengths or dtypes.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// An op was given operands or attributes it cannot take.
    Op {
        /// Op name, e.g. `matmul`.
        op: String,
        /// The node, when it already exists (verifier, passes) — `None` inside a builder call.
        node: Option<NodeId>,
        /// What is wrong, with the shapes involved.
        msg: String,
    },
    /// The verifier found one or more broken invariants.
    Verify(Vec<String>),
    /// A name given to `set_param` / `run` is not an input or param of the graph.
    UnknownName {
        /// `"input"` or `"param"`.
        kind: &'static str,
        /// The name given.
        name: String,
        /// The names the graph does have.
        known: Vec<String>,
    },
    /// `run` was called without a value for a graph input.
    MissingInput {
        /// The input's name.
        name: String,
    },
    /// A buffer handed to `set_param` / `run` has the wrong number of elements.
    Length {
        /// `"input"` or `"param"`.
        kind: &'static str,
        /// The tensor's name.
        name: String,
        /// The declared shape.
        shape: String,
        /// Elements expected.
        expected: usize,
        /// Elements given.
        actual: usize,
    },
    /// A typed buffer has the wrong dtype, or a value does not fit the declared dtype.
    DType {
        /// `"input"` or `"param"`.
        kind: &'static str,
        /// The tensor's name.
        name: String,
        /// Declared dtype.
        expected: DType,
        /// Given dtype.
        actual: DType,
        /// Extra detail.
        msg: String,
    },
    /// A graph output refers to a node that does not exist.
    BadOutput {
        /// The id given.
        node: NodeId,
        /// How many nodes the graph has.
        nodes: usize,
    },
    /// The requested device has no backend in this build.
    DeviceUnavailable {
        /// The device.
        device: String,
        /// What to do about it.
        hint: String,
    },
    /// A backend cannot execute a node and no decomposition exists.
    Unsupported {
        /// Backend name.
        backend: String,
        /// Op name.
        op: String,
        /// The node.
        node: NodeId,
        /// Why.
        msg: String,
    },
    /// Memory for a compiled graph could not be had.
    OutOfMemory {
        /// Backend name.
        backend: String,
        /// What the memory was for (`"the arena"`, `param "w"`, ...).
        what: String,
        /// Bytes asked for.
        bytes: usize,
    },
    /// The device failed while running or exchanging data (a lost GPU device, a driver error).
    Device {
        /// Backend name.
        backend: String,
        /// What failed, with the device's own message.
        msg: String,
    },
    /// Serialized IR could not be read.
    Parse(String),
    /// Any other invalid request, with its explanation.
    Invalid(String),
}

impl Error {
    /// Shorthand for [`Error::Op`] without a node.
    pub fn op(op: impl Into<String>, msg: impl Into<String>) -> Error {
        Error::Op {
            op: op.into(),
            node: None,
            msg: msg.into(),
        }
    }

    /// Attach the node id to an [`Error::Op`] that lacks one.
    pub fn at(self, id: NodeId) -> Error {
        match self {
            Error::Op {
                op,
                node: None,
                msg,
            } => Error::Op {
                op,
                node: Some(id),
                msg,
            },
            e => e,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Op {
                op,
                node: Some(n),
                msg,
            } => write!(f, "{op} (node {n}): {msg}"),
            Error::Op {
                op,
                node: None,
                msg,
            } => write!(f, "{op}: {msg}"),
            Error::Verify(errs) => {
                write!(f, "graph verification failed with {} error(s):", errs.len())?;
                for e in errs {
                    write!(f, "\n  - {e}")?;
                }
                Ok(())
            }
            Error::UnknownName { kind, name, known } => {
                write!(f, "unknown {kind} \"{name}\"; the graph's {kind}s are: ")?;
                if known.is_empty() {
                    f.write_str("(none)")
                } else {
                    let q: Vec<String> = known.iter().map(|k| format!("\"{k}\"")).collect();
                    f.write_str(&q.join(", "))
                }
            }
            Error::MissingInput { name } => {
                write!(
                    f,
                    "missing input \"{name}\": pass a value for every graph input to run"
                )
            }
            Error::Length {
                kind,
                name,
                shape,
                expected,
                actual,
            } => {
                let given = if *actual == 1 {
                    "1 element was given".to_string()
                } else {
                    format!("{actual} elements were given")
                };
                write!(
                    f,
                    "{kind} \"{name}\" has shape {shape} ({expected} elements) but {given}"
                )
            }
            Error::DType {
                kind,
                name,
                expected,
                actual,
                msg,
            } => {
                write!(
                    f,
                    "{kind} \"{name}\" is declared {expected} but got {actual}"
                )?;
                if !msg.is_empty() {
                    write!(f, ": {msg}")?;
                }
                Ok(())
            }
            Error::BadOutput { node, nodes } => {
                write!(
                    f,
                    "output {node} is not a node of the graph (it has {nodes} nodes)"
                )
            }
            Error::OutOfMemory {
                backend,
                what,
                bytes,
            } => write!(
                f,
                "the {backend} backend cannot allocate {bytes} bytes for {what}: not enough memory"
            ),
            Error::Device { backend, msg } => write!(f, "the {backend} device failed: {msg}"),
            Error::DeviceUnavailable { device, hint } => {
                write!(f, "device {device} is not available in this build: {hint}")
            }
            Error::Unsupported {
                backend,
                op,
                node,
                msg,
            } => {
                write!(
                    f,
                    "the {backend} backend cannot run {op} (node {node}): {msg}"
                )
            }
            Error::Parse(m) => write!(f, "cannot parse RLX IR: {m}"),
            Error::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}
