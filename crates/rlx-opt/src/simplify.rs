//! Algebraic simplification: small local rules, each never worse than its input.
//!
//! - `x + (-0.0)`, `(-0.0) + x`, `x - (+0.0)`, `x * 1`, `1 * x`, `x / 1` → `x` when no
//!   broadcasting widens `x`. Each identity is read exactly in the constant's dtype and must
//!   hold to the bit: for integers any zero; for floats only `-0.0` adds and `+0.0` subtracts
//!   exactly (`-0.0 + 0.0 = +0.0`); for complex both parts must be that zero, and no complex
//!   factor is taken as one; Bool constants are left alone.
//! - `neg(neg(x))` → `x`
//! - `transpose(transpose(x, p), q)` → `transpose(x, p∘q)`; identity transpose → `x`; a
//!   transpose that moves only axes of length 1 → a reshape (a view)
//! - `reshape(reshape(x))` → `reshape(x)`; reshape / expand to the same shape → `x`
//! - `cast(x)` to its own dtype → `x`; full-range narrow → `x`
//! - `concat(a…) + concat(b…)` along one axis → `concat(aᵢ + bᵢ)` over the common refinement of
//!   both splits, when only constant splats need cutting (the sum of narrows' cotangents, each
//!   padded with zeros, becomes one concat of the pieces)

use crate::{Pass, Rule, RuleSet, Site};
use rlx_ir::convert::{self, Element};
use rlx_ir::{Activation, Graph, NodeId, Op, OpKind, Result, Shape};

/// The algebraic rule list ([`rules`]) as a pass.
pub struct AlgebraicSimplify;

/// If `id` is a constant whose elements all hold one value (or an expand of one), that value,
/// read exactly in its dtype, and its bytes.
fn splat(g: &Graph, id: NodeId) -> Option<(Element, Vec<u8>)> {
    let n = g.node(id);
    if let Op::Expand { .. } = n.op {
        return splat(g, n.inputs[0]);
    }
    let Op::Constant { data } = &n.op else {
        return None;
    };
    let w = n.shape.dtype().size_bytes();
    let mut chunks = data.chunks_exact(w);
    let first = chunks.next()?;
    chunks.all(|c| c == first).then(|| {
        (
            convert::read_element(first, n.shape.dtype()),
            first.to_vec(),
        )
    })
}

/// The identities the rules remove, each exact to the bit in its dtype. A value a rule cannot
/// prove to be one (a complex factor, a Bool, a NaN) leaves the node alone.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Identity {
    /// `x + c = x`: for floats only `-0.0` (`-0.0 + 0.0` is `+0.0`); for complex both parts
    /// `-0.0` (the sum is taken part by part); for integers 0.
    Add,
    /// `x - c = x`: for floats only `+0.0` (`-0.0 - (-0.0)` is `+0.0`); for complex both parts
    /// `+0.0`; for integers 0.
    Sub,
    /// `x * c = x` and `x / c = x`: 1 for floats and integers. A complex `1 + 0i` is not
    /// one: `(a + bi)(1 + 0i)` has real part `a - b·0`, which is NaN for an infinite `b` and
    /// `+0.0` for `a = -0.0, b < 0`.
    MulDiv,
}

/// Whether `id` is a splat of `which`'s identity of the site's dtype.
fn is_identity(g: &Graph, id: NodeId, which: Identity) -> bool {
    let Some((e, _)) = splat(g, id) else {
        return false;
    };
    let neg_zero = |v: f64| v == 0.0 && v.is_sign_negative();
    let pos_zero = |v: f64| v == 0.0 && v.is_sign_positive();
    match (e, which) {
        (Element::Float(v), Identity::Add) => neg_zero(v),
        (Element::Float(v), Identity::Sub) => pos_zero(v),
        (Element::Float(v), Identity::MulDiv) => v == 1.0,
        (Element::Int(v), Identity::Add | Identity::Sub) => v == 0,
        (Element::Int(v), Identity::MulDiv) => v == 1,
        (Element::Complex(re, im), Identity::Add) => neg_zero(re) && neg_zero(im),
        (Element::Complex(re, im), Identity::Sub) => pos_zero(re) && pos_zero(im),
        (Element::Complex(..), Identity::MulDiv) => false,
        (Element::Bool(_), _) => false,
    }
}

