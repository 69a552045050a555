//! Reductions along axes: Reduce, Cumsum, TopK.

use super::{compute, kernel, par_ranges, Kernel, Lowered, NodeInfo, TRef};
use crate::elem::{Elem, FloatElem, Real};
use crate::layout::{for_each_run, Layout};
use crate::{with_dtype, with_float};
use rlx_ir::{DType, Op, ReduceKind, Result, TopKOutput};

/// Split `l` into the kept axes and the reduced axes (offset 0).
fn split(l: &Layout, axes: &[usize]) -> (Layout, Layout) {
    let mut kept = *l;
    for &a in axes.iter().rev() {
        kept = kept.remove_axis(a);
    }
    let mut red = *l;
    red.offset = 0;
    for a in (0..l.rank()).rev().filter(|a| !axes.contains(a)) {
        red = red.remove_axis(a);
    }
    (kept, red)
}

/// Calls `f(out_offset, in_base)` for each output element of a reduction in `range`.
fn for_each_out(kept: &Layout, range: std::ops::Range<usize>, mut f: impl FnMut(usize, usize)) {
    let dense = Layout::contiguous(kept.dims());
    for_each_run(kept.dims(), [&dense, kept], range, |[o, i], n, [so, si]| {
        for t in 0..n {
            f(o + t * so, i + t * si);
        }
    });
}

fn fold_line<T: Elem>(x: *const T, base: usize, red: &Layout, init: T, f: impl Fn(T, T) -> T) -> T {
    let mut acc = init;
    let n = red.numel();
    for_each_run(red.dims(), [red], 0..n, |[i], len, [s]| {
        for t in 0..len {
            // SAFETY: offsets lie inside the operand's buffer.
            acc = f(acc, unsafe { *x.add(base + i + t * s) });
        }
    });
    acc
}

/// Sum (or mean) over the leading axes of a dense f32 value, seen as `[rows, cols]`: the output
/// accumulates whole rows, contiguous and vectorizable (the backward pass of every broadcast
/// bias or residual reduces this way). Columns are split across threads.
fn column_sums(x: TRef, out: TRef, rows: usize, cols: usize, mean: bool) -> Box<dyn Kernel> {
    kernel(move |pool| {
        par_ranges(pool, cols, 4096usize.div_ceil(rows.max(1)).max(64), |r| {
            let (px, po) = (x.base::<f32>() as *const f32, out.base::<f32>());
            // SAFETY: the value is dense `rows x cols` from its offset; `r` is within `cols`.
            let acc = unsafe {
                std::slice::from_raw_parts_mut(po.add(out.layout.offset + r.start), r.len())
            };
            acc.fill(0.0);
            for row in 0..rows {
                let src = unsafe {
                    std::slice::from_raw_parts(
                        px.add(x.layout.offset + row * cols + r.start),
                        r.len(),
                    )
                };
                acc.iter_mut().zip(src).for_each(|(a, v)| *a += v);
            }
            if mean {
                let inv = 1.0 / rows as f32;
                acc.iter_mut().for_each(|a| *a *= inv);
            }
        })
    })
}

