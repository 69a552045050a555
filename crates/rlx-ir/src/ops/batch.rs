//! Batching (`vmap`): the dispatch to each op family's batching rule (`batch` / `batchable` in
//! the family's file) and the helpers the rules share. Most rules move the batch axis to the
//! front and shift the op's axes by one; ops whose batched form needs more than that (batched
//! weights of a convolution, batched norm scales, batched rope positions) are handled by
//! batching their decomposition instead.

use super::ad::dims;
use super::{elementwise, index, linalg, movement, nn, quant, reduce, spatial};
use crate::{Error, Graph, NodeId, Op, Result};

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
pub(super) fn align(g: &mut Graph, x: NodeId, rank: usize) -> Result<NodeId> {
    let d = dims(g, x);
    if d.len() > rank {
        return Ok(x);
    }
    let mut nd = vec![d[0]];
    nd.extend(std::iter::repeat_n(1, rank - (d.len() - 1)));
    nd.extend_from_slice(&d[1..]);
    g.try_reshape(x, &nd)
}

/// What a batching rule gets: the operands, their batch axes and the number of examples.
pub struct Batched<'a> {
    /// The operands.
    pub ins: &'a [NodeId],
    /// Each operand's batch axis (`None`: shared by every example).
    pub bds: &'a [Option<usize>],
    /// Number of examples.
    pub size: usize,
}

impl Batched<'_> {
    /// Operand `i` with its batch axis in front (a shared operand broadcast to every example).
    pub fn front(&self, g: &mut Graph, i: usize) -> Result<NodeId> {
        materialize(g, self.ins[i], self.bds[i], self.size)
    }
}

/// The rule of broadcasting ops (elementwise binary ops, `Where`, matmul's batch axes): batched
/// operands get the batch in front and unit axes up to the widest per-example rank; shared ones
/// broadcast as they are. The result is batched along axis 0.
pub(super) fn broadcasting(g: &mut Graph, op: &Op, b: &Batched) -> Result<NodeId> {
    let r = (0..b.ins.len())
        .map(|i| g.shape(b.ins[i]).rank() - b.bds[i].is_some() as usize)
        .max()
        .unwrap_or(0);
    let mut args = Vec::new();
    for i in 0..b.ins.len() {
        args.push(match b.bds[i] {
            Some(bd) => {
                let f = to_front(g, b.ins[i], bd)?;
                align(g, f, r)?
            }
            None => b.ins[i],
        });
    }
    g.try_op(op.clone(), &args)
}

/// Whether [`batch`] handles `op` when the operands flagged in `batched` carry a batch axis.
/// When it does not, vmap batches the op's decomposition.
pub fn batch_supported(op: &Op, batched: &[bool]) -> bool {
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => true,
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Cast { .. } => true,
        Op::MatMul => true,
        Op::Reduce { .. } | Op::Softmax { .. } | Op::Cumsum { .. } | Op::TopK { .. } => true,
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. } => true,
        Op::Gather { .. } | Op::ScatterAdd { .. } => true,
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Rope { .. } | Op::Attention { .. } => {
            nn::batchable(op, batched)
        }
        Op::Conv(_) | Op::Pool(_) => spatial::batchable(op, batched),
        Op::DequantMatMul { .. } | Op::DequantizeRows { .. } => quant::batchable(op, batched),
        Op::Defined(d) => d.def().batchable(batched),
        // Composites and state updates: vmap batches the decomposition.
        Op::DotGeneral(_)
        | Op::Custom(_)
        | Op::Fused(_)
        | Op::CacheWrite
        | Op::CachedAttention { .. }
        | Op::PagedAttention { .. } => false,
    }
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
    let b = Batched { ins, bds, size };
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => Err(Error::op(
            op.name(),
            "leaves are batched by the vmap driver",
        )),
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Cast { .. } => {
            elementwise::batch(g, op, &b)
        }
        Op::MatMul => linalg::batch(g, op, &b),
        Op::Reduce { .. } | Op::Softmax { .. } | Op::Cumsum { .. } | Op::TopK { .. } => {
            reduce::batch(g, op, &b)
        }
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Rope { .. } | Op::Attention { .. } => {
            nn::batch(g, op, &b)
        }
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. } => movement::batch(g, op, &b),
        Op::Gather { .. } | Op::ScatterAdd { .. } => index::batch(g, op, &b),
        Op::Conv(_) | Op::Pool(_) => spatial::batch(g, op, &b),
        Op::DequantMatMul { .. } | Op::DequantizeRows { .. } => quant::batch(g, op, &b),
        Op::Defined(d) => d.def().batch(g, &b),
        Op::DotGeneral(_)
        | Op::Custom(_)
        | Op::Fused(_)
        | Op::CacheWrite
        | Op::CachedAttention { .. }
        | Op::PagedAttention { .. } => Err(Error::op(
            op.name(),
            "has no batching rule; vmap batches its decomposition",
        )),
    }
}