/// Whether `id` has exactly the result shape of the site (so using it adds no broadcast).
fn same(g: &Graph, id: NodeId, s: &Site) -> bool {
    g.shape(id) == s.shape
}

/// `x` where `x op c` (or `c op x` when `either_side`) is `x` for an identity `c`.
fn drop_identity(g: &Graph, s: &Site, which: Identity, either_side: bool) -> Option<NodeId> {
    let (x, y) = (s.ins[0], s.ins[1]);
    if is_identity(g, y, which) && same(g, x, s) {
        Some(x)
    } else if either_side && is_identity(g, x, which) && same(g, y, s) {
        Some(y)
    } else {
        None
    }
}

/// The algebraic rules, tried in this order for each node.
pub fn rules() -> RuleSet<'static> {
    use OpKind as K;
    RuleSet::new("simplify")
        .with(Rule::new("add_concats", &[K::Add], |g, s| {
            let (x, y) = (s.ins[0], s.ins[1]);
            if !(same(g, x, s) && same(g, y, s))
                || concat_axis(g, x).is_none()
                || concat_axis(g, x) != concat_axis(g, y)
            {
                return Ok(None);
            }
            add_concats(g, x, y, s.shape)
        }))
        .with(Rule::new("add_zero", &[K::Add], |g, s| {
            Ok(drop_identity(g, s, Identity::Add, true))
        }))
        .with(Rule::new("sub_zero", &[K::Sub], |g, s| {
            Ok(drop_identity(g, s, Identity::Sub, false))
        }))
        .with(Rule::new("mul_one", &[K::Mul], |g, s| {
            Ok(drop_identity(g, s, Identity::MulDiv, true))
        }))
        .with(Rule::new("div_one", &[K::Div], |g, s| {
            Ok(drop_identity(g, s, Identity::MulDiv, false))
        }))
        .with(Rule::new("neg_neg", &[K::Neg], |g, s| {
            let inner = g.node(s.ins[0]);
            Ok(matches!(inner.op, Op::Activation(Activation::Neg)).then(|| inner.inputs[0]))
        }))
        .with(Rule::new("transpose_identity", &[K::Transpose], |_, s| {
            let Op::Transpose { perm } = s.op else {
                return Ok(None);
            };
            Ok(perm
                .iter()
                .enumerate()
                .all(|(i, &p)| i == p)
                .then_some(s.ins[0]))
        }))
        .with(Rule::new("transpose_unit_axes", &[K::Transpose], |g, s| {
            // Moving only axes of length 1 keeps every element's row-major offset: the
            // transpose is a reshape (a view on every backend), e.g. `[1, H, D] -> [H, 1, D]`.
            let Op::Transpose { perm } = s.op else {
                return Ok(None);
            };
            let (Some(src), Some(dims)) = (g.shape(s.ins[0]).static_dims(), s.shape.static_dims())
            else {
                return Ok(None);
            };
            let kept: Vec<usize> = perm.iter().copied().filter(|&p| src[p] != 1).collect();
            if perm.iter().enumerate().all(|(i, &p)| i == p)
                || !kept.windows(2).all(|w| w[0] < w[1])
            {
                return Ok(None);
            }
            Ok(Some(g.try_reshape(s.ins[0], &dims)?))
        }))
        .with(Rule::new("transpose_transpose", &[K::Transpose], |g, s| {
            let (Op::Transpose { perm }, Op::Transpose { perm: inner }) =
                (s.op, &g.node(s.ins[0]).op)
            else {
                return Ok(None);
            };
            let src = g.node(s.ins[0]).inputs[0];
            let composed: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
            Ok(Some(g.try_transpose(src, &composed)?))
        }))
        .with(Rule::new("reshape_same", &[K::Reshape], |g, s| {
            Ok(same(g, s.ins[0], s).then_some(s.ins[0]))
        }))
        .with(Rule::new("reshape_reshape", &[K::Reshape], |g, s| {
            let (Op::Reshape { shape: dims }, Op::Reshape { .. }) = (s.op, &g.node(s.ins[0]).op)
            else {
                return Ok(None);
            };
            let src = g.node(s.ins[0]).inputs[0];
            Ok(Some(g.try_reshape(src, dims)?))
        }))
        .with(Rule::new("expand_same", &[K::Expand], |g, s| {
            Ok(same(g, s.ins[0], s).then_some(s.ins[0]))
        }))
        .with(Rule::new("cast_same", &[K::Cast], |g, s| {
            Ok(same(g, s.ins[0], s).then_some(s.ins[0]))
        }))
        .with(Rule::new("narrow_full", &[K::Narrow], |g, s| {
            Ok(same(g, s.ins[0], s).then_some(s.ins[0]))
        }))
}

