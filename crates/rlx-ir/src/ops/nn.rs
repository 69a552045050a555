//! Rules of the neural-network ops: LayerNorm, RmsNorm, Attention, Rope.

use super::{require_float, same_dtype, static_dims};
use crate::text::{Attr, Attrs};
use crate::{broadcast_dims, Dim, Error, MaskKind, Result, Shape};

fn norm_param(op: &str, what: &str, x: &Shape, p: &Shape) -> Result<()> {
    same_dtype(op, x, p)?;
    let last = x.dims().last();
    if p.rank() != 1 || p.dims().first() != last {
        return Err(Error::op(
            op,
            format!("{what} must be 1-d matching the last axis of x {x}, got {p}"),
        ));
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
        return Err(Error::op(
            "attention",
            "sliding window of size 0 masks every key",
        ));
    }
    if mask == MaskKind::Custom {
        let m = ins[3];
        same_dtype("attention", q, m)?;
        let target = [
            Dim::Static(qd[0]),
            Dim::Static(qd[1]),
            Dim::Static(qd[2]),
            Dim::Static(kd[2]),
        ];
        let ok = m.rank() <= 4 && broadcast_dims(m.dims(), &target).as_deref() == Some(&target[..]);
        if !ok {
            return Err(Error::op(
                "attention",
                format!(
                    "custom mask {m} does not broadcast to [B, H, Sq, Sk] = {:?}",
                    [qd[0], qd[1], qd[2], kd[2]]
                ),
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
        return Err(Error::op(
            "rope",
            format!("x must be [..., S, D] with even D, got {x}"),
        ));
    }
    let s = xd[xd.len() - 2];
    if !pos.dtype().is_int() || pos.rank() != 1 || pos.dim(0) != Some(s) {
        return Err(Error::op(
            "rope",
            format!("positions must be an integer vector of length S = {s}, got {pos}"),
        ));
    }
    Ok(x.clone())
}

// ---------------------------------------------------------------- decompositions and rules

use super::ad::{differentiable, dims, scalar};
use crate::{Activation, DType, Graph, NodeId};

/// LayerNorm / RmsNorm as reductions and elementwise ops (what autodiff differentiates).
pub(super) fn decompose_norm(g: &mut Graph, ins: &[NodeId], eps: f32, rms: bool) -> Result<NodeId> {
    let x = ins[0];
    let dt = g.shape(x).dtype();
    let r = g.shape(x).rank() - 1;
    let xc = if rms {
        x
    } else {
        let mean = g.try_mean(x, &[r], true)?;
        g.try_sub(x, mean)?
    };
    let sq = g.try_mul(xc, xc)?;
    let var = g.try_mean(sq, &[r], true)?;
    let e = scalar(g, eps as f64, dt)?;
    let ve = g.try_add(var, e)?;
    let inv = g.try_activation(Activation::Rsqrt, ve)?;
    let y = g.try_mul(xc, inv)?;
    let y = g.try_mul(y, ins[1])?;
    if rms {
        Ok(y)
    } else {
        g.try_add(y, ins[2])
    }
}

/// Attention as matmuls, a mask, and softmax; kv heads are repeated for grouped queries.
pub(super) fn decompose_attention(
    g: &mut Graph,
    mask: MaskKind,
    scale: f32,
    ins: &[NodeId],
) -> Result<NodeId> {
    let (q, mut k, mut v) = (ins[0], ins[1], ins[2]);
    let [b, hq, sq, _] = <[usize; 4]>::try_from(dims(g, q))
        .map_err(|_| Error::op("attention", "q must be rank 4"))?;
    let kd = dims(g, k);
    let (hkv, sk) = (kd[1], kd[2]);
    let dt = g.shape(q).dtype();
    if hq != hkv {
        let group = hq / hkv;
        for t in [&mut k, &mut v] {
            let d = dims(g, *t);
            let r = g.try_reshape(*t, &[d[0], d[1], 1, d[2], d[3]])?;
            let e = g.try_expand(r, &[d[0], d[1], group, d[2], d[3]])?;
            *t = g.try_reshape(e, &[d[0], hq, d[2], d[3]])?;
        }
    }
    let kt = g.try_transpose(k, &[0, 1, 3, 2])?;
    let s = g.try_dot(q, kt)?;
    // A bf16 / f16 attention keeps its scale, mask and softmax in f32 (as the native kernels
    // do); only the two products take the low precision.
    let low = matches!(dt, DType::BF16 | DType::F16);
    let (s, dt) = if low {
        (g.try_cast(s, DType::F32)?, DType::F32)
    } else {
        (s, dt)
    };
    let sc = scalar(g, scale as f64, dt)?;
    let mut s = g.try_mul(s, sc)?;
    let off = sk as isize - sq as isize;
    let allowed = |i: usize, j: usize| -> bool {
        let p = i as isize + off;
        match mask {
            MaskKind::Causal => (j as isize) <= p,
            MaskKind::SlidingWindow(w) => (j as isize) <= p && (j as isize) > p - w as isize,
            MaskKind::None | MaskKind::Custom => true,
        }
    };
    if matches!(mask, MaskKind::Causal | MaskKind::SlidingWindow(_)) {
        let mut data = Vec::with_capacity(sq * sk * dt.size_bytes());
        let mut buf = vec![0u8; dt.size_bytes()];
        for i in 0..sq {
            for j in 0..sk {
                crate::convert::f64_to_bytes(
                    if allowed(i, j) {
                        0.0
                    } else {
                        f64::NEG_INFINITY
                    },
                    dt,
                    &mut buf,
                )?;
                data.extend_from_slice(&buf);
            }
        }
        let m = g.try_constant_bytes(crate::Shape::new(&[sq, sk], dt), data)?;
        s = g.try_add(s, m)?;
    } else if mask == MaskKind::Custom {
        let m = if low {
            g.try_cast(ins[3], DType::F32)?
        } else {
            ins[3]
        };
        s = g.try_add(s, m)?;
    }
    let _ = b;
    let p = g.try_softmax(s, 3)?;
    let p = if low {
        g.try_cast(p, g.shape(v).dtype())?
    } else {
        p
    };
    g.try_dot(p, v)
}

/// Rope is a rotation, linear in `x`: its transpose rotates by the opposite angle.
pub(super) fn vjp_rope(
    g: &mut Graph,
    op: &crate::Op,
    ins: &[NodeId],
    ct: NodeId,
) -> Result<Vec<Option<NodeId>>> {
    if !differentiable(g.shape(ins[0]).dtype()) {
        return Ok(vec![None, None]);
    }
    let neg = g.try_activation(Activation::Neg, ins[1])?;
    Ok(vec![Some(g.try_op(op.clone(), &[ct, neg])?), None])
}

pub(super) fn jvp_rope(
    g: &mut Graph,
    op: &crate::Op,
    ins: &[NodeId],
    t: &[Option<NodeId>],
) -> Result<Option<NodeId>> {
    match t[0] {
        Some(tx) if differentiable(g.shape(ins[0]).dtype()) => {
            Ok(Some(g.try_op(op.clone(), &[tx, ins[1]])?))
        }
        _ => Ok(None),
    }
}

/// Rope as elementwise ops on `cos` / `sin` tables computed from the positions (what vmap
/// batches when the positions themselves are batched).
pub(super) fn decompose_rope(
    g: &mut Graph,
    theta: f32,
    interleaved: bool,
    ins: &[NodeId],
) -> Result<NodeId> {
    let (x, pos) = (ins[0], ins[1]);
    let xd = dims(g, x);
    let dt = g.shape(x).dtype();
    let (r, s, d) = (xd.len(), xd[xd.len() - 2], xd[xd.len() - 1]);
    let half = d / 2;
    let mut freq = Vec::new();
    let mut buf = vec![0u8; dt.size_bytes()];
    for k in 0..half {
        crate::convert::f64_to_bytes(
            (theta as f64).powf(-2.0 * k as f64 / d as f64),
            dt,
            &mut buf,
        )?;
        freq.extend_from_slice(&buf);
    }
    let freq = g.try_constant_bytes(crate::Shape::new(&[half], dt), freq)?;
    let p = g.try_cast(pos, dt)?;
    let p = g.try_reshape(p, &[s, 1])?;
    let ang = g.try_mul(p, freq)?; // [S, half]
    let (cos, sin) = (
        g.try_activation(Activation::Cos, ang)?,
        g.try_activation(Activation::Sin, ang)?,
    );
    let rotate = |g: &mut Graph,
                  a: NodeId,
                  b: NodeId,
                  cos: NodeId,
                  sin: NodeId|
     -> Result<(NodeId, NodeId)> {
        let (ac, bs) = (g.try_mul(a, cos)?, g.try_mul(b, sin)?);
        let (as_, bc) = (g.try_mul(a, sin)?, g.try_mul(b, cos)?);
        Ok((g.try_sub(ac, bs)?, g.try_add(as_, bc)?))
    };
    if interleaved {
        let mut pd = xd.clone();
        pd.pop();
        pd.push(half);
        pd.push(2);
        let xp = g.try_reshape(x, &pd)?;
        let (a, b) = (g.try_narrow(xp, r, 0, 1)?, g.try_narrow(xp, r, 1, 1)?);
        let (c3, s3) = (
            g.try_reshape(cos, &[s, half, 1])?,
            g.try_reshape(sin, &[s, half, 1])?,
        );
        let (o1, o2) = rotate(g, a, b, c3, s3)?;
        let o = g.try_concat(&[o1, o2], r)?;
        g.try_reshape(o, &xd)
    } else {
        let (a, b) = (
            g.try_narrow(x, r - 1, 0, half)?,
            g.try_narrow(x, r - 1, half, half)?,
        );
        let (o1, o2) = rotate(g, a, b, cos, sin)?;
        g.try_concat(&[o1, o2], r - 1)
    }
}

// ---------------------------------------------------------------- reference evaluation

use crate::eval::{reduce_groups, Tensor};

/// Reference LayerNorm / RmsNorm over the last axis, in f64.
pub(super) fn eval_norm(ins: &[&Tensor], out: &Shape, eps: f32, rms: bool) -> Result<Tensor> {
    let x = ins[0];
    let v = x.f64s();
    let gamma = ins[1].f64s();
    let beta = if rms {
        vec![0.0; gamma.len()]
    } else {
        ins[2].f64s()
    };
    let mut o = vec![0.0; v.len()];
    for g in reduce_groups(x.dims(), &[x.dims().len() - 1]) {
        let n = g.len() as f64;
        let mean = if rms {
            0.0
        } else {
            g.iter().map(|&i| v[i]).sum::<f64>() / n
        };
        let var = g
            .iter()
            .map(|&i| (v[i] - mean) * (v[i] - mean))
            .sum::<f64>()
            / n;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for (j, &i) in g.iter().enumerate() {
            o[i] = (v[i] - mean) * inv * gamma[j] + beta[j];
        }
    }
    Ok(Tensor::from_f64(x.dims(), out.dtype(), o))
}

/// Cost of the norms (about eight operations per element), attention (two products of
/// `Sq x Sk` scores plus a softmax over them) and RoPE (six per element).
pub(super) fn cost(op: &crate::Op, ins: &[&Shape], out: &Shape) -> super::Cost {
    let base = super::Cost::streaming(ins, out, 0);
    let d = |s: &Shape, i: usize| s.dims().get(i).and_then(|d| d.as_static()).unwrap_or(0) as u64;
    match op {
        crate::Op::Attention { .. } => {
            let (b, h, sq, dk) = (d(ins[0], 0), d(ins[0], 1), d(ins[0], 2), d(ins[0], 3));
            let (sk, dv) = (d(ins[1], 2), d(ins[2], 3));
            base.with_flops(b * h * sq * sk * (2 * dk + 2 * dv + 5))
        }
        crate::Op::Rope { .. } => base.with_flops(6 * super::numel(out)),
        crate::Op::LayerNorm { .. } | crate::Op::RmsNorm { .. } => {
            base.with_flops(8 * super::numel(out))
        }
        other => {
            debug_assert!(false, "{} is not a norm, attention or rope", other.name());
            base
        }
    }
}

/// Text-form attributes of the norms, attention and rope.
pub fn attrs(op: &crate::Op) -> Vec<(&'static str, Attr)> {
    use crate::Op;
    match op {
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => vec![("eps", (*eps).into())],
        Op::Attention { mask, scale } => {
            let m = match mask {
                MaskKind::None => Attr::word("none"),
                MaskKind::Causal => Attr::word("causal"),
                MaskKind::SlidingWindow(w) => {
                    Attr::Tagged("sliding_window".into(), Box::new((*w).into()))
                }
                MaskKind::Custom => Attr::word("custom"),
            };
            vec![("mask", m), ("scale", (*scale).into())]
        }
        Op::Rope { theta, interleaved } => vec![
            ("theta", (*theta).into()),
            ("interleaved", (*interleaved).into()),
        ],
        _ => Vec::new(),
    }
}

/// A norm, attention or rope of `kind` from its text-form attributes.
pub fn from_attrs(kind: crate::OpKind, a: &mut Attrs) -> Result<crate::Op> {
    use crate::{Op, OpKind as K};
    Ok(match kind {
        K::LayerNorm => Op::LayerNorm { eps: a.f32("eps")? },
        K::RmsNorm => Op::RmsNorm { eps: a.f32("eps")? },
        K::Attention => {
            let mask = match a.take("mask")? {
                Attr::Word(w) if w == "none" => MaskKind::None,
                Attr::Word(w) if w == "causal" => MaskKind::Causal,
                Attr::Word(w) if w == "custom" => MaskKind::Custom,
                Attr::Tagged(w, n) if w == "sliding_window" => match *n {
                    Attr::Int(n) => MaskKind::SlidingWindow(n as usize),
                    _ => return Err(Error::op("attention", "sliding_window(n) takes an integer")),
                },
                _ => {
                    return Err(Error::op(
                        "attention",
                        "attribute `mask` must be none, causal, custom or sliding_window(n)",
                    ))
                }
            };
            Op::Attention {
                mask,
                scale: a.f32("scale")?,
            }
        }
        K::Rope => Op::Rope {
            theta: a.f32("theta")?,
            interleaved: a.bool("interleaved")?,
        },
        _ => return Err(Error::op(kind.name(), "is not a norm, attention or rope")),
    })
}

// Batching.

/// Whether the batching rule covers the operands flagged `batched`: norms and rope only with
/// shared scales and positions (otherwise vmap batches their decompositions).
pub(super) fn batchable(op: &crate::Op, batched: &[bool]) -> bool {
    match op {
        crate::Op::LayerNorm { .. } | crate::Op::RmsNorm { .. } => !batched[1..].iter().any(|&b| b),
        crate::Op::Rope { .. } => !batched[1],
        crate::Op::Attention { .. } => true,
        // Not of this family: no rule here (vmap batches a decomposition or names the op).
        _ => false,
    }
}

/// Batching rule: norms and rope work on trailing axes, so the batch is one more leading axis;
/// attention merges it with the batch of `[b, h, t, d]` operands (a custom mask broadcast to
/// every example first).
pub(super) fn batch(
    g: &mut Graph,
    op: &crate::Op,
    b: &super::batch::Batched,
) -> Result<(NodeId, Option<usize>)> {
    use crate::Op;
    let y = match op {
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Rope { .. } => {
            let mut args = vec![b.front(g, 0)?];
            args.extend_from_slice(&b.ins[1..]);
            g.try_op(op.clone(), &args)?
        }
        Op::Attention { mask, .. } => {
            let q = b.front(g, 0)?;
            let k = b.front(g, 1)?;
            let v = b.front(g, 2)?;
            let (qd, kd, vd) = (dims(g, q), dims(g, k), dims(g, v));
            let merge = |g: &mut Graph, x: NodeId, d: &[usize]| {
                g.try_reshape(x, &[d[0] * d[1], d[2], d[3], d[4]])
            };
            let mut args = vec![merge(g, q, &qd)?, merge(g, k, &kd)?, merge(g, v, &vd)?];
            if *mask == MaskKind::Custom {
                let m = b.front(g, 3)?;
                let m = super::batch::align(g, m, 4)?;
                let full = [b.size, qd[1], qd[2], qd[3], kd[3]];
                let m = g.try_expand(m, &full)?;
                args.push(g.try_reshape(m, &[b.size * qd[1], qd[2], qd[3], kd[3]])?);
            }
            let y = g.try_op(op.clone(), &args)?;
            g.try_reshape(y, &[b.size, qd[1], qd[2], qd[3], vd[4]])?
        }
        other => return Err(Error::op(other.name(), "is not an op of this family")),
    };
    Ok((y, Some(0)))
}