fn reduce_float<T: FloatElem>(
    kind: ReduceKind,
    x: TRef,
    out: TRef,
    axes: Vec<usize>,
) -> Box<dyn Kernel> {
    let (kept, red) = split(&x.layout, &axes);
    let count = red.numel();
    let leading = axes.iter().enumerate().all(|(i, &a)| i == a);
    if T::DTYPE == rlx_ir::DType::F32
        && matches!(kind, ReduceKind::Sum | ReduceKind::Mean)
        && leading
        && x.layout.is_contiguous()
        && count > 1
        // A reduction over every axis is one contiguous run: summed in f64 lanes below, not
        // one row of one column at a time.
        && kept.numel() > 1
    {
        return column_sums(x, out, count, kept.numel(), kind == ReduceKind::Mean);
    }
    kernel(move |pool| {
        par_ranges(pool, kept.numel(), (1 << 14) / count.max(1) + 1, |r| {
            let (px, po) = (x.base::<T>() as *const T, out.base::<T>());
            for_each_out(&kept, r, |o, base| {
                let v = match kind {
                    ReduceKind::Sum | ReduceKind::Mean => {
                        let mut s = 0f64;
                        for_each_run(red.dims(), [&red], 0..count, |[i], len, [st]| {
                            if T::DTYPE == DType::F32 && st == 1 {
                                // SAFETY: T is f32; the run lies inside the operand's buffer.
                                s += crate::math::sum_f64(unsafe {
                                    std::slice::from_raw_parts(px.add(base + i) as *const f32, len)
                                });
                                return;
                            }
                            for t in 0..len {
                                // SAFETY: offsets lie inside the operand's buffer.
                                s += unsafe { *px.add(base + i + t * st) }.to_c().f64();
                            }
                        });
                        if kind == ReduceKind::Mean {
                            s /= count as f64;
                        }
                        T::from_c(<T as FloatElem>::C::c(s))
                    }
                    ReduceKind::Prod => {
                        let mut s = 1f64;
                        for_each_run(red.dims(), [&red], 0..count, |[i], len, [st]| {
                            for t in 0..len {
                                s *= unsafe { *px.add(base + i + t * st) }.to_c().f64();
                            }
                        });
                        T::from_c(<T as FloatElem>::C::c(s))
                    }
                    ReduceKind::Max => fold_line(px, base, &red, T::lowest(), |a, b| a.max_of(b)),
                    ReduceKind::Min => fold_line(px, base, &red, T::highest(), |a, b| a.min_of(b)),
                };
                // SAFETY: `o` indexes the dense output.
                unsafe { *po.add(o) = v };
            })
        })
    })
}

fn reduce_int<T: Elem>(kind: ReduceKind, x: TRef, out: TRef, axes: Vec<usize>) -> Box<dyn Kernel> {
    let (kept, red) = split(&x.layout, &axes);
    kernel(move |pool| {
        par_ranges(pool, kept.numel(), 1024, |r| {
            let (px, po) = (x.base::<T>() as *const T, out.base::<T>());
            for_each_out(&kept, r, |o, base| {
                let v = match kind {
                    ReduceKind::Sum | ReduceKind::Mean => {
                        fold_line(px, base, &red, T::zero(), |a, b| a.add(b))
                    }
                    ReduceKind::Prod => fold_line(px, base, &red, T::one(), |a, b| a.mul(b)),
                    ReduceKind::Max => fold_line(px, base, &red, T::lowest(), |a, b| a.max_of(b)),
                    ReduceKind::Min => fold_line(px, base, &red, T::highest(), |a, b| a.min_of(b)),
                };
                // SAFETY: `o` indexes the dense output.
                unsafe { *po.add(o) = v };
            })
        })
    })
}

/// Lines along `axis`: the layout of line starts, the line length and its stride.
pub(super) fn lines(l: &Layout, axis: usize) -> (Layout, usize, usize) {
    (l.remove_axis(axis), l.dims()[axis], l.strides()[axis])
}

/// Calls `f(in_start, out_start)` for each line along `axis` in `range` (lines are numbered in
/// row-major order of the remaining axes).
pub(super) fn for_each_line(
    x: &Layout,
    out: &Layout,
    axis: usize,
    range: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize),
) {
    let (xs, _, _) = lines(x, axis);
    let (os, _, _) = lines(out, axis);
    for_each_run(xs.dims(), [&xs, &os], range, |[i, o], n, [si, so]| {
        for t in 0..n {
            f(i + t * si, o + t * so);
        }
    });
}