/// The axis of a concat node.
fn concat_axis(g: &Graph, id: NodeId) -> Option<usize> {
    match g.node(id).op {
        Op::Concat { axis } => Some(axis),
        _ => None,
    }
}

/// `concat(a…) + concat(b…)` (same shape, same axis) as one concat of per-segment sums, when
/// every part that spans several segments of the common refinement is a splat (cut for free).
fn add_concats(g: &mut Graph, x: NodeId, y: NodeId, shape: &Shape) -> Result<Option<NodeId>> {
    let axis = concat_axis(g, x).expect("checked by the caller");
    let Some(dims) = shape.static_dims() else {
        return Ok(None);
    };
    let bounds = |g: &Graph, id: NodeId| -> Vec<(usize, usize, NodeId)> {
        let mut off = 0;
        g.node(id)
            .inputs
            .iter()
            .map(|&p| {
                let len = g.shape(p).dims()[axis].as_static().unwrap_or(0);
                off += len;
                (off - len, off, p)
            })
            .collect()
    };
    let (a, b) = (bounds(g, x), bounds(g, y));
    let mut cuts: Vec<usize> = a.iter().chain(&b).map(|e| e.1).collect();
    cuts.push(0);
    cuts.sort_unstable();
    cuts.dedup();
    // Each part must match one segment exactly or be a splat.
    let fits = |parts: &[(usize, usize, NodeId)], g: &Graph| {
        parts.iter().all(|&(s, e, p)| {
            splat(g, p).is_some() || cuts.iter().filter(|&&c| c > s && c < e).count() == 0
        })
    };
    if !fits(&a, g) || !fits(&b, g) {
        return Ok(None);
    }
    let piece =
        |g: &mut Graph, parts: &[(usize, usize, NodeId)], s: usize, e: usize| -> Result<NodeId> {
            let &(ps, pe, p) = parts
                .iter()
                .find(|q| q.0 <= s && e <= q.1)
                .expect("segments refine every split");
            if ps == s && pe == e {
                return Ok(p);
            }
            // The splat's own bytes: every dtype (c64 included) keeps its value.
            let (_, bytes) = splat(g, p).expect("only splats are cut");
            let mut d = dims.clone();
            d[axis] = e - s;
            let c = g.try_constant_bytes(Shape::scalar(shape.dtype()), bytes)?;
            g.try_expand(c, &d)
        };
    let mut sums = Vec::new();
    for w in cuts.windows(2) {
        let (s, e) = (w[0], w[1]);
        let pa = piece(g, &a, s, e)?;
        let pb = piece(g, &b, s, e)?;
        let mut d = dims.clone();
        d[axis] = e - s;
        // The engine offers each segment's sum to the rules again, so zero padding drops out.
        sums.push(g.try_add(pa, pb)?);
    }
    Ok(Some(g.try_concat(&sums, axis)?))
}

impl Pass for AlgebraicSimplify {
    fn name(&self) -> &str {
        "simplify"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        rules().run(g)
    }

    fn run_counted(&self, g: &Graph) -> Result<(Graph, std::collections::BTreeMap<String, usize>)> {
        rules().apply(g)
    }

    fn run_logged(
        &self,
        g: &Graph,
    ) -> Result<(
        Graph,
        std::collections::BTreeMap<String, usize>,
        Vec<crate::rewrite::RuleSite>,
    )> {
        rules().apply_logged(g)
    }
}
