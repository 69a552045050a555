//! The narrow backend interface and the run-time registry.
//!
//! A backend makes no decision about the graph. It answers [`Backend::supports`] (and
//! [`Backend::refusal`], why not) for each node, and [`Backend::fuses`] for the nodes its region
//! kernels take; the compiler decomposes everything it refuses and forms only the regions it
//! takes, so [`Backend::compile`] sees only nodes it accepted. The rest of the compiler's
//! decisions arrive in [`CompileOptions::plan`], which a backend may follow or ignore (except
//! the panel params it asked for with [`Backend::param_panels`]). An [`Executable`] exchanges
//! raw little-endian bytes, and every call returns a `Result`: device failures are
//! `Error::Device`, memory a compile cannot get `Error::OutOfMemory`, a buffer of the wrong
//! length [`byte_length_error`].

use crate::Device;
use rlx_ir::{FusionKind, Graph, NodeId, Result, Shape};
use rlx_opt::LoweringPlan;
use std::sync::{Arc, RwLock};

/// Options a backend receives when compiling.
#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    /// Worker threads for kernels (`None`: one per available core).
    pub threads: Option<usize>,
    /// Param updates the runtime will apply after every run: `(param name, output index)`
    /// means the output overwrites the param (training steps). A backend may then compute the
    /// output straight into the param's storage when nothing reads the old value afterwards,
    /// instead of copying it over after the run (JAX's buffer donation).
    pub updates: Vec<(String, usize)>,
    /// The compiler's decisions for this graph (fused regions are in the graph itself): which
    /// products may skip work, which values to store permuted, which updates to compute in
    /// place. A backend follows them or ignores them; it makes none of its own.
    pub plan: Arc<LoweringPlan>,
}

/// A named, shaped input, param or output slot of an [`Executable`].
#[derive(Clone, Debug, PartialEq)]
pub struct IoSlot {
    /// Name (outputs are named `out0`, `out1`, ...).
    pub name: String,
    /// Declared shape and dtype.
    pub shape: Shape,
}

/// A device backend. The interface is narrow on purpose: say which nodes you run natively, and
/// compile a graph that contains only those. The compiler decomposes the rest first.
pub trait Backend: Send + Sync {
    /// Short name for reports and errors.
    fn name(&self) -> &'static str;
    /// Whether node `id` of `graph` has a native kernel here. For an `Op::Fused` node: whether
    /// this backend lowers that region (else the compiler inlines its body).
    fn supports(&self, graph: &Graph, id: NodeId) -> bool;
    /// Why node `id` of `graph` has no native kernel here (its op, dtypes or shapes), for the
    /// compiler's error when the node has no decomposition either; `None` when it has one.
    /// The default names the op.
    fn refusal(&self, graph: &Graph, id: NodeId) -> Option<String> {
        (!self.supports(graph, id)).then(|| {
            format!(
                "the {} backend has no kernel for {}",
                self.name(),
                graph.node(id).op.name()
            )
        })
    }
    /// Whether node `id` may join a fused region of `kind` that this backend lowers natively
    /// (for [`FusionKind::MultiplyReduce`]: whether it may end one, as the row reduction).
    /// The compiler's fusion passes form only such regions. The default fuses nothing.
    fn fuses(&self, graph: &Graph, id: NodeId, kind: FusionKind) -> bool {
        let _ = (graph, id, kind);
        false
    }
    /// The column-panel width in which this backend wants 2-D bf16 weights stored when they
    /// are read only as the right operand of products (the compiler decides which, see
    /// `rlx_opt::plan::panel_params`; the executable converts when params are set and read).
    /// The default, 0, keeps every param row-major.
    fn param_panels(&self) -> usize {
        0
    }
    /// Compile a verified, optimized graph with static shapes.
    fn compile(&self, graph: &Graph, opts: &CompileOptions) -> Result<Box<dyn Executable>>;

    /// Compile `graph` so that its params share storage with the params of `other` (an
    /// executable of this backend) that have the same name and shape: a model's weights are
    /// then held once by several programs, e.g. a prefill and a decode graph. Backends that
    /// cannot share return an error.
    fn compile_sharing(
        &self,
        graph: &Graph,
        opts: &CompileOptions,
        other: &dyn Executable,
    ) -> Result<Box<dyn Executable>> {
        let _ = (graph, opts, other);
        Err(rlx_ir::Error::Invalid(format!(
            "the {} backend cannot share params between compiled graphs",
            self.name()
        )))
    }
}

