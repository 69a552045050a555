//! Batching rules (`vmap`): for each op, how to compute it on operands that carry an extra batch
//! axis. Most rules move the batch axis to the front and shift the op's axes by one; ops whose
//! batched form needs more than that (batched weights of a convolution, batched norm scales,
//! batched rope positions) are handled by batching their decomposition instead.

use super::ad::dims;
use crate::{Error, Graph, MaskKind, NodeId, Op, Result};

/// Move the batch axis `bd` of `x` to the front.
pub(crate) fn to_front(g: &mut Graph, x: NodeId, bd: usize) -> Result<NodeId> {
    if bd == 0 {
        return Ok(x);
    }
    let r = g.shape(x).rank();
    let mut perm = vec![bd];
    perm.extend((0..r).filter(|&i| i != bd));
    g.try_transpose(x, &perm)
}

/// `x` with its batch axis at the front, broadcasting an unbatched `x` to `size` examples.
pub fn materialize(g: &mut Graph, x: NodeId, bd: Option<usize>, size: usize) -> Result<NodeId> {
    match bd {
        Some(b) => to_front(g, x, b),
        None => {
            let d = dims(g, x);
            let mut one = vec![1];
            one.extend_from_slice(&d);
            let r = g.try_reshape(x, &one)?;
            one[0] = size;
            g.try_expand(r, &one)
        }
    }
}

/// A front-batched `x` (`[B, d...]`) padded with unit axes after the batch axis so that its
/// per-example rank becomes `rank` (numpy broadcasting then lines examples up correctly).
fn align(g: &mut Graph, x: NodeId, rank: usize) -> Result<NodeId> {
    let d = dims(g, x);
    if d.len() > rank {
        return Ok(x);
    }
    let mut nd = vec![d[0]];
    nd.extend(std::iter::repeat_n(1, rank - (d.len() - 1)));
    nd.extend_from_slice(&d[1..]);
    g.try_reshape(x, &nd)
}