fn cumsum<T: Elem>(x: TRef, out: TRef, axis: usize) -> Box<dyn Kernel> {
    let float = T::DTYPE.is_float();
    kernel(move |pool| {
        let (_, n, sx) = lines(&x.layout, axis);
        let so = out.layout.strides()[axis];
        let count = x.layout.numel() / n.max(1);
        par_ranges(pool, count, 256, |r| {
            let (px, po) = (x.base::<T>() as *const T, out.base::<T>());
            for_each_line(&x.layout, &out.layout, axis, r, |i, o| {
                let mut f = 0f64;
                let mut s = T::zero();
                for t in 0..n {
                    // SAFETY: line offsets lie inside the buffers.
                    unsafe {
                        let v = *px.add(i + t * sx);
                        if float {
                            f += v.to_f64();
                            *po.add(o + t * so) = T::from_f64(f);
                        } else {
                            s = s.add(v);
                            *po.add(o + t * so) = s;
                        }
                    }
                }
            })
        })
    })
}

fn topk<T: Elem>(x: TRef, out: TRef, k: usize, output: TopKOutput) -> Box<dyn Kernel> {
    let axis = x.layout.rank() - 1;
    kernel(move |pool| {
        let (_, n, sx) = lines(&x.layout, axis);
        let count = x.layout.numel() / n.max(1);
        par_ranges(pool, count, 64, |r| {
            let px = x.base::<T>() as *const T;
            for_each_line(&x.layout, &out.layout, axis, r, |i, o| {
                // Keep the best indices sorted in the output row (indices) or a running list of
                // values (values); equal values keep index order, so ties favour lower indices.
                let get = |j: usize| unsafe { *px.add(i + j * sx) };
                let mut len = 0;
                let pi = out.base::<i32>();
                let pv = out.base::<T>();
                for j in 0..n {
                    let v = get(j);
                    let at = |q: usize| unsafe {
                        match output {
                            TopKOutput::Indices => get(*pi.add(o + q) as usize),
                            TopKOutput::Values => *pv.add(o + q),
                        }
                    };
                    if len == k && v.partial_cmp(&at(k - 1)) != Some(std::cmp::Ordering::Greater) {
                        continue;
                    }
                    let mut pos = len.min(k - 1);
                    while pos > 0 && v > at(pos - 1) {
                        // SAFETY: pos < k, inside the output row.
                        unsafe {
                            match output {
                                TopKOutput::Indices => *pi.add(o + pos) = *pi.add(o + pos - 1),
                                TopKOutput::Values => *pv.add(o + pos) = *pv.add(o + pos - 1),
                            }
                        }
                        pos -= 1;
                    }
                    unsafe {
                        match output {
                            TopKOutput::Indices => *pi.add(o + pos) = j as i32,
                            TopKOutput::Values => *pv.add(o + pos) = v,
                        }
                    }
                    len = (len + 1).min(k);
                }
            })
        })
    })
}

pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let dt = info.in_dtypes[0];
    let ok = with_dtype!(dt, T => { let _ = std::marker::PhantomData::<T>; true }, else false);
    if !ok {
        return Err(info.unsupported(format!("dtype {dt}")));
    }
    Ok(match info.node.op.clone() {
        Op::Reduce { kind, axes, .. } => {
            with_float!(dt, T => compute(move |i, o| reduce_float::<T>(kind, i[0], o, axes)),
            else with_dtype!(dt, T => compute(move |i, o| reduce_int::<T>(kind, i[0], o, axes)), else return Err(info.unsupported(format!("dtype {dt}")))))
        }
        Op::Cumsum { axis } => {
            with_dtype!(dt, T => compute(move |i, o| cumsum::<T>(i[0], o, axis)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        Op::TopK { k, output } => {
            if k == 0 {
                return Ok(compute(|_, _| kernel(|_| {})));
            }
            if dt == DType::Bool && output == TopKOutput::Values {
                return Err(info.unsupported("topk of bool"));
            }
            with_dtype!(dt, T => compute(move |i, o| topk::<T>(i[0], o, k, output)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        _ => return Err(info.unsupported("not a reduction")),
    })
}
