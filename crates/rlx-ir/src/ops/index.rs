//! Rules of indexing ops: Gather, ScatterAdd.

use super::{check_axis, same_dtype};
use crate::{Dim, Error, Result, Shape};

fn require_index(op: &str, idx: &Shape) -> Result<()> {
    if !idx.dtype().is_int() {
        return Err(Error::op(op, format!("indices must be integers, got {idx}")));
    }
    Ok(())
}

pub(super) fn gather(axis: usize, ins: &[&Shape]) -> Result<Shape> {
    let (x, idx) = (ins[0], ins[1]);
    check_axis("gather", axis, x)?;
    require_index("gather", idx)?;
    let mut dims: Vec<Dim> = x.dims()[..axis].to_vec();
    dims.extend_from_slice(idx.dims());
    dims.extend_from_slice(&x.dims()[axis + 1..]);
    Ok(Shape::with_dims(dims, x.dtype()))
}

pub(super) fn scatter_add(axis: usize, ins: &[&Shape]) -> Result<Shape> {
    let (x, idx, upd) = (ins[0], ins[1], ins[2]);
    check_axis("scatter_add", axis, x)?;
    require_index("scatter_add", idx)?;
    same_dtype("scatter_add", x, upd)?;
    if idx.rank() != 1 {
        return Err(Error::op("scatter_add", format!("indices must be 1-d, got {idx}")));
    }
    let mut want = x.dims().to_vec();
    want[axis] = idx.dims()[0].clone();
    if upd.dims() != want.as_slice() {
        let w = Shape::with_dims(want, x.dtype());
        return Err(Error::op("scatter_add", format!("updates must have shape {w}, got {upd}")));
    }
    Ok(x.clone())
}
