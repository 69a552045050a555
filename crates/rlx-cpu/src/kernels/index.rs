//! Gather and ScatterAdd along an axis. Gather clamps out-of-range indices into range and
//! ScatterAdd drops out-of-range updates (JAX's defaults), so no index can read or write outside
//! a buffer.

use super::{compute, kernel, Kernel, Lowered, NodeInfo, TRef};
use crate::elem::Elem;
use crate::layout::{for_each_run, Layout};
use crate::with_dtype;
use rlx_ir::{DType, Op, Result};

/// The integer dtypes an index tensor may have (resolved at lowering, so the kernels read only
/// these).
#[derive(Clone, Copy, Debug)]
pub(super) enum IndexType {
    I8,
    I16,
    I32,
    I64,
    U8,
    U32,
}

impl IndexType {
    /// The index type of `dt`, `None` for a dtype that is not an integer.
    pub(super) fn of(dt: DType) -> Option<IndexType> {
        match dt {
            DType::I8 => Some(IndexType::I8),
            DType::I16 => Some(IndexType::I16),
            DType::I32 => Some(IndexType::I32),
            DType::I64 => Some(IndexType::I64),
            DType::U8 => Some(IndexType::U8),
            DType::U32 => Some(IndexType::U32),
            DType::F32 | DType::F16 | DType::BF16 | DType::F64 | DType::Bool | DType::C64 => None,
        }
    }
}

/// Read the integer at element offset `off` of an index tensor of type `it`.
#[inline(always)]
pub(super) unsafe fn read_index(idx: &TRef, it: IndexType, off: usize) -> i64 {
    match it {
        IndexType::I32 => *idx.base::<i32>().add(off) as i64,
        IndexType::I64 => *idx.base::<i64>().add(off),
        IndexType::U32 => *idx.base::<u32>().add(off) as i64,
        IndexType::I16 => *idx.base::<i16>().add(off) as i64,
        IndexType::I8 => *idx.base::<i8>().add(off) as i64,
        IndexType::U8 => *idx.base::<u8>().add(off) as i64,
    }
}

/// Offsets of all elements of `l` (row-major), relative to `l.offset` included.
fn each_offset(l: &Layout, mut f: impl FnMut(usize)) {
    for_each_run(l.dims(), [l], 0..l.numel(), |[i], n, [s]| {
        (0..n).for_each(|t| f(i + t * s))
    });
}

/// The leading axes `..axis` and trailing axes `axis+1..` of `l` (trailing with offset 0).
fn pre_post(l: &Layout, axis: usize) -> (Layout, Layout) {
    let mut pre = *l;
    for a in (axis..l.rank()).rev() {
        pre = pre.remove_axis(a);
    }
    let mut post = *l;
    post.offset = 0;
    for a in (0..=axis).rev() {
        post = post.remove_axis(a);
    }
    (pre, post)
}

fn gather<T: Elem>(x: TRef, idx: TRef, it: IndexType, out: TRef, axis: usize) -> Box<dyn Kernel> {
    kernel(move |_| {
        let (pre, post) = pre_post(&x.layout, axis);
        let n = x.layout.dims()[axis] as i64;
        let sa = x.layout.strides()[axis];
        let (px, po) = (x.base::<T>() as *const T, out.base::<T>());
        let mut o = out.layout.offset;
        if n == 0 {
            // Nothing to gather from; the result (if any) is zeros.
            (0..out.layout.numel()).for_each(|t| unsafe { *po.add(o + t) = T::zero() });
            return;
        }
        // Rows (the trailing axes) stored densely are copied whole.
        let row = post.is_contiguous().then(|| post.numel());
        each_offset(&pre, |pb| {
            each_offset(&idx.layout, |io| {
                // SAFETY: the index is clamped into the axis; offsets come from layouts.
                let v = unsafe { read_index(&idx, it, io) }.clamp(0, (n - 1).max(0)) as usize;
                if let Some(len) = row {
                    // SAFETY: a dense row of `len` elements at the gathered offset; the output
                    // is dense from `o`.
                    unsafe { std::ptr::copy_nonoverlapping(px.add(pb + v * sa), po.add(o), len) };
                    o += len;
                    return;
                }
                each_offset(&post, |q| {
                    unsafe { *po.add(o) = *px.add(pb + v * sa + q) };
                    o += 1;
                });
            });
        });
    })
}

