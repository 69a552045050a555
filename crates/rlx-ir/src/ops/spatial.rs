//! Rules of the windowed spatial ops: Conv, Pool (channels first, 1-d or 2-d).

use super::{dims_of, require_float, same_dtype, static_dims};
use crate::text::{Attr, Attrs};
use crate::{ConvAttrs, Error, PoolAttrs, Result, Shape};

/// Output length of one spatial axis, or `None` if the window does not fit.
pub(crate) fn out_len(
    n: usize,
    k: usize,
    stride: usize,
    dil: usize,
    pad: (usize, usize),
) -> Option<usize> {
    let span = dil.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    let padded = n.checked_add(pad.0)?.checked_add(pad.1)?;
    if stride == 0 || padded < span {
        return None;
    }
    Some((padded - span) / stride + 1)
}

fn check_lens(op: &str, nsp: usize, lens: &[(&str, usize)]) -> Result<()> {
    if !(1..=2).contains(&nsp) {
        return Err(Error::op(
            op,
            format!("supports 1 or 2 spatial axes, got {nsp}"),
        ));
    }
    for (what, l) in lens {
        if *l != nsp {
            return Err(Error::op(
                op,
                format!("{what} has {l} entries for {nsp} spatial axes"),
            ));
        }
    }
    Ok(())
}

pub(super) fn conv(a: &ConvAttrs, ins: &[&Shape]) -> Result<Shape> {
    let (x, w) = (ins[0], ins[1]);
    require_float("conv", x)?;
    same_dtype("conv", x, w)?;
    let xd = static_dims("conv", "input", x)?;
    let wd = static_dims("conv", "weight", w)?;
    let nsp = xd.len().saturating_sub(2);
    check_lens(
        "conv",
        nsp,
        &[
            ("stride", a.stride.len()),
            ("padding", a.padding.len()),
            ("dilation", a.dilation.len()),
        ],
    )?;
    let g = a.groups;
    if wd.len() != xd.len()
        || g == 0
        || xd[1] % g != 0
        || wd[0] % g != 0
        || wd[1].checked_mul(g) != Some(xd[1])
    {
        return Err(Error::op(
            "conv",
            format!("weight {w} does not fit input {x} with {g} groups (want [O, C/groups, k...] with O divisible by groups)"),
        ));
    }
    let mut out = vec![xd[0], wd[0]];
    for i in 0..nsp {
        let l = out_len(
            xd[2 + i],
            wd[2 + i],
            a.stride[i],
            a.dilation[i].max(1),
            a.padding[i],
        )
        .ok_or_else(|| {
            Error::op(
                "conv",
                format!(
                    "kernel {:?} does not fit spatial axis {i} of {x} with {a:?}",
                    &wd[2..]
                ),
            )
        })?;
        out.push(l);
    }
    Ok(Shape::with_dims(dims_of(&out), x.dtype()))
}

pub(super) fn pool(a: &PoolAttrs, ins: &[&Shape]) -> Result<Shape> {
    let x = ins[0];
    require_float("pool", x)?;
    let xd = static_dims("pool", "input", x)?;
    let nsp = xd.len().saturating_sub(2);
    check_lens(
        "pool",
        nsp,
        &[
            ("kernel", a.kernel.len()),
            ("stride", a.stride.len()),
            ("padding", a.padding.len()),
        ],
    )?;
    let mut out = vec![xd[0], xd[1]];
    for i in 0..nsp {
        let (lo, hi) = a.padding[i];
        if lo >= a.kernel[i] || hi >= a.kernel[i] {
            return Err(Error::op(
                "pool",
                format!(
                    "padding {:?} must be smaller than the window {}",
                    a.padding[i], a.kernel[i]
                ),
            ));
        }
        let l = out_len(xd[2 + i], a.kernel[i], a.stride[i], 1, a.padding[i]).ok_or_else(|| {
            Error::op(
                "pool",
                format!("window {:?} does not fit spatial axis {i} of {x}", a.kernel),
            )
        })?;
        out.push(l);
    }
    Ok(Shape::with_dims(dims_of(&out), x.dtype()))
}

// ---------------------------------------------------------------- decompositions

use super::ad::dims;
use crate::{DType, Graph, NodeId, PoolKind, ReduceKind};

/// Pad `x` along `axis` with `lo` / `hi` copies of the constant `v`.
fn pad(g: &mut Graph, x: NodeId, axis: usize, lo: usize, hi: usize, v: f64) -> Result<NodeId> {
    if lo == 0 && hi == 0 {
        return Ok(x);
    }
    let xd = dims(g, x);
    let c = g.try_scalar(v, g.shape(x).dtype())?;
    let block = |g: &mut Graph, n: usize| {
        let mut d = xd.clone();
        d[axis] = n;
        g.try_expand(c, &d)
    };
    let mut parts = Vec::new();
    if lo > 0 {
        parts.push(block(g, lo)?);
    }
    parts.push(x);
    if hi > 0 {
        parts.push(block(g, hi)?);
    }
    g.try_concat(&parts, axis)
}

