//! Rules of elementwise ops: Binary, Compare, Where, Activation.

use super::{require_float, same_dtype};
use crate::{broadcast_dims, Activation, BinaryOp, DType, Error, Op, Result, Shape};

fn broadcast(op: &str, a: &Shape, b: &Shape) -> Result<Vec<crate::Dim>> {
    broadcast_dims(a.dims(), b.dims()).ok_or_else(|| {
        Error::op(op, format!("shapes do not broadcast: lhs {a} vs rhs {b}"))
    })
}

pub(super) fn binary(b: BinaryOp, ins: &[&Shape]) -> Result<Shape> {
    let name = Op::Binary(b).name();
    same_dtype(name, ins[0], ins[1])?;
    if b == BinaryOp::Pow {
        require_float(name, ins[0])?;
    }
    if ins[0].dtype() == DType::Bool && !matches!(b, BinaryOp::Max | BinaryOp::Min) {
        return Err(Error::op(name, format!("is not defined on bool operands ({})", ins[0])));
    }
    Ok(Shape::with_dims(broadcast(name, ins[0], ins[1])?, ins[0].dtype()))
}

pub(super) fn compare(op: &Op, ins: &[&Shape]) -> Result<Shape> {
    same_dtype(op.name(), ins[0], ins[1])?;
    Ok(Shape::with_dims(broadcast(op.name(), ins[0], ins[1])?, DType::Bool))
}

pub(super) fn select(ins: &[&Shape]) -> Result<Shape> {
    if ins[0].dtype() != DType::Bool {
        return Err(Error::op("where", format!("condition must be bool, got {}", ins[0])));
    }
    same_dtype("where", ins[1], ins[2])?;
    let d = broadcast("where", ins[0], ins[1])?;
    let d = broadcast("where", &Shape::with_dims(d, DType::Bool), ins[2])?;
    Ok(Shape::with_dims(d, ins[1].dtype()))
}

pub(super) fn activation(a: Activation, x: &Shape) -> Result<Shape> {
    let name = Op::Activation(a).name();
    let ok = x.dtype().is_float() || (a.allows_int() && x.dtype().is_int());
    if !ok {
        return Err(Error::op(name, format!("is not defined for operand {x}")));
    }
    Ok(x.clone())
}
