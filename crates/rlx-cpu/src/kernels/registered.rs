//! Native CPU kernels for ops registered from outside the IR (`rlx_ir::ops::register`): a
//! downstream crate gives the CPU backend a kernel for its op by name ([`register_kernel`]),
//! and the backend then runs the op natively instead of its decomposition. The kernel sees each
//! operand as dense little-endian bytes with its shape and fills the result's dense bytes.

use super::{kernel, materialize, par_ranges, Lowered, NodeInfo, Ptr, TRef};
use crate::pool::Pool;
use rlx_ir::convert::{bytes_to_f64, f64_to_bytes};
use rlx_ir::ops::{DefinedOp, SelectiveScan};
use rlx_ir::{DType, Result, Shape};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A CPU kernel of a registered op: the op (its attributes through
/// [`DefinedOp::downcast`]), the operands' dense bytes and shapes, the result's dense bytes (to
/// fill) and shape, and the program's thread pool (for kernels that split their work with
/// [`crate::kernels::par_ranges`]). The op's `infer` has checked the shapes, so the kernel does
/// not fail.
pub type CpuKernel =
    Arc<dyn Fn(&DefinedOp, &[(&[u8], &Shape)], &mut [u8], &Shape, &Pool) + Send + Sync>;

fn kernels() -> &'static RwLock<HashMap<&'static str, CpuKernel>> {
    static K: std::sync::OnceLock<RwLock<HashMap<&'static str, CpuKernel>>> =
        std::sync::OnceLock::new();
    K.get_or_init(Default::default)
}

mod sealed {
    pub trait Sealed {}
}

/// Number types every bit pattern of which is a value, so bytes can be read as them.
pub trait Plain: Copy + Default + sealed::Sealed {}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(
    u8,
    i8,
    i16,
    u32,
    i32,
    i64,
    f32,
    f64,
    rustfft::num_complex::Complex32
);

/// An operand's dense bytes as values of `T`: borrowed where the bytes are aligned for `T`,
/// copied otherwise. For kernels given to [`register_kernel`].
pub fn view<T: Plain>(bytes: &[u8]) -> Cow<'_, [T]> {
    let size = std::mem::size_of::<T>();
    let n = bytes.len() / size;
    if (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        // SAFETY: aligned, `n * size` bytes in bounds, and every bit pattern is a `T`
        // (`Plain`).
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, n) })
    } else {
        let mut v = vec![T::default(); n];
        // SAFETY: `v` holds `n * size` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, n * size)
        };
        Cow::Owned(v)
    }
}

thread_local! {
    /// What a kernel running on this thread reported through [`fail`].
    static KERNEL_FAULT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// The first failure of the run on this thread, with the node that reported it.
    static RUN_FAULT: std::cell::RefCell<Option<rlx_ir::Error>> = const { std::cell::RefCell::new(None) };
}

/// Report, from inside a registered kernel, that it cannot give a result for these operands
/// (a singular matrix, a matrix that is not positive definite, ...): the run then ends with an
/// [`rlx_ir::Error::Op`] naming the op, its node and `msg`. Call it on the thread that runs the
/// kernel (not from work it hands to the pool); the result's bytes are whatever the kernel left.
pub fn fail(msg: impl Into<String>) {
    KERNEL_FAULT.with(|f| {
        f.borrow_mut().get_or_insert_with(|| msg.into());
    });
}

/// Forget any failure this thread holds (the start of a run).
pub(crate) fn clear_faults() {
    KERNEL_FAULT.with(|f| f.borrow_mut().take());
    RUN_FAULT.with(|f| f.borrow_mut().take());
}

/// The first failure a kernel reported during the run on this thread.
pub(crate) fn take_fault() -> Option<rlx_ir::Error> {
    RUN_FAULT.with(|f| f.borrow_mut().take())
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
    if let Some(k) = super::fft::kernel_of(op) {
        return Some(k);
    }
    if let Some(k) = super::qint::kernel_of(op) {
        return Some(k);
    }
    if let Some(s) = op.downcast::<SelectiveScan>() {
        let s = *s;
        return Some(Arc::new(move |_, ins, out, shape, pool| {
            selective_scan(s, ins, out, shape, pool)
        }));
    }
    kernels()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(op.name())
        .cloned()
}

