//! Dequantize: `x = (q - zero_point) * scale` for int8 / uint8 `q`, per tensor or per channel
//! along `axis` (ONNX `DequantizeLinear`). The result dtype is the scale's. All its rules are
//! the methods of [`Dequantize`].

use super::quantize::{affine_op, along, check_params, param_index, Grads, Tangent};
use super::{same_dtype, Cost};
use crate::eval::Tensor;
use crate::{BinaryOp, DType, Error, Graph, NodeId, Result, Shape};

/// `(q - zp)` in the scale's float dtype, shaped like `q`.
fn centred(g: &mut Graph, axis: Option<usize>, ins: &[NodeId]) -> Result<NodeId> {
    let fdt = g.shape(ins[1]).dtype();
    let rank = g.shape(ins[0]).rank();
    let qf = g.try_cast(ins[0], fdt)?;
    let zf = g.try_cast(ins[2], fdt)?;
    let zf = along(g, zf, axis, rank)?;
    g.try_binary(BinaryOp::Sub, qf, zf)
}

/// The axes a per-element value sums over to give the scale's gradient.
fn scale_axes(rank: usize, axis: Option<usize>) -> Vec<usize> {
    (0..rank).filter(|&a| Some(a) != axis).collect()
}

affine_op! {
    /// The op: `(q, scale, zero_point) -> x`.
    Dequantize = "dequantize";
    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let (q, scale, zp) = (ins[0], ins[1], ins[2]);
        if !matches!(q.dtype(), DType::I8 | DType::U8) {
            return Err(Error::op(
                OP.name,
                format!("quantized operand must be i8 or u8, got {q}"),
            ));
        }
        same_dtype(OP.name, q, zp)?;
        check_params(OP.name, self.axis, q, scale, zp)?;
        Ok(q.with_dtype(scale.dtype()))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let (q, s, zp) = (ins[0].f64s(), ins[1].f64s(), ins[2].f64s());
        let v = param_index(ins[0].dims(), self.axis)
            .into_iter()
            .zip(q)
            .map(|(c, q)| (q - zp[c]) * s[c])
            .collect();
        Ok(Tensor::from_f64(ins[0].dims(), out.dtype(), v))
    }

    /// Two operations per element (subtract, multiply).
    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        Cost::streaming(ins, out, 2)
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some(centred(g, self.axis, ins).and_then(|c| {
            let rank = g.shape(ins[0]).rank();
            let s = along(g, ins[1], self.axis, rank)?;
            g.try_mul(c, s)
        }))
    }

    fn has_ad_rules(&self) -> bool {
        true
    }

    /// Only the scale is differentiable (q and the zero point are integers):
    /// `d/ds = sum(ct * (q - zp))` over every axis but `axis`.
    fn vjp(&self, g: &mut Graph, ins: &[NodeId], _: NodeId, ct: NodeId) -> Result<Grads> {
        let c = centred(g, self.axis, ins)?;
        let p = g.try_mul(ct, c)?;
        let axes = scale_axes(g.shape(ins[0]).rank(), self.axis);
        let ds = if axes.is_empty() {
            p
        } else {
            g.try_sum(p, &axes, false)?
        };
        Ok(vec![None, Some(ds), None])
    }

    /// Tangent `(q - zp) * ts` (the scale's tangent along `axis`).
    fn jvp(
        &self,
        g: &mut Graph,
        ins: &[NodeId],
        _: NodeId,
        t: &[Option<NodeId>],
    ) -> Result<Tangent> {
        let Some(ts) = t.get(1).copied().flatten() else {
            return Ok(None);
        };
        let c = centred(g, self.axis, ins)?;
        let rank = g.shape(ins[0]).rank();
        let ts = along(g, ts, self.axis, rank)?;
        Ok(Some(g.try_mul(c, ts)?))
    }
}