/// Window positions `o*stride + k*dil` as an `[O, K]` i32 index constant.
fn window_index(g: &mut Graph, o: usize, k: usize, stride: usize, dil: usize) -> Result<NodeId> {
    let mut data = Vec::with_capacity(o * k * 4);
    for i in 0..o {
        for j in 0..k {
            data.extend_from_slice(&((i * stride + j * dil) as i32).to_le_bytes());
        }
    }
    g.try_constant_bytes(Shape::new(&[o, k], DType::I32), data)
}

/// Geometry of a windowed op normalized to two spatial axes (1-d gets a unit height).
struct Win {
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
    p: [(usize, usize); 2],
    o: [usize; 2],
}

fn two<T: Copy>(v: &[T], unit: T) -> [T; 2] {
    if v.len() == 1 {
        [unit, v[0]]
    } else {
        [v[0], v[1]]
    }
}

/// `x [N, C, H, W]` → windows `[N, C, OH, KH, OW, KW]`, padding with `pad_value`.
fn patches(g: &mut Graph, x: NodeId, w: &Win, pad_value: f64) -> Result<NodeId> {
    let x = pad(g, x, 2, w.p[0].0, w.p[0].1, pad_value)?;
    let x = pad(g, x, 3, w.p[1].0, w.p[1].1, pad_value)?;
    let ih = window_index(g, w.o[0], w.k[0], w.s[0], w.d[0])?;
    let x = g.try_gather(x, ih, 2)?; // [N, C, OH, KH, W]
    let iw = window_index(g, w.o[1], w.k[1], w.s[1], w.d[1])?;
    g.try_gather(x, iw, 4) // [N, C, OH, KH, OW, KW]
}

/// Bring 1-d operands to 2-d: `[N, C, L]` → `[N, C, 1, L]`.
fn to2d(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    let d = dims(g, x);
    if d.len() == 3 {
        g.try_reshape(x, &[d[0], d[1], 1, d[2]])
    } else {
        Ok(x)
    }
}

/// Convolution as windows gathered from the padded input and one matmul per group.
pub(super) fn decompose_conv(g: &mut Graph, a: &ConvAttrs, ins: &[NodeId]) -> Result<NodeId> {
    let out_shape = conv(a, &[g.shape(ins[0]), g.shape(ins[1])])?;
    let od = out_shape.static_dims().unwrap_or_default();
    let one_d = od.len() == 3;
    let x = to2d(g, ins[0])?;
    let wt = to2d(g, ins[1])?;
    let (xd, wd) = (dims(g, x), dims(g, wt));
    let (n, c, o) = (xd[0], xd[1], wd[0]);
    let win = Win {
        k: [wd[2], wd[3]],
        s: two(&a.stride, 1),
        d: two(&a.dilation, 1),
        p: two(&a.padding, (0, 0)),
        o: if one_d { [1, od[2]] } else { [od[2], od[3]] },
    };
    let p = patches(g, x, &win, 0.0)?;
    let (cg, og) = (c / a.groups, o / a.groups);
    let kk = cg * win.k[0] * win.k[1];
    let rows = n * win.o[0] * win.o[1];
    let mut outs = Vec::new();
    for gi in 0..a.groups {
        let pg = if a.groups == 1 {
            p
        } else {
            g.try_narrow(p, 1, gi * cg, cg)?
        };
        let pt = g.try_transpose(pg, &[0, 2, 4, 1, 3, 5])?; // [N, OH, OW, Cg, KH, KW]
        let pm = g.try_reshape(pt, &[rows, kk])?;
        let wg = if a.groups == 1 {
            wt
        } else {
            g.try_narrow(wt, 0, gi * og, og)?
        };
        let wm = g.try_reshape(wg, &[og, kk])?;
        let wmt = g.try_transpose(wm, &[1, 0])?;
        outs.push(g.try_dot(pm, wmt)?); // [rows, Og]
    }
    let y = if outs.len() == 1 {
        outs[0]
    } else {
        g.try_concat(&outs, 1)?
    };
    let y = g.try_reshape(y, &[n, win.o[0], win.o[1], o])?;
    let y = g.try_transpose(y, &[0, 3, 1, 2])?;
    if one_d {
        g.try_reshape(y, &od)
    } else {
        Ok(y)
    }
}

