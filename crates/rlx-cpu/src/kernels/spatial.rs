//! Direct 1-d / 2-d convolution and pooling, channels first. 1-d is handled as 2-d with a unit
//! height so one loop nest serves both.

use super::{compute, kernel, Kernel, Lowered, NodeInfo, TRef};
use crate::elem::{FloatElem, Real};
use crate::layout::Layout;
use crate::with_float;
use rlx_ir::{ConvAttrs, Op, PoolAttrs, PoolKind, Result};

/// Spatial geometry normalized to two axes.
#[derive(Clone, Copy)]
struct Geo {
    ih: usize,
    iw: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
    dh: usize,
    dw: usize,
}

/// Offsets of a rank-3 or rank-4 layout as `(n, c, y, x)`.
fn off(l: &Layout, n: usize, c: usize, y: usize, x: usize) -> usize {
    let s = l.strides();
    if l.rank() == 3 {
        l.offset + n * s[0] + c * s[1] + x * s[2]
    } else {
        l.offset + n * s[0] + c * s[1] + y * s[2] + x * s[3]
    }
}

fn geo(
    x: &Layout,
    out: &Layout,
    k: &[usize],
    stride: &[usize],
    pad: &[(usize, usize)],
    dil: &[usize],
) -> Geo {
    let two = |v: &[usize], one: usize| {
        if v.len() == 1 {
            (one, v[0])
        } else {
            (v[0], v[1])
        }
    };
    let (ih, iw) = two(&x.dims()[2..], 1);
    let (oh, ow) = two(&out.dims()[2..], 1);
    let (kh, kw) = two(k, 1);
    let (sh, sw) = two(stride, 1);
    let (dh, dw) = two(dil, 1);
    let p: Vec<usize> = pad.iter().map(|p| p.0).collect();
    let (ph, pw) = two(&p, 0);
    Geo {
        ih,
        iw,
        oh,
        ow,
        kh,
        kw,
        sh,
        sw,
        ph,
        pw,
        dh,
        dw,
    }
}

fn conv<T: FloatElem>(x: TRef, w: TRef, out: TRef, a: ConvAttrs) -> Box<dyn Kernel> {
    let g = geo(
        &x.layout,
        &out.layout,
        &w.layout.dims()[2..],
        &a.stride,
        &a.padding,
        &a.dilation,
    );
    let (n, o_ch) = (out.layout.dims()[0], out.layout.dims()[1]);
    let cpg = w.layout.dims()[1];
    let opg = o_ch / a.groups;
    kernel(move |pool| {
        pool.run(n * o_ch, &|t, _| {
            let (px, pw, po) = (
                x.base::<T>() as *const T,
                w.base::<T>() as *const T,
                out.base::<T>(),
            );
            let (b, oc) = (t / o_ch, t % o_ch);
            let c0 = (oc / opg) * cpg;
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let mut s = <T as FloatElem>::C::c(0.0);
                    for ci in 0..cpg {
                        for ky in 0..g.kh {
                            let iy = (oy * g.sh + ky * g.dh) as isize - g.ph as isize;
                            if iy < 0 || iy >= g.ih as isize {
                                continue;
                            }
                            for kx in 0..g.kw {
                                let ix = (ox * g.sw + kx * g.dw) as isize - g.pw as isize;
                                if ix < 0 || ix >= g.iw as isize {
                                    continue;
                                }
                                // SAFETY: indices are checked against the input extent.
                                unsafe {
                                    let xv = *px.add(off(
                                        &x.layout,
                                        b,
                                        c0 + ci,
                                        iy as usize,
                                        ix as usize,
                                    ));
                                    let wv = *pw.add(off(&w.layout, oc, ci, ky, kx));
                                    s = s + xv.to_c() * wv.to_c();
                                }
                            }
                        }
                    }
                    unsafe { *po.add(off(&out.layout, b, oc, oy, ox)) = T::from_c(s) };
                }
            }
        });
    })
}

fn pool_k<T: FloatElem>(x: TRef, out: TRef, a: PoolAttrs) -> Box<dyn Kernel> {
    let ones = vec![1; a.kernel.len()];
    let g = geo(
        &x.layout,
        &out.layout,
        &a.kernel,
        &a.stride,
        &a.padding,
        &ones,
    );
    let (n, ch) = (out.layout.dims()[0], out.layout.dims()[1]);
    kernel(move |pool| {
        pool.run(n * ch, &|t, _| {
            let (px, po) = (x.base::<T>() as *const T, out.base::<T>());
            let (b, c) = (t / ch, t % ch);
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let mut best = T::lowest();
                    let mut sum = 0f64;
                    let mut count = 0usize;
                    for ky in 0..g.kh {
                        let iy = (oy * g.sh + ky) as isize - g.ph as isize;
                        if iy < 0 || iy >= g.ih as isize {
                            continue;
                        }
                        for kx in 0..g.kw {
                            let ix = (ox * g.sw + kx) as isize - g.pw as isize;
                            if ix < 0 || ix >= g.iw as isize {
                                continue;
                            }
                            // SAFETY: indices are checked against the input extent.
                            let v =
                                unsafe { *px.add(off(&x.layout, b, c, iy as usize, ix as usize)) };
                            best = best.max_of(v);
                            sum += v.to_c().f64();
                            count += 1;
                        }
                    }
                    let r = match a.kind {
                        PoolKind::Max => best,
                        PoolKind::Mean => {
                            T::from_c(<T as FloatElem>::C::c(sum / count.max(1) as f64))
                        }
                    };
                    unsafe { *po.add(off(&out.layout, b, c, oy, ox)) = r };
                }
            }
        });
    })
}

pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let dt = info.dtype();
    if !dt.is_float() {
        return Err(info.unsupported(format!("dtype {dt}")));
    }
    Ok(match info.node.op.clone() {
        Op::Conv(a) => {
            with_float!(dt, T => compute(move |i, o| conv::<T>(i[0], i[1], o, a)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        Op::Pool(a) => {
            with_float!(dt, T => compute(move |i, o| pool_k::<T>(i[0], o, a)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        _ => return Err(info.unsupported("not a spatial op")),
    })
}
