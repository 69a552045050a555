//! FakeQuantize: `(clamp(round_half_even(x / s) + zp) - zp) * s` in `x`'s float dtype, the
//! quantization error of Quantize then Dequantize without leaving floats (quantization-aware
//! training). Its gradient is the straight-through estimator: the cotangent passes where the
//! quantized value was not clamped and is zero where it was; scale and zero point get none.
//! All its rules are the methods of [`FakeQuantize`].

use super::quantize::{
    affine_op, along, check_params, eval_unclamped, param_index, qrange, quantized_float, Grads,
    Tangent,
};
use super::{require_float, same_dtype, Cost};
use crate::eval::Tensor;
use crate::{BinaryOp, CmpOp, Graph, NodeId, Result, Shape};

/// Where the quantized value lies inside the quantized range: 1 there, 0 where it was clamped.
fn pass_mask(g: &mut Graph, axis: Option<usize>, ins: &[NodeId]) -> Result<NodeId> {
    let (_, q) = quantized_float(g, axis, ins)?;
    let fdt = g.shape(ins[0]).dtype();
    let (lo, hi) = qrange(g.shape(ins[2]).dtype());
    let (lo, hi) = (g.try_scalar(lo, fdt)?, g.try_scalar(hi, fdt)?);
    let above = g.try_compare(CmpOp::Ge, q, lo)?;
    let below = g.try_compare(CmpOp::Le, q, hi)?;
    let (above, below) = (g.try_cast(above, fdt)?, g.try_cast(below, fdt)?);
    g.try_mul(above, below)
}

affine_op! {
    /// The op: `(x, scale, zero_point) -> x'` (same shape and dtype as `x`).
    FakeQuantize = "fake_quantize";
    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let (x, scale, zp) = (ins[0], ins[1], ins[2]);
        require_float(OP.name, x)?;
        same_dtype(OP.name, x, scale)?;
        check_params(OP.name, self.axis, x, scale, zp)?;
        Ok(x.clone())
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let (lo, hi) = qrange(ins[2].dtype());
        let (s, zp) = (ins[1].f64s(), ins[2].f64s());
        let idx = param_index(ins[0].dims(), self.axis);
        let v = eval_unclamped(self.axis, ins)
            .into_iter()
            .zip(idx)
            .map(|(q, c)| (q.clamp(lo, hi) - zp[c]) * s[c])
            .collect();
        Ok(Tensor::from_f64(ins[0].dims(), out.dtype(), v))
    }

    /// About six operations per element (divide, round, add, clamp, subtract, multiply).
    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        Cost::streaming(ins, out, 6)
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        let axis = self.axis;
        Some(quantized_float(g, axis, ins).and_then(|(q, _)| {
            let fdt = g.shape(ins[0]).dtype();
            let rank = g.shape(ins[0]).rank();
            let zf = g.try_cast(ins[2], fdt)?;
            let zf = along(g, zf, axis, rank)?;
            let s = along(g, ins[1], axis, rank)?;
            let c = g.try_binary(BinaryOp::Sub, q, zf)?;
            g.try_mul(c, s)
        }))
    }

    fn has_ad_rules(&self) -> bool {
        true
    }

    /// Straight-through: `ct` where not clamped, zero where clamped; no gradient for scale or
    /// zero point.
    fn vjp(&self, g: &mut Graph, ins: &[NodeId], _: NodeId, ct: NodeId) -> Result<Grads> {
        let m = pass_mask(g, self.axis, ins)?;
        Ok(vec![Some(g.try_mul(ct, m)?), None, None])
    }

    /// Straight-through tangent: `tx` where not clamped.
    fn jvp(
        &self,
        g: &mut Graph,
        ins: &[NodeId],
        _: NodeId,
        t: &[Option<NodeId>],
    ) -> Result<Tangent> {
        let Some(tx) = t[0] else { return Ok(None) };
        let m = pass_mask(g, self.axis, ins)?;
        Ok(Some(g.try_mul(tx, m)?))
    }
}
