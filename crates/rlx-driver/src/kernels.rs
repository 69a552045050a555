//! Kernels that downstream crates give a backend for ops they registered from outside the IR
//! (`rlx_ir::ops::register`), by op name: the table a backend keeps ([`KernelRegistry`]) and the
//! builder type ([`KernelBuilder`]). Each backend defines its kernel type (WGSL for wgpu, CUDA
//! C for CUDA) and exposes `register_kernel` over one of these.

use rlx_ir::ops::DefinedOp;
use rlx_ir::{Graph, NodeId, Op, Shape};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

/// Builds a backend's kernel `K` for one node of a registered op: the op (its attributes
/// through [`DefinedOp::downcast`]), the operands' shapes and the result's; `None` where it does
/// not take them (the node then runs as the op's decomposition).
pub type KernelBuilder<K> = Arc<dyn Fn(&DefinedOp, &[&Shape], &Shape) -> Option<K> + Send + Sync>;

/// A backend's kernels for registered ops, by op name (a `static`).
pub struct KernelRegistry<K> {
    table: OnceLock<RwLock<HashMap<&'static str, KernelBuilder<K>>>>,
}

impl<K> KernelRegistry<K> {
    /// An empty table.
    pub const fn new() -> Self {
        Self {
            table: OnceLock::new(),
        }
    }

    fn table(&self) -> &RwLock<HashMap<&'static str, KernelBuilder<K>>> {
        self.table.get_or_init(Default::default)
    }

    /// Give the backend `builder` for the registered op `name` (replacing one given before).
    pub fn register(&self, name: &'static str, builder: KernelBuilder<K>) {
        self.table()
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, builder);
    }

    /// The kernel of node `id` of `g`: its op's builder, called when the result and every
    /// operand are values the backend `holds`.
    pub fn kernel_for(&self, g: &Graph, id: NodeId, holds: impl Fn(&Shape) -> bool) -> Option<K> {
        let n = g.node(id);
        let Op::Defined(d) = &n.op else { return None };
        let build = self
            .table()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(d.name())
            .cloned()?;
        let shapes: Vec<&Shape> = n.inputs.iter().map(|&x| g.shape(x)).collect();
        if !holds(&n.shape) || !shapes.iter().all(|s| holds(s)) {
            return None;
        }
        build(d, &shapes, &n.shape)
    }
}

impl<K> Default for KernelRegistry<K> {
    fn default() -> Self {
        Self::new()
    }
}