/// A compiled graph on a device. Buffers are exchanged as raw little-endian bytes of the declared
/// dtype; name lookup and dtype conversion happen in the runtime above. Every exchange and run
/// can fail (a lost GPU device, a driver error, a buffer of the wrong length): the error names
/// the backend and what failed, never a panic.
pub trait Executable: Send {
    /// Graph inputs, in definition order.
    fn inputs(&self) -> &[IoSlot];
    /// Graph params, in definition order.
    fn params(&self) -> &[IoSlot];
    /// Graph outputs, in order.
    fn outputs(&self) -> &[IoSlot];
    /// Copy the bytes of input `idx` (exactly its byte size).
    fn write_input(&mut self, idx: usize, bytes: &[u8]) -> Result<()>;
    /// Copy the bytes of param `idx` (exactly its byte size); kept until overwritten.
    fn write_param(&mut self, idx: usize, bytes: &[u8]) -> Result<()>;
    /// Overwrite bytes `offset..offset + bytes.len()` of param `idx` (the runtime checks the
    /// range). Lets large weights be streamed in pieces. The default goes through a full copy.
    fn write_param_range(&mut self, idx: usize, offset: usize, bytes: &[u8]) -> Result<()> {
        let mut all = vec![0u8; self.params()[idx].shape.size_bytes().unwrap_or(0)];
        self.read_param(idx, &mut all)?;
        let end = offset
            .checked_add(bytes.len())
            .filter(|&e| e <= all.len())
            .ok_or_else(|| {
                rlx_ir::Error::Invalid(format!(
                    "bytes {offset}..+{} are outside param \"{}\" ({} bytes)",
                    bytes.len(),
                    self.params()[idx].name,
                    all.len()
                ))
            })?;
        all[offset..end].copy_from_slice(bytes);
        self.write_param(idx, &all)
    }
    /// Read param `idx` back into `out` (exactly its byte size).
    fn read_param(&self, idx: usize, out: &mut [u8]) -> Result<()>;
    /// Run the graph on the current inputs and params.
    fn execute(&mut self) -> Result<()>;
    /// Copy output `idx` (dense, row-major) into `out` (exactly its byte size).
    fn read_output(&self, idx: usize, out: &mut [u8]) -> Result<()>;
    /// The executable as `Any`, so its backend can recognise its own executables (see
    /// [`Backend::compile_sharing`]).
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
    /// Overwrite param `param` with output `output` (same shape and dtype) on the device, as
    /// training updates do after each step. The default goes through host memory; backends
    /// override it to copy in place.
    fn assign_param(&mut self, param: usize, output: usize) -> Result<()> {
        let mut buf = vec![0u8; self.outputs()[output].shape.size_bytes().unwrap_or(0)];
        self.read_output(output, &mut buf)?;
        self.write_param(param, &buf)
    }
}

/// The error for a buffer of the wrong byte length handed to an [`Executable`] (the runtime
/// checks lengths before; this is what a backend answers a direct caller).
pub fn byte_length_error(kind: &'static str, slot: &IoSlot, given: usize) -> rlx_ir::Error {
    let want = slot.shape.size_bytes().unwrap_or(0);
    rlx_ir::Error::Invalid(format!(
        "{kind} \"{}\" ({}) takes {want} bytes, {given} were given",
        slot.name, slot.shape
    ))
}

type Registry = RwLock<Vec<(Device, Arc<dyn Backend>)>>;

static REGISTRY: Registry = RwLock::new(Vec::new());

/// Register (or replace) the backend used for `device`.
pub fn register_backend(device: Device, backend: Arc<dyn Backend>) {
    let mut r = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    r.retain(|(d, _)| *d != device);
    r.push((device, backend));
}

/// The backend registered for `device`, if any.
pub fn registered_backend(device: Device) -> Option<Arc<dyn Backend>> {
    let r = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    r.iter().find(|(d, _)| *d == device).map(|(_, b)| b.clone())
}