/// Pooling as gathered windows reduced over the window axes.
pub(super) fn decompose_pool(g: &mut Graph, a: &PoolAttrs, ins: &[NodeId]) -> Result<NodeId> {
    let out_shape = pool(a, &[g.shape(ins[0])])?;
    let od = out_shape.static_dims().unwrap_or_default();
    let one_d = od.len() == 3;
    let x = to2d(g, ins[0])?;
    let xd = dims(g, x);
    let win = Win {
        k: two(&a.kernel, 1),
        s: two(&a.stride, 1),
        d: [1, 1],
        p: two(&a.padding, (0, 0)),
        o: if one_d { [1, od[2]] } else { [od[2], od[3]] },
    };
    let fill = if a.kind == PoolKind::Max {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let p = patches(g, x, &win, fill)?;
    let y = match a.kind {
        PoolKind::Max => g.try_reduce(ReduceKind::Max, p, &[3, 5], false)?,
        PoolKind::Mean => {
            let s = g.try_sum(p, &[3, 5], false)?;
            // Real (non-padding) elements per window.
            let dt = g.shape(x).dtype();
            let real = |o: usize, k: usize, s: usize, lo: usize, n: usize| {
                (0..k)
                    .filter(|&j| (o * s + j).checked_sub(lo).is_some_and(|i| i < n))
                    .count()
            };
            let mut data = Vec::new();
            let mut buf = vec![0u8; dt.size_bytes()];
            for oh in 0..win.o[0] {
                for ow in 0..win.o[1] {
                    let cnt = real(oh, win.k[0], win.s[0], win.p[0].0, xd[2])
                        * real(ow, win.k[1], win.s[1], win.p[1].0, xd[3]);
                    crate::convert::f64_to_bytes(cnt.max(1) as f64, dt, &mut buf)?;
                    data.extend_from_slice(&buf);
                }
            }
            let cnt = g.try_constant_bytes(Shape::new(&[win.o[0], win.o[1]], dt), data)?;
            g.try_div(s, cnt)?
        }
    };
    if one_d {
        g.try_reshape(y, &od)
    } else {
        Ok(y)
    }
}

/// Cost of Conv (`2 * C/groups * prod(kernel)` per result element) and Pool (one operation per
/// window element per result).
pub(super) fn cost(op: &crate::Op, ins: &[&Shape], out: &Shape) -> super::Cost {
    let base = super::Cost::streaming(ins, out, 0);
    let d = |s: &Shape, i: usize| s.dims().get(i).and_then(|d| d.as_static()).unwrap_or(0) as u64;
    match op {
        crate::Op::Conv(_) => {
            let window: u64 = (1..ins[1].rank()).map(|i| d(ins[1], i)).product();
            base.with_flops(2 * super::numel(out) * window)
        }
        crate::Op::Pool(a) => {
            base.with_flops(super::numel(out) * a.kernel.iter().product::<usize>() as u64)
        }
        _ => base,
    }
}

/// Text-form attributes of conv and pool.
pub fn attrs(op: &crate::Op) -> Vec<(&'static str, Attr)> {
    use crate::{Op, PoolKind};
    match op {
        Op::Conv(c) => vec![
            ("stride", c.stride.as_slice().into()),
            ("padding", Attr::pairs(&c.padding)),
            ("dilation", c.dilation.as_slice().into()),
            ("groups", c.groups.into()),
        ],
        Op::Pool(p) => vec![
            (
                "kind",
                Attr::word(if p.kind == PoolKind::Max {
                    "max"
                } else {
                    "mean"
                }),
            ),
            ("kernel", p.kernel.as_slice().into()),
            ("stride", p.stride.as_slice().into()),
            ("padding", Attr::pairs(&p.padding)),
        ],
        _ => Vec::new(),
    }
}

/// A conv or pool from its text-form attributes.
pub fn from_attrs(kind: crate::OpKind, a: &mut Attrs) -> Result<crate::Op> {
    use crate::{Op, OpKind as K, PoolKind};
    Ok(match kind {
        K::Conv => Op::Conv(ConvAttrs {
            stride: a.usizes("stride")?,
            padding: a.pairs("padding")?,
            dilation: a.usizes("dilation")?,
            groups: a.usize("groups")?,
        }),
        K::Pool => Op::Pool(PoolAttrs {
            kind: a.word("kind", "max, mean", |w| match w {
                "max" => Some(PoolKind::Max),
                "mean" => Some(PoolKind::Mean),
                _ => None,
            })?,
            kernel: a.usizes("kernel")?,
            stride: a.usizes("stride")?,
            padding: a.pairs("padding")?,
        }),
        _ => return Err(Error::op(kind.name(), "is not a conv or pool")),
    })
}

// Batching.

/// Whether the batching rule covers the operands flagged `batched`: a convolution only with
/// shared weights.
pub(super) fn batchable(op: &crate::Op, batched: &[bool]) -> bool {
    !matches!(op, crate::Op::Conv(_)) || !batched[1]
}

/// Batching rule: the batch merges with the images' batch axis and is split off again.
pub(super) fn batch(
    g: &mut Graph,
    op: &crate::Op,
    b: &super::batch::Batched,
) -> Result<(NodeId, Option<usize>)> {
    let x = b.front(g, 0)?;
    let d = dims(g, x);
    let mut m = vec![d[0] * d[1]];
    m.extend_from_slice(&d[2..]);
    let xm = g.try_reshape(x, &m)?;
    let mut args = vec![xm];
    args.extend_from_slice(&b.ins[1..]);
    let y = g.try_op(op.clone(), &args)?;
    let yd = dims(g, y);
    let mut s = vec![b.size, d[1]];
    s.extend_from_slice(&yd[1..]);
    Ok((g.try_reshape(y, &s)?, Some(0)))
}