fn scatter_add<T: Elem>(
    x: TRef,
    idx: TRef,
    it: IndexType,
    upd: TRef,
    out: TRef,
    axis: usize,
) -> Box<dyn Kernel> {
    let copy = super::elementwise::copy(x, out);
    kernel(move |pool| {
        copy.run(pool);
        let n = out.layout.dims()[axis] as i64;
        let (pre_u, post_u) = pre_post(&upd.layout, axis);
        let (pre_o, post_o) = pre_post(&out.layout, axis);
        let (pu, po) = (upd.base::<T>() as *const T, out.base::<T>());
        let (su, so) = (upd.layout.strides()[axis], out.layout.strides()[axis]);
        let dense_pre = Layout::contiguous(pre_o.dims());
        let dense_post = Layout::contiguous(post_o.dims());
        // Rows (the trailing axes) stored densely in both are added as slices.
        let row = (post_u.is_contiguous() && post_o.is_contiguous()).then(|| post_o.numel());
        for_each_run(
            pre_o.dims(),
            [&dense_pre, &pre_u, &pre_o],
            0..pre_o.numel(),
            |[_, ub, ob], len, [_, sub, sob]| {
                for t in 0..len {
                    let (ub, ob) = (ub + t * sub, ob + t * sob);
                    let mut j = 0;
                    each_offset(&idx.layout, |io| {
                        // SAFETY: out-of-range indices are skipped; offsets come from layouts.
                        let v = unsafe { read_index(&idx, it, io) };
                        if (0..n).contains(&v) {
                            let (ubase, obase) = (ub + j * su, ob + v as usize * so);
                            if let Some(len) = row {
                                // SAFETY: dense rows of `len` elements; an update row never
                                // overlaps the output (they are different buffers).
                                let (d, u) = unsafe {
                                    (
                                        std::slice::from_raw_parts_mut(po.add(obase), len),
                                        std::slice::from_raw_parts(pu.add(ubase), len),
                                    )
                                };
                                for (d, &u) in d.iter_mut().zip(u) {
                                    *d = (*d).add(u);
                                }
                                j += 1;
                                return;
                            }
                            for_each_run(
                                post_o.dims(),
                                [&dense_post, &post_u, &post_o],
                                0..post_o.numel(),
                                |[_, u, o], l, [_, s1, s2]| {
                                    for r in 0..l {
                                        unsafe {
                                            let d = po.add(obase + o + r * s2);
                                            *d = (*d).add(*pu.add(ubase + u + r * s1));
                                        }
                                    }
                                },
                            );
                        }
                        j += 1;
                    });
                }
            },
        );
    })
}

pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let dt = info.dtype();
    let ok = with_dtype!(dt, T => { let _ = std::marker::PhantomData::<T>; true }, else false);
    if !ok {
        return Err(info.unsupported(format!("dtype {dt}")));
    }
    let Some(it) = IndexType::of(info.in_dtypes[1]) else {
        return Err(info.unsupported(format!(
            "indices must be integers, got {}",
            info.in_dtypes[1]
        )));
    };
    Ok(match info.node.op {
        // Gather only moves bytes: dispatch on element width.
        Op::Gather { axis } => match dt.size_bytes() {
            1 => compute(move |i, o| gather::<u8>(i[0], i[1], it, o, axis)),
            2 => compute(move |i, o| gather::<i16>(i[0], i[1], it, o, axis)),
            4 => compute(move |i, o| gather::<i32>(i[0], i[1], it, o, axis)),
            8 => compute(move |i, o| gather::<i64>(i[0], i[1], it, o, axis)),
            w => return Err(info.unsupported(format!("{w}-byte elements ({dt})"))),
        },
        Op::ScatterAdd { axis } => {
            with_dtype!(dt, T => compute(move |i, o| scatter_add::<T>(i[0], i[1], it, i[2], o, axis)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        _ => return Err(info.unsupported("not an indexing op")),
    })
}