/// Whether [`batch`] handles `op` when the operands flagged in `batched` carry a batch axis.
/// When it does not, vmap batches the op's decomposition.
pub fn batch_supported(op: &Op, batched: &[bool]) -> bool {
    match op {
        Op::DotGeneral(_)
        | Op::Custom(_)
        | Op::Fused(_)
        | Op::CacheWrite
        | Op::CachedAttention { .. } => false,
        // Weights shared by the batch: the op maps over x's leading axes already.
        Op::DequantMatMul { .. } => !batched[1..].iter().any(|&b| b),
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => !batched[1..].iter().any(|&b| b),
        Op::Conv(_) => !batched[1],
        Op::Rope { .. } => !batched[1],
        // Batched parameters: vmap batches the decomposition.
        Op::Quantize { .. } | Op::Dequantize { .. } | Op::FakeQuantize { .. } => {
            !batched[1..].iter().any(|&b| b)
        }
        Op::Input { .. }
        | Op::Param { .. }
        | Op::Constant { .. }
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Where
        | Op::Activation(_)
        | Op::Cast { .. }
        | Op::MatMul
        | Op::Reduce { .. }
        | Op::Softmax { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::Cumsum { .. }
        | Op::TopK { .. }
        | Op::Attention { .. }
        | Op::Pool(_)
        | Op::DequantizeRows { .. } => true,
    }
}

/// Per-example rank of operand `x` with batch flag `bd`.
fn rank_of(g: &Graph, x: NodeId, bd: Option<usize>) -> usize {
    g.shape(x).rank() - bd.is_some() as usize
}

/// Apply `op` to operands `ins` (of `g`) whose batch axes are `bds`, with `size` examples.
/// Returns the result and its batch axis. Fails with "no batching rule" for the patterns
/// [`batch_supported`] rejects.
pub fn batch(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    bds: &[Option<usize>],
    size: usize,
) -> Result<(NodeId, Option<usize>)> {
    let flags: Vec<bool> = bds.iter().map(Option::is_some).collect();
    if !batch_supported(op, &flags) {
        return Err(Error::op(
            op.name(),
            "no batching rule for this pattern of batched operands",
        ));
    }
    let front =
        |g: &mut Graph, i: usize| -> Result<NodeId> { materialize(g, ins[i], bds[i], size) };
    let y = match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => {
            return Err(Error::op(
                op.name(),
                "leaves are batched by the vmap driver",
            ));
        }
        // Broadcasting ops (matmul broadcasts its batch axes): batched operands get the batch in
        // front and unit axes up to the widest per-example rank; shared ones broadcast as they are.
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::MatMul => {
            let r = (0..ins.len())
                .map(|i| rank_of(g, ins[i], bds[i]))
                .max()
                .unwrap_or(0);
            let mut args = Vec::new();
            for i in 0..ins.len() {
                args.push(match bds[i] {
                    Some(b) => {
                        let f = to_front(g, ins[i], b)?;
                        align(g, f, r)?
                    }
                    None => ins[i],
                });
            }
            g.try_op(op.clone(), &args)?
        }
        Op::Activation(_) | Op::Cast { .. } => return Ok((g.try_op(op.clone(), ins)?, bds[0])),
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => {
            let x = front(g, 0)?;
            let axes: Vec<usize> = axes.iter().map(|a| a + 1).collect();
            g.try_op(
                Op::Reduce {
                    kind: *kind,
                    axes,
                    keepdims: *keepdims,
                },
                &[x],
            )?
        }
        Op::Softmax { axis } => {
            let x = front(g, 0)?;
            g.try_softmax(x, axis + 1)?
        }
        Op::Cumsum { axis } => {
            let x = front(g, 0)?;
            g.try_cumsum(x, axis + 1)?
        }
        Op::TopK { .. } | Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Rope { .. } => {
            // Last-axis ops (and rope over [..., S, D]) see the batch as one more leading axis.
            let mut args = vec![front(g, 0)?];
            args.extend_from_slice(&ins[1..]);
            g.try_op(op.clone(), &args)?
        }
        Op::Reshape { shape } => {
            let x = front(g, 0)?;
            let mut s = vec![size];
            s.extend_from_slice(shape);
            g.try_reshape(x, &s)?
        }
        Op::Transpose { perm } => {
            let x = front(g, 0)?;
            let mut p = vec![0];
            p.extend(perm.iter().map(|a| a + 1));
            g.try_transpose(x, &p)?
        }
        Op::Narrow { axis, start, len } => {
            let x = front(g, 0)?;
            g.try_narrow(x, axis + 1, *start, *len)?
        }
        Op::Expand { shape } => {
            let x = front(g, 0)?;
            let x = align(g, x, shape.len())?;
            let mut s = vec![size];
            s.extend_from_slice(shape);
            g.try_expand(x, &s)?
        }
        Op::Concat { axis } => {
            let args = (0..ins.len())
                .map(|i| front(g, i))
                .collect::<Result<Vec<_>>>()?;
            g.try_concat(&args, axis + 1)?
        }
        Op::Gather { axis } => return gather(g, ins, bds, *axis, size),
        Op::ScatterAdd { axis } => scatter_add(g, ins, bds, *axis, size)?,
        Op::Attention { mask, .. } => {
            let q = front(g, 0)?;
            let k = front(g, 1)?;
            let v = front(g, 2)?;
            let (qd, kd, vd) = (dims(g, q), dims(g, k), dims(g, v));
            let merge = |g: &mut Graph, x: NodeId, d: &[usize]| {
                g.try_reshape(x, &[d[0] * d[1], d[2], d[3], d[4]])
            };
            let mut args = vec![merge(g, q, &qd)?, merge(g, k, &kd)?, merge(g, v, &vd)?];
            if *mask == MaskKind::Custom {
                let m = front(g, 3)?;
                let m = align(g, m, 4)?;
                let full = [size, qd[1], qd[2], qd[3], kd[3]];
                let m = g.try_expand(m, &full)?;
                args.push(g.try_reshape(m, &[size * qd[1], qd[2], qd[3], kd[3]])?);
            }
            let y = g.try_op(op.clone(), &args)?;
            g.try_reshape(y, &[size, qd[1], qd[2], qd[3], vd[4]])?
        }
        Op::Conv(_) | Op::Pool(_) => {
            let x = front(g, 0)?;
            let d = dims(g, x);
            let mut m = vec![d[0] * d[1]];
            m.extend_from_slice(&d[2..]);
            let xm = g.try_reshape(x, &m)?;
            let mut args = vec![xm];
            args.extend_from_slice(&ins[1..]);
            let y = g.try_op(op.clone(), &args)?;
            let yd = dims(g, y);
            let mut s = vec![size, d[1]];
            s.extend_from_slice(&yd[1..]);
            g.try_reshape(y, &s)?
        }
        Op::DequantMatMul { .. } => {
            let x = front(g, 0)?;
            let mut args = vec![x];
            args.extend_from_slice(&ins[1..]);
            g.try_op(op.clone(), &args)?
        }
        Op::Quantize { .. } | Op::Dequantize { .. } | Op::FakeQuantize { .. } => {
            let x = front(g, 0)?;
            g.try_op(super::quantize::batched(op)?, &[x, ins[1], ins[2]])?
        }
        // Packed bytes are the last axis: the batch axis moves to the front, out of the rows.
        Op::DequantizeRows { .. } => {
            let x = front(g, 0)?;
            g.try_op(op.clone(), &[x])?
        }
        Op::DotGeneral(_)
        | Op::Custom(_)
        | Op::Fused(_)
        | Op::CacheWrite
        | Op::CachedAttention { .. } => {
            return Err(Error::op(
                op.name(),
                "has no batching rule; vmap batches its decomposition",
            ));
        }
    };
    Ok((y, Some(0)))
}

