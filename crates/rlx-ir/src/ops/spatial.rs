//! Rules of the windowed spatial ops: Conv, Pool (channels first, 1-d or 2-d).

use super::{dims_of, require_float, same_dtype, static_dims};
use crate::{ConvAttrs, Error, PoolAttrs, Result, Shape};

/// Output length of one spatial axis, or `None` if the window does not fit.
pub(crate) fn out_len(n: usize, k: usize, stride: usize, dil: usize, pad: (usize, usize)) -> Option<usize> {
    let span = dil.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    let padded = n.checked_add(pad.0)?.checked_add(pad.1)?;
    if stride == 0 || padded < span {
        return None;
    }
    Some((padded - span) / stride + 1)
}

fn check_lens(op: &str, nsp: usize, lens: &[(&str, usize)]) -> Result<()> {
    if !(1..=2).contains(&nsp) {
        return Err(Error::op(op, format!("supports 1 or 2 spatial axes, got {nsp}")));
    }
    for (what, l) in lens {
        if *l != nsp {
            return Err(Error::op(op, format!("{what} has {l} entries for {nsp} spatial axes")));
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
    check_lens("conv", nsp, &[("stride", a.stride.len()), ("padding", a.padding.len()), ("dilation", a.dilation.len())])?;
    let g = a.groups;
    if wd.len() != xd.len() || g == 0 || xd[1] % g != 0 || wd[0] % g != 0 || wd[1].checked_mul(g) != Some(xd[1]) {
        return Err(Error::op(
            "conv",
            format!("weight {w} does not fit input {x} with {g} groups (want [O, C/groups, k...] with O divisible by groups)"),
        ));
    }
    let mut out = vec![xd[0], wd[0]];
    for i in 0..nsp {
        let l = out_len(xd[2 + i], wd[2 + i], a.stride[i], a.dilation[i].max(1), a.padding[i]).ok_or_else(|| {
            Error::op("conv", format!("kernel {:?} does not fit spatial axis {i} of {x} with {a:?}", &wd[2..]))
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
    check_lens("pool", nsp, &[("kernel", a.kernel.len()), ("stride", a.stride.len()), ("padding", a.padding.len())])?;
    let mut out = vec![xd[0], xd[1]];
    for i in 0..nsp {
        let (lo, hi) = a.padding[i];
        if lo >= a.kernel[i] || hi >= a.kernel[i] {
            return Err(Error::op("pool", format!("padding {:?} must be smaller than the window {}", a.padding[i], a.kernel[i])));
        }
        let l = out_len(xd[2 + i], a.kernel[i], a.stride[i], 1, a.padding[i]).ok_or_else(|| {
            Error::op("pool", format!("window {:?} does not fit spatial axis {i} of {x}", a.kernel))
        })?;
        out.push(l);
    }
    Ok(Shape::with_dims(dims_of(&out), x.dtype()))
}
