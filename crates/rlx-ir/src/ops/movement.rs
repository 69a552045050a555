//! Rules of data-movement ops: Reshape, Transpose, Narrow, Concat, Expand.

use super::{check_axis, dims_of, static_dims};
use crate::{Dim, Error, Result, Shape};

pub(super) fn reshape(target: &[usize], x: &Shape) -> Result<Shape> {
    let d = static_dims("reshape", "operand", x)?;
    let count = |v: &[usize]| v.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n));
    let (Some(a), Some(b)) = (count(&d), count(target)) else {
        return Err(Error::op("reshape", format!("cannot reshape {x} to {target:?}: the element count overflows usize")));
    };
    if a != b {
        return Err(Error::op(
            "reshape",
            format!("cannot reshape {x} ({a} elements) to {target:?} ({b} elements)"),
        ));
    }
    Ok(Shape::with_dims(dims_of(target), x.dtype()))
}

pub(super) fn transpose(perm: &[usize], x: &Shape) -> Result<Shape> {
    let mut seen = vec![false; x.rank()];
    let valid = perm.len() == x.rank() && perm.iter().all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
    if !valid {
        return Err(Error::op("transpose", format!("{perm:?} is not a permutation of the axes of {x}")));
    }
    let dims = perm.iter().map(|&p| x.dims()[p].clone()).collect();
    Ok(Shape::with_dims(dims, x.dtype()))
}

pub(super) fn narrow(axis: usize, start: usize, len: usize, x: &Shape) -> Result<Shape> {
    check_axis("narrow", axis, x)?;
    let n = x.dim(axis).ok_or_else(|| Error::op("narrow", format!("axis {axis} of {x} is symbolic")))?;
    if start.checked_add(len).is_none_or(|e| e > n) {
        return Err(Error::op(
            "narrow",
            format!("range {start}..{} is out of bounds for axis {axis} of {x} (size {n})", start.saturating_add(len)),
        ));
    }
    let mut dims = x.dims().to_vec();
    dims[axis] = Dim::Static(len);
    Ok(Shape::with_dims(dims, x.dtype()))
}

pub(super) fn concat(axis: usize, ins: &[&Shape]) -> Result<Shape> {
    let first = ins[0];
    check_axis("concat", axis, first)?;
    let mut total = 0usize;
    for (i, s) in ins.iter().enumerate() {
        let compatible = s.rank() == first.rank()
            && s.dtype() == first.dtype()
            && s.dims().iter().zip(first.dims()).enumerate().all(|(j, (a, b))| j == axis || a == b);
        if !compatible {
            return Err(Error::op(
                "concat",
                format!("operand {i} {s} does not match operand 0 {first} outside axis {axis}"),
            ));
        }
        total += s.dim(axis).ok_or_else(|| Error::op("concat", format!("axis {axis} of {s} is symbolic")))?;
    }
    let mut dims = first.dims().to_vec();
    dims[axis] = Dim::Static(total);
    Ok(Shape::with_dims(dims, first.dtype()))
}

pub(super) fn expand(target: &[usize], x: &Shape) -> Result<Shape> {
    let d = static_dims("expand", "operand", x)?;
    let ok = d.len() <= target.len()
        && d.iter().rev().zip(target.iter().rev()).all(|(&a, &b)| a == b || a == 1);
    if !ok {
        return Err(Error::op("expand", format!("cannot broadcast {x} to {target:?}")));
    }
    Ok(Shape::with_dims(dims_of(target), x.dtype()))
}
