//! RLX runtime: [`Session`] compiles a [`Graph`] for a [`Device`] into a [`CompiledGraph`] that
//! holds the executable, its arena and its weights.
//!
//! ```
//! use rlx_ir::{DType, Graph, Shape};
//! use rlx_runtime::{Device, Session};
//! let mut g = Graph::new("double");
//! let x = g.input("x", Shape::new(&[3], DType::F32));
//! let y = g.add(x, x);
//! g.set_outputs(vec![y]);
//! let mut c = Session::new(Device::Cpu).compile(g);
//! assert_eq!(c.run(&[("x", &[1.0, 2.0, 3.0])]), vec![vec![2.0, 4.0, 6.0]]);
//! ```

#![deny(missing_docs)]

mod cache;
mod compiled;
mod session;

pub use cache::{fingerprint, CacheStats, CompileCache};
pub use compiled::CompiledGraph;
pub use rlx_driver::{register_backend, Backend, CompileOptions, Device, Executable, IoSlot};
pub use rlx_ir::{Error, Graph, Result};
pub use rlx_opt::{PassRecord, Precision, PrecisionPolicy};
pub use session::{Lowered, Session};
