//! Softmax (any axis), LayerNorm and RmsNorm (last axis), computed in the compute type.

use super::reduce::{for_each_line, lines};
use super::{compute, kernel, par_ranges, Kernel, Lowered, NodeInfo, TRef};
use crate::elem::{FloatElem, Real};
use crate::with_float;
use rlx_ir::{Op, Result};

fn softmax<T: FloatElem>(x: TRef, out: TRef, axis: usize) -> Box<dyn Kernel> {
    kernel(move |pool| {
        let (_, n, sx) = lines(&x.layout, axis);
        let so = out.layout.strides()[axis];
        let count = x.layout.numel() / n.max(1);
        let rows_dense = T::DTYPE == rlx_ir::DType::F32
            && axis + 1 == x.layout.rank()
            && x.layout.is_contiguous()
            && out.layout.is_contiguous();
        par_ranges(pool, count, (1 << 14) / n.max(1) + 1, |r| {
            let (px, po) = (x.base::<T>() as *const T, out.base::<T>());
            if rows_dense && n > 0 {
                // Whole dense f32 rows: one vectorized call for the range.
                // SAFETY: rows `r` lie inside both buffers (dense from their offsets).
                let (xs, ys) = unsafe {
                    let (xo, oo) = (
                        x.layout.offset + r.start * n,
                        out.layout.offset + r.start * n,
                    );
                    (
                        std::slice::from_raw_parts((px as *const f32).add(xo), r.len() * n),
                        std::slice::from_raw_parts_mut((po as *mut f32).add(oo), r.len() * n),
                    )
                };
                crate::math::softmax_rows(xs, ys, n);
                return;
            }
            for_each_line(&x.layout, &out.layout, axis, r, |i, o| unsafe {
                // SAFETY: line offsets lie inside the buffers.
                if T::DTYPE == rlx_ir::DType::F32 && sx == 1 && so == 1 {
                    // Dense f32 rows: vectorized max, exp and sum.
                    let xs = std::slice::from_raw_parts(px.add(i) as *const f32, n);
                    let ys = std::slice::from_raw_parts_mut(po.add(o) as *mut f32, n);
                    let m = crate::math::max_f32(xs);
                    let inv = 1.0 / crate::math::exp_shift_sum(xs, m, ys);
                    ys.iter_mut().for_each(|y| *y *= inv);
                    return;
                }
                let mut m = T::lowest().to_c();
                for t in 0..n {
                    let v = (*px.add(i + t * sx)).to_c();
                    if v > m {
                        m = v;
                    }
                }
                let mut s = <T as FloatElem>::C::c(0.0);
                for t in 0..n {
                    let e = ((*px.add(i + t * sx)).to_c() - m).exp();
                    s = s + e;
                }
                let inv = <T as FloatElem>::C::c(1.0) / s;
                for t in 0..n {
                    // Re-derive from x so f16 outputs round once.
                    let e = ((*px.add(i + t * sx)).to_c() - m).exp();
                    *po.add(o + t * so) = T::from_c(e * inv);
                }
            })
        })
    })
}

fn norm<T: FloatElem>(
    x: TRef,
    g: TRef,
    b: Option<TRef>,
    out: TRef,
    eps: f32,
    rms: bool,
) -> Box<dyn Kernel> {
    kernel(move |pool| {
        let axis = x.layout.rank() - 1;
        let (_, n, sx) = lines(&x.layout, axis);
        let sg = g.layout.strides()[0];
        let count = x.layout.numel() / n.max(1);
        let c = |v: f64| <T as FloatElem>::C::c(v);
        let sb = b.map_or(1, |b| b.layout.strides()[0]);
        let rows_dense = T::DTYPE == rlx_ir::DType::F32
            && axis + 1 == x.layout.rank()
            && x.layout.is_contiguous()
            && out.layout.is_contiguous()
            && (sg == 1 || n == 1)
            && (sb == 1 || n == 1);
        par_ranges(pool, count, (1 << 14) / n.max(1) + 1, |r| {
            let (px, po, pg) = (
                x.base::<T>() as *const T,
                out.base::<T>(),
                g.base::<T>() as *const T,
            );
            if rows_dense && n > 0 {
                // Whole dense f32 rows: one call that sums four rows at a time (bit-identical).
                // SAFETY: rows `r` lie inside both buffers (dense from their offsets); the gain
                // has `n` dense values.
                let (xs, gs, ys) = unsafe {
                    let (xo, oo) = (
                        x.layout.offset + r.start * n,
                        out.layout.offset + r.start * n,
                    );
                    (
                        std::slice::from_raw_parts((px as *const f32).add(xo), r.len() * n),
                        std::slice::from_raw_parts((pg as *const f32).add(g.layout.offset), n),
                        std::slice::from_raw_parts_mut((po as *mut f32).add(oo), r.len() * n),
                    )
                };
                match &b {
                    None => crate::math::rms_norm_rows(xs, gs, ys, n, eps),
                    Some(b) => {
                        // SAFETY: the bias has `n` dense values.
                        let bs = unsafe {
                            std::slice::from_raw_parts(
                                (b.base::<f32>() as *const f32).add(b.layout.offset),
                                n,
                            )
                        };
                        crate::math::layer_norm_rows(xs, gs, bs, ys, n, eps)
                    }
                }
                return;
            }
            for_each_line(&x.layout, &out.layout, axis, r, |i, o| unsafe {
                // SAFETY: line offsets lie inside the buffers.
                let xv = |t: usize| (*px.add(i + t * sx)).to_c();
                let (mean, inv) = if rms {
                    // As llama.cpp: squares in the compute type summed in f64, then the mean
                    // and 1/sqrt(mean + eps) in the compute type (bit-identical RMSNorm).
                    let mut v = 0f64;
                    for t in 0..n {
                        v += (xv(t) * xv(t)).f64();
                    }
                    (c(0.0), c(1.0) / Real::sqrt(c(v / n as f64) + c(eps as f64)))
                } else {
                    let mut s = 0f64;
                    for t in 0..n {
                        s += xv(t).f64();
                    }
                    let mean = c(s / n as f64);
                    let mut v = 0f64;
                    for t in 0..n {
                        let d = (xv(t) - mean).f64();
                        v += d * d;
                    }
                    (mean, c(1.0 / (v / n as f64 + eps as f64).sqrt()))
                };
                for t in 0..n {
                    let mut y = (xv(t) - mean) * inv * (*pg.add(g.layout.offset + t * sg)).to_c();
                    if let Some(b) = &b {
                        y = y
                            + (*b
                                .base::<T>()
                                .add(b.layout.offset + t * b.layout.strides()[0]))
                            .to_c();
                    }
                    *po.add(o + t) = T::from_c(y);
                }
            })
        })
    })
}

pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let dt = info.dtype();
    if !dt.is_float() {
        return Err(info.unsupported(format!("dtype {dt}")));
    }
    Ok(match info.node.op.clone() {
        Op::Softmax { axis } => {
            with_float!(dt, T => compute(move |i, o| softmax::<T>(i[0], o, axis)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        Op::LayerNorm { eps } => {
            with_float!(dt, T => compute(move |i, o| norm::<T>(i[0], i[1], Some(i[2]), o, eps, false)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        Op::RmsNorm { eps } => {
            with_float!(dt, T => compute(move |i, o| norm::<T>(i[0], i[1], None, o, eps, true)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        _ => return Err(info.unsupported("not a normalization")),
    })
}
