//! Rules of MatMul and DotGeneral (and DotGeneral's decomposition into MatMul).

use super::{dims_of, same_dtype, static_dims};
use crate::text::{Attr, Attrs};
use crate::{broadcast_dims, DotDims, Error, Graph, NodeId, Result, Shape};

pub(super) fn matmul(ins: &[&Shape]) -> Result<Shape> {
    let (a, b) = (ins[0], ins[1]);
    same_dtype("matmul", a, b)?;
    if a.rank() < 2 || b.rank() < 2 {
        return Err(Error::op(
            "matmul",
            format!("operands need rank >= 2, got lhs {a} and rhs {b}; reshape vectors to [1, n] or [n, 1]"),
        ));
    }
    let (ad, bd) = (a.dims(), b.dims());
    let (m, k1) = (&ad[ad.len() - 2], &ad[ad.len() - 1]);
    let (k2, n) = (&bd[bd.len() - 2], &bd[bd.len() - 1]);
    if k1 != k2 {
        return Err(Error::op(
            "matmul",
            format!("inner dimensions differ: lhs {a} has k = {k1}, rhs {b} has k = {k2}"),
        ));
    }
    let batch = broadcast_dims(&ad[..ad.len() - 2], &bd[..bd.len() - 2]).ok_or_else(|| {
        Error::op(
            "matmul",
            format!("batch dimensions do not broadcast: lhs {a} vs rhs {b}"),
        )
    })?;
    let mut out = batch;
    out.push(m.clone());
    out.push(n.clone());
    Ok(Shape::with_dims(out, a.dtype()))
}

fn check_axes(which: &str, axes: &[usize], rank: usize, used: &mut [bool]) -> Result<()> {
    for &ax in axes {
        if ax >= rank || used[ax] {
            return Err(Error::op(
                "dot_general",
                format!("{which} axis {ax} is out of range or repeated (rank {rank})"),
            ));
        }
        used[ax] = true;
    }
    Ok(())
}

/// Free (non-batch, non-contracting) axes, in order.
fn free_axes(rank: usize, batch: &[usize], contract: &[usize]) -> Vec<usize> {
    (0..rank)
        .filter(|i| !batch.contains(i) && !contract.contains(i))
        .collect()
}

pub(super) fn dot_general(d: &DotDims, ins: &[&Shape]) -> Result<Shape> {
    let (a, b) = (ins[0], ins[1]);
    same_dtype("dot_general", a, b)?;
    let ad = static_dims("dot_general", "lhs", a)?;
    let bd = static_dims("dot_general", "rhs", b)?;
    if d.lhs_contract.len() != d.rhs_contract.len() || d.lhs_batch.len() != d.rhs_batch.len() {
        return Err(Error::op(
            "dot_general",
            format!("unpaired dimension numbers {d:?}"),
        ));
    }
    let mut ua = vec![false; ad.len()];
    let mut ub = vec![false; bd.len()];
    check_axes("lhs batch", &d.lhs_batch, ad.len(), &mut ua)?;
    check_axes("lhs contracting", &d.lhs_contract, ad.len(), &mut ua)?;
    check_axes("rhs batch", &d.rhs_batch, bd.len(), &mut ub)?;
    check_axes("rhs contracting", &d.rhs_contract, bd.len(), &mut ub)?;
    for (x, y) in d
        .lhs_batch
        .iter()
        .zip(&d.rhs_batch)
        .chain(d.lhs_contract.iter().zip(&d.rhs_contract))
    {
        if ad[*x] != bd[*y] {
            return Err(Error::op(
                "dot_general",
                format!("lhs axis {x} (size {}) and rhs axis {y} (size {}) are paired but differ; lhs {a}, rhs {b}", ad[*x], bd[*y]),
            ));
        }
    }
    let mut out: Vec<usize> = d.lhs_batch.iter().map(|&i| ad[i]).collect();
    out.extend(
        free_axes(ad.len(), &d.lhs_batch, &d.lhs_contract)
            .iter()
            .map(|&i| ad[i]),
    );
    out.extend(
        free_axes(bd.len(), &d.rhs_batch, &d.rhs_contract)
            .iter()
            .map(|&i| bd[i]),
    );
    Ok(Shape::with_dims(dims_of(&out), a.dtype()))
}

