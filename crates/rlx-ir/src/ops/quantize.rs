//! Quantize: `q = saturate(round_half_even(x / scale) + zero_point)` to int8 or uint8, per
//! tensor (`axis: None`, scalar scale and zero point) or per channel along `axis` (scale and zero
//! point of length `x.dims[axis]`), as ONNX `QuantizeLinear`. The result dtype is the zero
//! point's. All its rules are here, as the methods of [`Quantize`]; the helpers are shared
//! with `dequantize.rs` and `fake_quantize.rs`.

use super::{require_float, same_dtype, static_dims, Cost};
use crate::eval::Tensor;
use crate::{Activation, BinaryOp, DType, Error, Graph, NodeId, Result, Shape};

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

/// Declares one of the affine int8 ops (an [`OpDef`] holding the channel `axis`) with the rules
/// the three share written once: the struct, its registration `OP` (text form, examples), name,
/// attributes, arity and batching. The op's own rules follow its name.
macro_rules! affine_op {
    ($(#[$doc:meta])* $ty:ident = $name:literal; $($rules:tt)*) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $ty {
            /// Channel axis of per-channel parameters; `None` for per-tensor.
            pub axis: Option<usize>,
        }

        #[doc = concat!("The text form's `", $name, "`.")]
        pub(super) const OP: $crate::ops::OpRegistration = $crate::ops::OpRegistration {
            name: $name,
            from_attrs: |a| Ok($crate::ops::DefinedOp::new($ty { axis: a.opt_usize("axis")? })),
            examples: || [None, Some(0), Some(1)].map(|axis| $crate::ops::DefinedOp::new($ty { axis })).to_vec(),
        };

        impl $crate::ops::OpDef for $ty {
            fn name(&self) -> &'static str {
                OP.name
            }

            fn attrs(&self) -> Vec<(&'static str, $crate::text::Attr)> {
                vec![("axis", self.axis.into())]
            }

            fn arity(&self) -> (usize, usize) {
                (3, 3)
            }

            /// Only shared scales and zero points (batched ones: vmap batches the
            /// decomposition).
            fn batchable(&self, batched: &[bool]) -> bool {
                !batched[1..].iter().any(|&b| b)
            }

            /// The batch goes in front and a per-channel axis moves by one.
            fn batch(&self, g: &mut $crate::Graph, b: &$crate::ops::Batched) -> $crate::Result<($crate::NodeId, Option<usize>)> {
                let x = b.front(g, 0)?;
                let op = $crate::Op::defined($ty { axis: self.axis.map(|a| a + 1) });
                Ok((g.try_op(op, &[x, b.ins[1], b.ins[2]])?, Some(0)))
            }

            $($rules)*
        }
    };
}
pub(super) use affine_op;

affine_op! {
    /// The op: `(x, scale, zero_point) -> q`.
    Quantize = "quantize";
    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let (x, scale, zp) = (ins[0], ins[1], ins[2]);
        require_float(OP.name, x)?;
        same_dtype(OP.name, x, scale)?;
        check_params(OP.name, self.axis, x, scale, zp)?;
        Ok(x.with_dtype(zp.dtype()))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let (lo, hi) = qrange(out.dtype());
        let q: Vec<i64> = eval_unclamped(self.axis, ins)
            .into_iter()
            .map(|v| v.clamp(lo, hi) as i64)
            .collect();
        Ok(Tensor::from_i64(ins[0].dims(), out.dtype(), q))
    }

    /// About four operations per element (divide, round, add, clamp).
    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        Cost::streaming(ins, out, 4)
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some(quantized_float(g, self.axis, ins).and_then(|(q, _)| {
            let dt = g.shape(ins[2]).dtype();
            g.try_cast(q, dt)
        }))
    }

    /// An integer result: no derivative flows through it.
    fn has_ad_rules(&self) -> bool {
        true
    }

    fn vjp(&self, _: &mut Graph, ins: &[NodeId], _: NodeId, _: NodeId) -> Result<Grads> {
        Ok(vec![None; ins.len()])
    }

    fn jvp(&self, _: &mut Graph, _: &[NodeId], _: NodeId, _: &[Option<NodeId>]) -> Result<Tangent> {
        Ok(None)
    }
}

/// Cotangents of the operands.
pub(super) type Grads = Vec<Option<NodeId>>;
/// A result's tangent.
pub(super) type Tangent = Option<NodeId>;
