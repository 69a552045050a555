//! Rules of [`Op::Fused`]: a fused region is its body. Inference checks the operands against the
//! body's inputs; evaluation, differentiation, batching and any backend without a kernel for the
//! region's kind go through the inlined body; the cost is the body's arithmetic with only the
//! operands read and the result written (what fusing saves).

use super::custom::{args, inline};
use super::Cost;
use crate::text::{Attr, Attrs};
use crate::{Error, FusedRegion, FusionKind, Graph, NodeId, Op, Result, Shape};

fn err(r: &FusedRegion, msg: impl std::fmt::Display) -> Error {
    Error::op("fused", format!("{} region: {msg}", r.kind.name()))
}

pub(super) fn arity(r: &FusedRegion) -> usize {
    args(&r.body).len()
}

pub(super) fn infer(r: &FusedRegion, ins: &[&Shape]) -> Result<Shape> {
    if r.body
        .ids()
        .any(|i| matches!(r.body.node(i).op, Op::Param { .. }))
    {
        return Err(err(
            r,
            "the body must not declare params; pass them as operands",
        ));
    }
    let Some(&out) = r.body.outputs().get(r.output) else {
        return Err(err(
            r,
            format!(
                "the body has {} outputs; there is no output {}",
                r.body.outputs().len(),
                r.output
            ),
        ));
    };
    crate::verify(&r.body)?;
    for (i, (a, s)) in args(&r.body).iter().zip(ins).enumerate() {
        if r.body.shape(*a) != *s {
            return Err(err(
                r,
                format!("operand {i} is {s}, the body expects {}", r.body.shape(*a)),
            ));
        }
    }
    Ok(r.body.shape(out).clone())
}

/// The body inlined into `g` on `ins`: the region's decomposition.
pub(super) fn decompose(g: &mut Graph, r: &FusedRegion, ins: &[NodeId]) -> Result<NodeId> {
    Ok(inline(g, &r.body, ins)?[r.output])
}

/// The body's arithmetic, reading each operand once and writing the result once; a further
/// result of a region (output 1, 2, ...) adds only its own write, the region being computed
/// once for all its results.
pub(super) fn cost(r: &FusedRegion, ins: &[&Shape], out: &Shape) -> Cost {
    if r.output > 0 {
        return Cost {
            flops: 0,
            bytes: super::bytes(out),
        };
    }
    Cost {
        flops: super::graph_cost(&r.body).flops,
        bytes: super::bytes(out),
    }
    .with_reads(ins, 0)
}

/// Text-form attributes: the kind, the output when it is not the first, the region id when
/// there is one, and the body.
pub fn attrs(r: &FusedRegion) -> Vec<(&'static str, Attr)> {
    let mut a = vec![("kind", Attr::word(r.kind.name()))];
    if r.output != 0 {
        a.push(("output", Attr::from(r.output)));
    }
    if let Some(k) = r.region {
        a.push(("region", Attr::from(k as usize)));
    }
    a.push(("body", Attr::Graph(r.body.clone())));
    a
}

/// A fused region from its text-form attributes.
pub fn from_attrs(a: &mut Attrs) -> Result<FusedRegion> {
    let names: Vec<&str> = FusionKind::ALL.iter().map(|k| k.name()).collect();
    let kind = a.word("kind", &names.join(", "), FusionKind::from_name)?;
    let output = a.usize_or("output", 0)?;
    // Absent: a region whose node is its only one.
    let region = match a.usize_or("region", usize::MAX)? {
        usize::MAX => None,
        k => Some(u32::try_from(k).map_err(|_| Error::op("fused", "region ids are below 2^32"))?),
    };
    let body = a
        .graph("body", false)?
        .ok_or_else(|| Error::op("fused", "missing body"))?;
    Ok(FusedRegion {
        kind,
        body: Box::new(body),
        output,
        region,
    })
}