/// `iota(size) * n` shaped `[size, 1, ..., 1]` (rank `rank`) in the index dtype of `like`.
fn offsets(g: &mut Graph, size: usize, n: usize, rank: usize, like: NodeId) -> Result<NodeId> {
    let dt = g.shape(like).dtype();
    let mut data = Vec::new();
    let mut buf = vec![0u8; dt.size_bytes()];
    for b in 0..size {
        crate::convert::f64_to_bytes((b * n) as f64, dt, &mut buf)?;
        data.extend_from_slice(&buf);
    }
    let mut d = vec![size];
    d.extend(std::iter::repeat_n(1, rank.saturating_sub(1)));
    g.try_constant_bytes(crate::Shape::new(&d, dt), data)
}

/// `x [B, ...]` with axis `axis + 1` moved to position 1 and merged with the batch axis.
fn fold_axis(g: &mut Graph, x: NodeId, axis: usize) -> Result<(NodeId, Vec<usize>)> {
    let r = g.shape(x).rank();
    let mut perm = vec![0, axis + 1];
    perm.extend((1..r).filter(|&i| i != axis + 1));
    let t = g.try_transpose(x, &perm)?;
    let td = dims(g, t);
    let mut m = vec![td[0] * td[1]];
    m.extend_from_slice(&td[2..]);
    Ok((g.try_reshape(t, &m)?, perm))
}

fn gather(
    g: &mut Graph,
    ins: &[NodeId],
    bds: &[Option<usize>],
    axis: usize,
    size: usize,
) -> Result<(NodeId, Option<usize>)> {
    match (bds[0], bds[1]) {
        (Some(b), None) => {
            let x = to_front(g, ins[0], b)?;
            Ok((g.try_gather(x, ins[1], axis + 1)?, Some(0)))
        }
        (None, Some(b)) => {
            let idx = to_front(g, ins[1], b)?;
            Ok((g.try_gather(ins[0], idx, axis)?, Some(axis)))
        }
        _ => {
            // Per-example indices into per-example data: offset example b's indices by b * N
            // into the batch-merged data and gather once.
            let x = materialize(g, ins[0], bds[0], size)?;
            let idx = materialize(g, ins[1], bds[1], size)?;
            let xd = dims(g, x);
            let n = xd[axis + 1];
            let (xm, _) = fold_axis(g, x, axis)?;
            let ir = g.shape(idx).rank();
            let off = offsets(g, size, n, ir, idx)?;
            let idx = g.try_add(idx, off)?;
            let y = g.try_gather(xm, idx, 0)?; // [B, idx..., pre..., post...]
            let (k, pre) = (ir - 1, axis);
            let yr = g.shape(y).rank();
            // Reorder to [B, pre..., idx..., post...].
            let mut perm = vec![0];
            perm.extend(1 + k..1 + k + pre);
            perm.extend(1..1 + k);
            perm.extend(1 + k + pre..yr);
            Ok((g.try_transpose(y, &perm)?, Some(0)))
        }
    }
}

fn scatter_add(
    g: &mut Graph,
    ins: &[NodeId],
    bds: &[Option<usize>],
    axis: usize,
    size: usize,
) -> Result<NodeId> {
    let x = materialize(g, ins[0], bds[0], size)?;
    let u = materialize(g, ins[2], bds[2], size)?;
    match bds[1] {
        None => g.try_scatter_add(x, ins[1], u, axis + 1),
        Some(b) => {
            let idx = to_front(g, ins[1], b)?; // [B, M]
            let xd = dims(g, x);
            let (xm, perm) = fold_axis(g, x, axis)?;
            let (um, _) = fold_axis(g, u, axis)?;
            let off = offsets(g, size, xd[axis + 1], 2, idx)?;
            let idx = g.try_add(idx, off)?;
            let m = dims(g, idx).iter().product::<usize>();
            let idx = g.try_reshape(idx, &[m])?;
            let y = g.try_scatter_add(xm, idx, um, 0)?;
            // Undo the fold: [B*N, rest] -> [B, N, rest] -> original axis order.
            let mut td: Vec<usize> = perm.iter().map(|&p| xd[p]).collect();
            let y = g.try_reshape(y, &td)?;
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            td.clear();
            g.try_transpose(y, &inv)
        }
    }
}
