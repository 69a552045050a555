//! Rules of the neural-network ops: LayerNorm, RmsNorm, Attention, Rope.

use super::{require_float, same_dtype, static_dims};
use crate::{broadcast_dims, Dim, Error, MaskKind, Result, Shape};

fn norm_param(op: &str, what: &str, x: &Shape, p: &Shape) -> Result<()> {
    same_dtype(op, x, p)?;
    let last = x.dims().last();
    if p.rank() != 1 || p.dims().first() != last {
        return Err(Error::op(op, format!("{what} must be 1-d matching the last axis of x {x}, got {p}")));
    }
    Ok(())
}

pub(super) fn layer_norm(ins: &[&Shape]) -> Result<Shape> {
    let x = ins[0];
    require_float("layer_norm", x)?;
    if x.rank() == 0 {
        return Err(Error::op("layer_norm", "operand must have rank >= 1"));
    }
    norm_param("layer_norm", "gamma", x, ins[1])?;
    norm_param("layer_norm", "beta", x, ins[2])?;
    Ok(x.clone())
}

pub(super) fn rms_norm(ins: &[&Shape]) -> Result<Shape> {
    let x = ins[0];
    require_float("rms_norm", x)?;
    if x.rank() == 0 {
        return Err(Error::op("rms_norm", "operand must have rank >= 1"));
    }
    norm_param("rms_norm", "gamma", x, ins[1])?;
    Ok(x.clone())
}

pub(super) fn attention(mask: MaskKind, ins: &[&Shape]) -> Result<Shape> {
    let (q, k, v) = (ins[0], ins[1], ins[2]);
    require_float("attention", q)?;
    same_dtype("attention", q, k)?;
    same_dtype("attention", q, v)?;
    let qd = static_dims("attention", "q", q)?;
    let kd = static_dims("attention", "k", k)?;
    let vd = static_dims("attention", "v", v)?;
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
        return Err(Error::op(
            "attention",
            format!("q, k, v must be [B, H, S, D]; got q {q}, k {k}, v {v}"),
        ));
    }
    let bad = qd[0] != kd[0]
        || kd[0] != vd[0]
        || kd[1] != vd[1]
        || kd[2] != vd[2]
        || qd[3] != kd[3]
        || kd[1] == 0
        || qd[1] % kd[1] != 0;
    if bad {
        return Err(Error::op(
            "attention",
            format!(
                "incompatible q {q}, k {k}, v {v}: need equal batch, k/v heads and length to match, q and k head dims equal, and q heads a multiple of kv heads"
            ),
        ));
    }
    if let MaskKind::SlidingWindow(0) = mask {
        return Err(Error::op("attention", "sliding window of size 0 masks every key"));
    }
    if mask == MaskKind::Custom {
        let m = ins[3];
        same_dtype("attention", q, m)?;
        let target = [Dim::Static(qd[0]), Dim::Static(qd[1]), Dim::Static(qd[2]), Dim::Static(kd[2])];
        let ok = m.rank() <= 4 && broadcast_dims(m.dims(), &target).as_deref() == Some(&target[..]);
        if !ok {
            return Err(Error::op(
                "attention",
                format!("custom mask {m} does not broadcast to [B, H, Sq, Sk] = {:?}", [qd[0], qd[1], qd[2], kd[2]]),
            ));
        }
    }
    Ok(Shape::new(&[qd[0], qd[1], qd[2], vd[3]], q.dtype()))
}

pub(super) fn rope(ins: &[&Shape]) -> Result<Shape> {
    let (x, pos) = (ins[0], ins[1]);
    require_float("rope", x)?;
    let xd = static_dims("rope", "x", x)?;
    if xd.len() < 2 || xd[xd.len() - 1] % 2 != 0 {
        return Err(Error::op("rope", format!("x must be [..., S, D] with even D, got {x}")));
    }
    let s = xd[xd.len() - 2];
    if !pos.dtype().is_int() || pos.rank() != 1 || pos.dim(0) != Some(s) {
        return Err(Error::op("rope", format!("positions must be an integer vector of length S = {s}, got {pos}")));
    }
    Ok(x.clone())
}