/// Lower a node whose op has a registered kernel: operands read in place where they are dense
/// (and apart from the result), copied dense into scratch otherwise, then the kernel, one step.
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
    let node = info.id;
    let scratch: usize = bytes.iter().sum();
    Ok(Lowered::Compute {
        scratch,
        build: Box::new(move |ins: &[TRef], out: TRef, tmp| {
            let ins: Vec<TRef> = ins.to_vec();
            kernel(move |pool| {
                let mut at = 0;
                let mut views: Vec<(&[u8], &Shape)> = Vec::with_capacity(ins.len());
                let out_range = out.ptr.get() as usize..out.ptr.get() as usize + out_bytes;
                for ((t, n), s) in ins.iter().zip(&bytes).zip(&shapes) {
                    let w = t.dtype.size_bytes();
                    // SAFETY: a contiguous layout covers `n` bytes from its offset.
                    let start = unsafe { t.ptr.get().add(t.layout.offset * w) };
                    let (lo, hi) = (start as usize, start as usize + n);
                    if t.layout.is_contiguous() && (hi <= out_range.start || lo >= out_range.end) {
                        // Dense already and apart from the result: read in place.
                        // SAFETY: as above; nothing writes it during this step.
                        views.push((unsafe { std::slice::from_raw_parts(start, *n) }, s));
                        continue;
                    }
                    // SAFETY: the scratch holds every operand's bytes, one after another, and
                    // nothing else touches it during this step.
                    let dst = unsafe { std::slice::from_raw_parts_mut(tmp.get().add(at), *n) };
                    materialize(t, dst);
                    views.push((&*dst, s));
                    at += n;
                }
                // SAFETY: the result buffer is dense and `out_bytes` long.
                let o = unsafe { std::slice::from_raw_parts_mut(out.ptr.get(), out_bytes) };
                f(&op, &views, o, &out_shape, pool);
                if let Some(msg) = KERNEL_FAULT.with(|k| k.borrow_mut().take()) {
                    let operands: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
                    let e = rlx_ir::Error::Op {
                        op: op.name().to_string(),
                        node: Some(node),
                        msg: format!("{msg} (operands {})", operands.join(", ")),
                    };
                    RUN_FAULT.with(|r| {
                        r.borrow_mut().get_or_insert(e);
                    });
                }
            })
        }),
    })
}

/// Mamba's selective scan: the recurrence itself (linear in the sequence length, where the
/// decomposition is quadratic), its `B·D` channels split over the pool; f32 in f32, the other
/// float dtypes through f64.
fn selective_scan(
    s: SelectiveScan,
    ins: &[(&[u8], &Shape)],
    out: &mut [u8],
    shape: &Shape,
    pool: &Pool,
) {
    let dt = shape.dtype();
    let u = ins[0].1.static_dims().unwrap_or_default();
    let ns = ins[2].1.static_dims().map_or(0, |d| d[1]);
    let (bs, ds, ls) = (u[0], u[1], u[2]);
    if dt == DType::F32 {
        let f: Vec<std::borrow::Cow<'_, [f32]>> = ins.iter().map(|(b, _)| view::<f32>(b)).collect();
        // B and C sequence-major ([B, L, N]), so each step's states are contiguous.
        let seq_major = |v: &[f32]| -> Vec<f32> {
            let mut t = vec![0f32; bs * ls * ns];
            for bi in 0..bs {
                for n in 0..ns {
                    for l in 0..ls {
                        t[(bi * ls + l) * ns + n] = v[(bi * ns + n) * ls + l];
                    }
                }
            }
            t
        };
        let (bt, ct) = (seq_major(&f[3]), seq_major(&f[4]));
        // Results go straight into `out` when it is aligned for f32 (arena buffers are).
        let aligned = (out.as_ptr() as usize).is_multiple_of(4);
        let mut tmp = vec![0f32; if aligned { 0 } else { bs * ds * ls }];
        let yp = Ptr(if aligned {
            out.as_mut_ptr()
        } else {
            tmp.as_mut_ptr() as *mut u8
        });
        par_ranges(pool, bs * ds, 1, |chans| {
            let (mut x, mut dl) = (vec![0f32; ns], vec![0f32; ls]);
            for ch in chans {
                let (bi, di) = (ch / ds, ch % ds);
                let row = ch * ls..(ch + 1) * ls;
                if s.delta_softplus {
                    crate::math::softplus_rows(&f[1][row.clone()], &mut dl);
                } else {
                    dl.copy_from_slice(&f[1][row.clone()]);
                }
                // SAFETY: `yp` holds `bs * ds * ls` f32 results, 4-byte aligned; each channel
                // writes its own `ls` of them.
                let y = unsafe {
                    std::slice::from_raw_parts_mut((yp.get() as *mut f32).add(row.start), ls)
                };
                x.iter_mut().for_each(|v| *v = 0.0);
                let bc = bi * ls * ns..(bi + 1) * ls * ns;
                crate::math::scan_channel(
                    &mut x,
                    &f[2][di * ns..(di + 1) * ns],
                    &bt[bc.clone()],
                    &ct[bc],
                    &dl,
                    &f[0][row.clone()],
                    y,
                );
                if let Some(dk) = f.get(5) {
                    for (yl, &ul) in y.iter_mut().zip(&f[0][row.clone()]) {
                        *yl += ul * dk[di];
                    }
                }
                if let Some(z) = f.get(6) {
                    crate::math::silu_gate_in_place(y, &z[row.clone()]);
                }
            }
        });
        if !aligned {
            for (o, v) in out.chunks_exact_mut(4).zip(tmp) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        return;
    }
    let w = dt.size_bytes();
    let vals: Vec<Vec<f64>> = ins
        .iter()
        .map(|(b, _)| b.chunks_exact(w).map(|c| bytes_to_f64(c, dt)).collect())
        .collect();
    let y = s.run((bs, ds, ls, ns), &vals);
    for (o, v) in out.chunks_exact_mut(w).zip(y) {
        // The dtype is a float the op's inference admitted: the conversion cannot fail.
        let _ = f64_to_bytes(v, dt, o);
    }
}