/// `dot_general` as transpose + reshape to `[B, M, K] x [B, K, N]`, a batched matmul, and a
/// reshape back to `[batch..., lhs free..., rhs free...]`.
pub(super) fn decompose_dot_general(
    g: &mut Graph,
    d: &DotDims,
    lhs: NodeId,
    rhs: NodeId,
) -> Result<NodeId> {
    let out_shape = dot_general(d, &[g.shape(lhs), g.shape(rhs)])?;
    let ad = g.shape(lhs).static_dims().unwrap_or_default();
    let bd = g.shape(rhs).static_dims().unwrap_or_default();
    let lf = free_axes(ad.len(), &d.lhs_batch, &d.lhs_contract);
    let rf = free_axes(bd.len(), &d.rhs_batch, &d.rhs_contract);
    let prod = |dims: &[usize], ax: &[usize]| ax.iter().map(|&i| dims[i]).product::<usize>();
    let (bsz, m, k, n) = (
        prod(&ad, &d.lhs_batch),
        prod(&ad, &lf),
        prod(&ad, &d.lhs_contract),
        prod(&bd, &rf),
    );
    let lperm: Vec<usize> = d
        .lhs_batch
        .iter()
        .chain(&lf)
        .chain(&d.lhs_contract)
        .copied()
        .collect();
    let rperm: Vec<usize> = d
        .rhs_batch
        .iter()
        .chain(&d.rhs_contract)
        .chain(&rf)
        .copied()
        .collect();
    let l = g.try_transpose(lhs, &lperm)?;
    let l = g.try_reshape(l, &[bsz, m, k])?;
    let r = g.try_transpose(rhs, &rperm)?;
    let r = g.try_reshape(r, &[bsz, k, n])?;
    let p = g.try_dot(l, r)?;
    let out = out_shape.static_dims().unwrap_or_default();
    g.try_reshape(p, &out)
}

// ---------------------------------------------------------------- differentiation rules

use super::ad::{add_opt, differentiable, fit, swap_last2, unbroadcast};

/// `d(A·B) = dA·B + A·dB`; the cotangents are `ct·Bᵀ` and `Aᵀ·ct`, summed over broadcast batch axes.
pub(super) fn vjp_matmul(g: &mut Graph, ins: &[NodeId], ct: NodeId) -> Result<Vec<Option<NodeId>>> {
    let (a, b) = (ins[0], ins[1]);
    if !differentiable(g.shape(a).dtype()) {
        return Ok(vec![None, None]);
    }
    let (sa, sb) = (g.shape(a).clone(), g.shape(b).clone());
    let bt = g.try_transpose(b, &swap_last2(sb.rank()))?;
    let ga = g.try_dot(ct, bt)?;
    let gb = if sb.rank() == 2 && sa.rank() > 2 {
        // A weight shared by every batch row: one product over all rows, [k, M] x [M, n], rather
        // than a product per batch followed by a sum over the batch.
        let ad = super::ad::dims(g, a);
        let cd = super::ad::dims(g, ct);
        let rows: usize = ad[..ad.len() - 1].iter().product();
        let a2 = g.try_reshape(a, &[rows, ad[ad.len() - 1]])?;
        let c2 = g.try_reshape(ct, &[rows, cd[cd.len() - 1]])?;
        let a2t = g.try_transpose(a2, &[1, 0])?;
        g.try_dot(a2t, c2)?
    } else {
        let at = g.try_transpose(a, &swap_last2(sa.rank()))?;
        g.try_dot(at, ct)?
    };
    Ok(vec![
        Some(unbroadcast(g, ga, &sa)?),
        Some(unbroadcast(g, gb, &sb)?),
    ])
}

pub(super) fn jvp_matmul(
    g: &mut Graph,
    ins: &[NodeId],
    out: NodeId,
    t: &[Option<NodeId>],
) -> Result<Option<NodeId>> {
    if !differentiable(g.shape(ins[0]).dtype()) {
        return Ok(None);
    }
    let x = match t[0] {
        Some(ta) => Some(g.try_dot(ta, ins[1])?),
        None => None,
    };
    let y = match t[1] {
        Some(tb) => Some(g.try_dot(ins[0], tb)?),
        None => None,
    };
    let od = super::ad::dims(g, out);
    add_opt(g, x, y)?.map(|r| fit(g, r, &od)).transpose()
}

