//! Quantize: `q = saturate(round_half_even(x / scale) + zero_point)` to int8 or uint8, per
//! tensor (`axis: None`, scalar scale and zero point) or per channel along `axis` (scale and zero
//! point of length `x.dims[axis]`), as ONNX `QuantizeLinear`. The result dtype is the zero
//! point's. All its rules are here; the helpers are shared with `dequantize.rs` and
//! `fake_quantize.rs`.

use super::{require_float, same_dtype, static_dims, Cost};
use crate::eval::Tensor;
use crate::{Activation, BinaryOp, DType, Error, Graph, NodeId, Op, Result, Shape};

/// The range of a quantized dtype.
pub(super) fn qrange(dt: DType) -> (f64, f64) {
    if dt == DType::U8 {
        (0.0, 255.0)
    } else {
        (-128.0, 127.0)
    }
}

/// Check `scale` (float) and `zero_point` (I8/U8) for data of shape `x` with `axis`.
pub(super) fn check_params(
    op: &str,
    axis: Option<usize>,
    x: &Shape,
    scale: &Shape,
    zp: &Shape,
) -> Result<()> {
    require_float(op, scale)?;
    if !matches!(zp.dtype(), DType::I8 | DType::U8) {
        return Err(Error::op(
            op,
            format!("zero point must be i8 or u8 (it sets the quantized type), got {zp}"),
        ));
    }
    let want: Vec<usize> = match axis {
        None => Vec::new(),
        Some(a) => {
            let d = static_dims(op, "x", x)?;
            let Some(&c) = d.get(a) else {
                return Err(Error::op(op, format!("axis {a} is out of range for {x}")));
            };
            vec![c]
        }
    };
    for (what, s) in [("scale", scale), ("zero point", zp)] {
        if s.static_dims().as_deref() != Some(&want[..]) {
            let kind = if axis.is_some() {
                "per-channel"
            } else {
                "per-tensor"
            };
            return Err(Error::op(
                op,
                format!("{kind} {what} must have dims {want:?}, got {s} (x {x}, axis {axis:?})"),
            ));
        }
    }
    Ok(())
}

pub(super) fn infer(axis: Option<usize>, ins: &[&Shape]) -> Result<Shape> {
    const OP: &str = "quantize";
    let (x, scale, zp) = (ins[0], ins[1], ins[2]);
    require_float(OP, x)?;
    same_dtype(OP, x, scale)?;
    check_params(OP, axis, x, scale, zp)?;
    Ok(x.with_dtype(zp.dtype()))
}

/// `p` (scale or zero point) shaped to broadcast against data of rank `rank` along `axis`.
pub(super) fn along(g: &mut Graph, p: NodeId, axis: Option<usize>, rank: usize) -> Result<NodeId> {
    match axis {
        None => Ok(p),
        Some(a) => {
            let c = g.shape(p).static_dims().unwrap_or_default()[0];
            let mut d = vec![1; rank];
            d[a] = c;
            g.try_reshape(p, &d)
        }
    }
}

/// The quantized value before the cast, in `x`'s float dtype: `clamp(round(x / s) + zp)`.
/// Also returns the unclamped value (for the straight-through gradient's range test).
pub(super) fn quantized_float(
    g: &mut Graph,
    axis: Option<usize>,
    ins: &[NodeId],
) -> Result<(NodeId, NodeId)> {
    let (x, s, zp) = (ins[0], ins[1], ins[2]);
    let fdt = g.shape(x).dtype();
    let rank = g.shape(x).rank();
    let (lo, hi) = qrange(g.shape(zp).dtype());
    let s = along(g, s, axis, rank)?;
    let zf = g.try_cast(zp, fdt)?;
    let zf = along(g, zf, axis, rank)?;
    let y = g.try_binary(BinaryOp::Div, x, s)?;
    let r = g.try_activation(Activation::Round, y)?;
    let q = g.try_add(r, zf)?;
    let (lo, hi) = (g.try_scalar(lo, fdt)?, g.try_scalar(hi, fdt)?);
    let c = g.try_binary(BinaryOp::Max, q, lo)?;
    Ok((g.try_binary(BinaryOp::Min, c, hi)?, q))
}

