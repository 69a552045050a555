//! Native CPU kernels for ops registered from outside the IR (`rlx_ir::ops::register`): a
//! downstream crate gives the CPU backend a kernel for its op by name ([`register_kernel`]),
//! and the backend then runs the op natively instead of its decomposition. The kernel sees each
//! operand as dense little-endian bytes with its shape and fills the result's dense bytes.

use super::{kernel, materialize, Lowered, NodeInfo, TRef};
use rlx_ir::convert::{bytes_to_f64, f64_to_bytes};
use rlx_ir::ops::{DefinedOp, SelectiveScan};
use rlx_ir::{Result, Shape};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A CPU kernel of a registered op: the op (its attributes through
/// [`DefinedOp::downcast`]), the operands' dense bytes and shapes, and the result's dense bytes
/// (to fill) and shape. The op's `infer` has checked the shapes, so the kernel does not fail.
pub type CpuKernel = Arc<dyn Fn(&DefinedOp, &[(&[u8], &Shape)], &mut [u8], &Shape) + Send + Sync>;

fn kernels() -> &'static RwLock<HashMap<&'static str, CpuKernel>> {
    static K: std::sync::OnceLock<RwLock<HashMap<&'static str, CpuKernel>>> =
        std::sync::OnceLock::new();
    K.get_or_init(Default::default)
}

/// Give the CPU backend a native kernel for the registered op `name` (replacing one given
/// before). Ops without one run as their decomposition.
pub fn register_kernel(name: &'static str, f: CpuKernel) {
    kernels()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name, f);
}

/// The kernel registered for `op`, if any; the IR's own ops defined by an `OpDef` that have a
/// CPU kernel here are recognised by their type.
pub(super) fn of(op: &DefinedOp) -> Option<CpuKernel> {
    if let Some(s) = op.downcast::<SelectiveScan>() {
        let s = *s;
        return Some(Arc::new(move |_, ins, out, shape| {
            selective_scan(s, ins, out, shape)
        }));
    }
    kernels()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(op.name())
        .cloned()
}

/// Lower a node whose op has a registered kernel: operands copied dense into scratch, then the
/// kernel, one step.
pub(super) fn lower(info: &NodeInfo<'_>, op: &DefinedOp, f: CpuKernel) -> Result<Lowered> {
    let bytes: Vec<usize> = info
        .ins
        .iter()
        .zip(&info.in_dtypes)
        .map(|(l, d)| l.numel() * d.size_bytes())
        .collect();
    let shapes: Vec<Shape> = info
        .ins
        .iter()
        .zip(&info.in_dtypes)
        .map(|(l, d)| Shape::new(l.dims(), *d))
        .collect();
    let out_shape = info.node.shape.clone();
    let out_bytes = out_shape.size_bytes().unwrap_or(0);
    let op = op.clone();
    let scratch: usize = bytes.iter().sum();
    Ok(Lowered::Compute {
        scratch,
        build: Box::new(move |ins: &[TRef], out: TRef, tmp| {
            let ins: Vec<TRef> = ins.to_vec();
            kernel(move |_pool| {
                let mut at = 0;
                let mut views: Vec<(&[u8], &Shape)> = Vec::with_capacity(ins.len());
                for ((t, n), s) in ins.iter().zip(&bytes).zip(&shapes) {
                    // SAFETY: the scratch holds every operand's bytes, one after another, and
                    // nothing else touches it during this step.
                    let dst = unsafe { std::slice::from_raw_parts_mut(tmp.get().add(at), *n) };
                    materialize(t, dst);
                    views.push((&*dst, s));
                    at += n;
                }
                // SAFETY: the result buffer is dense and `out_bytes` long.
                let o = unsafe { std::slice::from_raw_parts_mut(out.ptr.get(), out_bytes) };
                f(&op, &views, o, &out_shape);
            })
        }),
    })
}

/// Mamba's selective scan: the recurrence itself (linear in the sequence length, where the
/// decomposition is quadratic), in f64 for every float dtype.
fn selective_scan(s: SelectiveScan, ins: &[(&[u8], &Shape)], out: &mut [u8], shape: &Shape) {
    let dt = shape.dtype();
    let w = dt.size_bytes();
    let vals: Vec<Vec<f64>> = ins
        .iter()
        .map(|(b, _)| b.chunks_exact(w).map(|c| bytes_to_f64(c, dt)).collect())
        .collect();
    let u = ins[0].1.static_dims().unwrap_or_default();
    let n = ins[2].1.static_dims().map_or(0, |d| d[1]);
    let y = s.run((u[0], u[1], u[2], n), &vals);
    for (o, v) in out.chunks_exact_mut(w).zip(y) {
        // The dtype is a float the op's inference admitted: the conversion cannot fail.
        let _ = f64_to_bytes(v, dt, o);
    }
}
