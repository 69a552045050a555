//! Loss functions as graph builders.

use rlx_ir::{Activation, CmpOp, Graph, NodeId, ReduceKind, Result, Shape};

/// Mean squared error over every element: `mean((pred - target)^2)`.
pub fn mse(g: &mut Graph, pred: NodeId, target: NodeId) -> Result<NodeId> {
    let d = g.try_sub(pred, target)?;
    let sq = g.try_mul(d, d)?;
    let axes: Vec<usize> = (0..g.shape(sq).rank()).collect();
    g.try_mean(sq, &axes, false)
}

/// Softmax cross-entropy of `logits [N, C]` against integer `labels [N]`, averaged over N.
/// Computed as `logsumexp(z) - z[label]` with `z = logits - max(logits)`, so large logits do not
/// overflow.
pub fn softmax_cross_entropy(g: &mut Graph, logits: NodeId, labels: NodeId) -> Result<NodeId> {
    let ld = g.shape(logits).static_dims().unwrap_or_default();
    if ld.len() != 2 {
        return Err(rlx_ir::Error::op(
            "softmax_cross_entropy",
            format!("logits must be [N, C], got {}", g.shape(logits)),
        ));
    }
    let (n, c) = (ld[0], ld[1]);
    let lt = g.shape(labels).dtype();
    if !lt.is_int() || g.shape(labels).static_dims() != Some(vec![n]) {
        return Err(rlx_ir::Error::op(
            "softmax_cross_entropy",
            format!(
                "labels must be integers of shape [{n}], got {}",
                g.shape(labels)
            ),
        ));
    }
    let dt = g.shape(logits).dtype();
    let m = g.try_reduce(ReduceKind::Max, logits, &[1], true)?;
    let z = g.try_sub(logits, m)?;
    let e = g.try_activation(Activation::Exp, z)?;
    let s = g.try_sum(e, &[1], true)?;
    let lse = g.try_activation(Activation::Log, s)?;
    let logp = g.try_sub(z, lse)?;
    // One-hot of the labels: labels[:, None] == iota(C).
    let mut iota = vec![0u8; c * lt.size_bytes()];
    for (i, chunk) in iota.chunks_exact_mut(lt.size_bytes()).enumerate() {
        rlx_ir::convert::f64_to_bytes(i as f64, lt, chunk)?;
    }
    let iota = g.try_constant_bytes(Shape::new(&[c], lt), iota)?;
    let col = g.try_reshape(labels, &[n, 1])?;
    let hot = g.try_compare(CmpOp::Eq, col, iota)?;
    let hot = g.try_cast(hot, dt)?;
    let picked = g.try_mul(hot, logp)?;
    let nll = g.try_sum(picked, &[1], false)?;
    let mean = g.try_mean(nll, &[0], false)?;
    g.try_activation(Activation::Neg, mean)
}