pub(super) fn decompose(g: &mut Graph, axis: Option<usize>, ins: &[NodeId]) -> Result<NodeId> {
    let (q, _) = quantized_float(g, axis, ins)?;
    let dt = g.shape(ins[2]).dtype();
    g.try_cast(q, dt)
}

/// Per element of data `dims`, the index of its scale / zero point.
pub(super) fn param_index(dims: &[usize], axis: Option<usize>) -> Vec<usize> {
    let n: usize = dims.iter().product();
    match axis {
        None => vec![0; n],
        Some(a) => (0..n).map(|i| crate::eval::unravel(i, dims)[a]).collect(),
    }
}

/// `round_half_even(x / s)` with the quotient rounded to `x`'s dtype first (the op divides in
/// that dtype), plus the zero point; unclamped.
pub(super) fn eval_unclamped(axis: Option<usize>, ins: &[&Tensor]) -> Vec<f64> {
    let (x, s, zp) = (ins[0].f64s(), ins[1].f64s(), ins[2].f64s());
    let dt = ins[0].dtype();
    param_index(ins[0].dims(), axis)
        .into_iter()
        .zip(x)
        .map(|(c, v)| crate::eval::round_float(dt, v / s[c]).round_ties_even() + zp[c])
        .collect()
}

pub(super) fn eval(axis: Option<usize>, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let (lo, hi) = qrange(out.dtype());
    let q: Vec<i64> = eval_unclamped(axis, ins)
        .into_iter()
        .map(|v| v.clamp(lo, hi) as i64)
        .collect();
    Ok(Tensor::from_i64(ins[0].dims(), out.dtype(), q))
}

/// Integer result: no derivative flows through it.
pub(super) fn vjp(ins: &[NodeId]) -> Result<Vec<Option<NodeId>>> {
    Ok(vec![None; ins.len()])
}

/// Batching rule for data batched at the front and shared parameters: the same op with `axis`
/// moved past the batch axis. (Batched parameters make vmap batch the decomposition.)
pub(super) fn batched(op: &Op) -> Result<Op> {
    Ok(match op {
        Op::Quantize { axis } => Op::Quantize {
            axis: axis.map(|a| a + 1),
        },
        Op::Dequantize { axis } => Op::Dequantize {
            axis: axis.map(|a| a + 1),
        },
        Op::FakeQuantize { axis } => Op::FakeQuantize {
            axis: axis.map(|a| a + 1),
        },
        other => return Err(Error::op(other.name(), "is not an affine quantization op")),
    })
}

/// About four operations per element (divide, round, add, clamp).
pub(super) fn cost(ins: &[&Shape], out: &Shape) -> Cost {
    Cost::streaming(ins, out, 4)
}

/// Text-form attributes: the channel axis, or `none` per tensor.
pub fn attrs(axis: Option<usize>) -> Vec<(&'static str, crate::text::Attr)> {
    vec![("axis", axis.into())]
}

/// The channel axis from the text-form attributes.
pub fn from_attrs(a: &mut crate::text::Attrs) -> Result<Option<usize>> {
    a.opt_usize("axis")
}

// Batching (shared by Quantize, Dequantize and FakeQuantize).

/// Whether the batching rule covers the operands flagged `batched`: only shared scales and
/// zero points (batched ones: vmap batches the decomposition).
pub(super) fn batchable(batched: &[bool]) -> bool {
    !batched[1..].iter().any(|&b| b)
}

/// Batching rule: the batch goes in front and a per-channel axis moves by one.
pub(super) fn batch(
    g: &mut Graph,
    op: &Op,
    b: &super::batch::Batched,
) -> Result<(NodeId, Option<usize>)> {
    let x = b.front(g, 0)?;
    Ok((g.try_op(batched(op)?, &[x, b.ins[1], b.ins[2]])?, Some(0)))
}