// ---------------------------------------------------------------- reference evaluation

use crate::eval::{broadcast_map, Data, Tensor};

/// Reference MatMul: batch axes broadcast, each dot product summed exactly (f64 for floats,
/// i128 for integers) and rounded once.
pub(super) fn eval_matmul(ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let od = static_dims("matmul", "result", out)?;
    let (a, b) = (ins[0], ins[1]);
    let (ad, bd) = (a.dims(), b.dims());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch = &od[..od.len() - 2];
    // The first element of each broadcast batch matrix of a and b.
    let amap = broadcast_map(&ad[..ad.len() - 2], batch);
    let bmap = broadcast_map(&bd[..bd.len() - 2], batch);
    let nb = amap.len();
    let mut idx = Vec::with_capacity(nb * m * n);
    for t in 0..nb {
        for i in 0..m {
            for j in 0..n {
                idx.push((amap[t] * m * k + i * k, bmap[t] * k * n + j));
            }
        }
    }
    Ok(match (a.data(), b.data()) {
        (Data::Float(x), Data::Float(y)) => Tensor::from_f64(
            &od,
            out.dtype(),
            idx.iter()
                .map(|&(ai, bj)| (0..k).map(|p| x[ai + p] * y[bj + p * n]).sum())
                .collect(),
        ),
        (Data::Int(x), Data::Int(y)) => Tensor::from_i128(
            &od,
            out.dtype(),
            idx.iter()
                .map(|&(ai, bj)| {
                    (0..k)
                        .map(|p| x[ai + p] as i128 * y[bj + p * n] as i128)
                        .sum()
                })
                .collect(),
        ),
        _ => {
            return Err(Error::op(
                "matmul",
                "operands of one dtype hold different element kinds",
            ))
        }
    })
}

/// Cost of MatMul: `2 m n k` per batch matrix.
pub(super) fn cost_matmul(ins: &[&Shape], out: &Shape) -> super::Cost {
    let k = ins[0]
        .dims()
        .last()
        .and_then(|d| d.as_static())
        .unwrap_or(0) as u64;
    super::Cost::streaming(ins, out, 0).with_flops(2 * super::numel(out) * k)
}

/// Cost of DotGeneral: `2` times the result size times the contracted size.
pub(super) fn cost_dot_general(d: &DotDims, ins: &[&Shape], out: &Shape) -> super::Cost {
    let k: u64 = d
        .lhs_contract
        .iter()
        .map(|&a| {
            ins[0]
                .dims()
                .get(a)
                .and_then(|d| d.as_static())
                .unwrap_or(0) as u64
        })
        .product();
    super::Cost::streaming(ins, out, 0).with_flops(2 * super::numel(out) * k)
}

/// Text-form attributes of a dot_general (a matmul has none).
pub fn attrs(d: &DotDims) -> Vec<(&'static str, Attr)> {
    vec![
        ("lhs_contract", d.lhs_contract.as_slice().into()),
        ("rhs_contract", d.rhs_contract.as_slice().into()),
        ("lhs_batch", d.lhs_batch.as_slice().into()),
        ("rhs_batch", d.rhs_batch.as_slice().into()),
    ]
}

/// A dot_general from its text-form attributes.
pub fn from_attrs(a: &mut Attrs) -> Result<DotDims> {
    Ok(DotDims {
        lhs_contract: a.usizes("lhs_contract")?,
        rhs_contract: a.usizes("rhs_contract")?,
        lhs_batch: a.usizes("lhs_batch")?,
        rhs_batch: a.usizes("rhs_batch")?,
    })
}

// Batching.

/// Batching rule of `MatMul`: it broadcasts over its batch axes, so batched operands get the
/// batch in front (see [`super::batch::broadcasting`]). `DotGeneral` has none: vmap batches its
/// decomposition.
pub(super) fn batch(
    g: &mut Graph,
    op: &crate::Op,
    b: &super::batch::Batched,
) -> Result<(NodeId, Option<usize>)> {
    Ok((super::batch::broadcasting(g, op, b)?, Some(0)))
}
