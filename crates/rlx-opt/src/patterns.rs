//! Fusion of known shapes of computation into regions of their own kind, for backends with a
//! kernel for the whole shape (a GPU's flash attention, a GEMM with its epilogue in registers):
//!
//! - [`FusionKind::Attention`]: `softmax(q·kᵀ [· scale] [+ mask]) · v`, every intermediate read
//!   once (inference; training keeps the probabilities for the backward pass).
//! - [`FusionKind::GatedMlp`]: `act(x·W_gate) * (x·W_up)` with SiLU (SwiGLU) or GELU (GeGLU),
//!   products plain or of packed (GGUF) weights.
//! - [`FusionKind::NormMatMul`]: `rms_norm([x + r]) · W`, the norm read by the product alone
//!   and the add (where there is one) by nothing else before the product; the sum is the
//!   region's second result (a decode kernel normalizes the activations it stages).
//! - [`FusionKind::ResidualNorm`]: `rms_norm(x + r)` or `layer_norm(x + r)`; the sum, which the
//!   residual stream goes on with, is the region's second result.
//! - [`FusionKind::MatMulEpilogue`]: a product followed by a bias added along its rows and/or an
//!   activation.
//!
//! Each is formed only where the backend takes it (asked with the region's last node and the
//! kind; without a backend every shape is formed, for tests and pictures). The regions' bodies
//! are the ops they replace, so a backend without the kernel never sees them. Run before
//! elementwise fusion, which would otherwise take the epilogues.

use crate::fusion::{emit, Accepts, FusionOptions, FusionReport, Uses};
use crate::Pass;
use rlx_ir::{Activation, BinaryOp, FusionKind, Graph, NodeId, Op, QuantScheme, Result};

/// The pass (see the module docs).
pub struct FusePatterns<'a> {
    /// Options (`patterns` switches the pass, `max_region_ops` is not used).
    pub options: FusionOptions,
    /// Whether the backend takes a region of a kind ending at a node; `None`: every one.
    pub accepts: Option<Accepts<'a>>,
}

impl<'a> FusePatterns<'a> {
    /// The pass for a backend (`None`: form every pattern).
    pub fn new(options: FusionOptions, accepts: Option<Accepts<'a>>) -> FusePatterns<'a> {
        FusePatterns { options, accepts }
    }

    /// Fuse `g`, returning the new graph, the report (regions only) and where each node went.
    pub fn fuse_mapped(&self, g: &Graph) -> Result<(Graph, FusionReport, Vec<Option<NodeId>>)> {
        let regions = if self.options.patterns {
            self.find(g)
        } else {
            Vec::new()
        };
        emit(g, &regions)
    }

    fn find(&self, g: &Graph) -> Vec<(FusionKind, Vec<usize>)> {
        let n = g.len();
        let Uses {
            readers,
            written,
            is_output,
        } = Uses::of(g);
        let m = Matcher {
            g,
            readers: &readers,
            is_output: &is_output,
        };
        let mut taken = vec![false; n];
        let mut regions = Vec::new();
        type Find<'m> = fn(&Matcher<'m>, NodeId) -> Option<Vec<usize>>;
        let finders: [(FusionKind, Find<'_>); 5] = [
            (FusionKind::Attention, Matcher::attention),
            (FusionKind::GatedMlp, Matcher::gated_mlp),
            (FusionKind::NormMatMul, Matcher::norm_matmul),
            (FusionKind::ResidualNorm, Matcher::residual_norm),
            (FusionKind::MatMulEpilogue, Matcher::epilogue),
        ];
        for (kind, find) in finders {
            for id in g.ids() {
                let Some(mut members) = find(&m, id) else {
                    continue;
                };
                members.sort_unstable();
                members.dedup();
                let root = *members.last().expect("a pattern has members");
                let sound = members.iter().all(|&j| {
                    !taken[j]
                        && g.node(NodeId(j as u32))
                            .inputs
                            .iter()
                            .all(|x| !written[x.index()])
                }) && members.iter().all(|&j| {
                    j == root || readers[j].iter().all(|&u| members.contains(&u) || u > root)
                });
                let takes = self.accepts.is_none_or(|f| f(g, NodeId(root as u32), kind));
                if sound && takes {
                    for &j in &members {
                        taken[j] = true;
                    }
                    regions.push((kind, members));
                }
            }
        }
        regions.sort_by_key(|(_, m)| *m.last().expect("members"));
        regions
    }
}

struct Matcher<'m> {
    g: &'m Graph,
    readers: &'m [Vec<usize>],
    is_output: &'m [bool],
}

impl Matcher<'_> {
    fn op(&self, id: NodeId) -> &Op {
        &self.g.node(id).op
    }

    /// Read by exactly one node and not a graph output.
    fn single(&self, id: NodeId) -> bool {
        self.readers[id.index()].len() == 1 && !self.is_output[id.index()]
    }

    fn product(&self, id: NodeId) -> bool {
        matches!(self.op(id), Op::MatMul | Op::DequantMatMul { .. })
    }

    /// `softmax(q·kᵀ [· scale] [+ mask]) · v`, at its last product.
    fn attention(&self, id: NodeId) -> Option<Vec<usize>> {
        if !matches!(self.op(id), Op::MatMul) {
            return None;
        }
        let p = self.g.node(id).inputs[0];
        let Op::Softmax { axis } = self.op(p) else {
            return None;
        };
        if *axis + 1 != self.g.shape(p).rank() || !self.single(p) {
            return None;
        }
        let mut members = vec![id.index(), p.index()];
        let mut s = self.g.node(p).inputs[0];
        for op in [BinaryOp::Add, BinaryOp::Mul] {
            if matches!(self.op(s), Op::Binary(b) if *b == op) && self.single(s) {
                let ins = &self.g.node(s).inputs;
                // The operand running back to the scores: the one of the scores' shape.
                let Some(&next) = ins.iter().find(|&&x| self.g.shape(x) == self.g.shape(s)) else {
                    break;
                };
                members.push(s.index());
                s = next;
            }
        }
        (matches!(self.op(s), Op::MatMul) && self.single(s)).then(|| {
            members.push(s.index());
            members
        })
    }

    /// `act(x·W_gate) * (x·W_up)`, at the product.
    fn gated_mlp(&self, id: NodeId) -> Option<Vec<usize>> {
        if !matches!(self.op(id), Op::Binary(BinaryOp::Mul)) {
            return None;
        }
        let ins = &self.g.node(id).inputs;
        for (a, b) in [(ins[0], ins[1]), (ins[1], ins[0])] {
            let Op::Activation(Activation::Silu | Activation::Gelu | Activation::GeluApprox) =
                self.op(a)
            else {
                continue;
            };
            let gate = self.g.node(a).inputs[0];
            let shared = self.product(gate)
                && self.product(b)
                && self.g.node(gate).inputs[0] == self.g.node(b).inputs[0];
            if shared && gate != b && self.single(a) && self.single(gate) && self.single(b) {
                return Some(vec![gate.index(), b.index(), a.index(), id.index()]);
            }
        }
        None
    }

    /// `rms_norm([x + r]) · W`, at the product: the norm is the product's activations and read
    /// by nothing else; the add joins where its operands have its shape and every other reader
    /// comes after the product (which computes the sum where the add was).
    fn norm_matmul(&self, id: NodeId) -> Option<Vec<usize>> {
        if !self.product(id) {
            return None;
        }
        let ins = &self.g.node(id).inputs;
        let norm = ins[0];
        if !matches!(self.op(norm), Op::RmsNorm { .. })
            || !self.single(norm)
            || ins[1..].contains(&norm)
        {
            return None;
        }
        let mut members = vec![norm.index(), id.index()];
        let a = self.g.node(norm).inputs[0];
        let an = self.g.node(a);
        let joins = matches!(an.op, Op::Binary(BinaryOp::Add))
            && an
                .inputs
                .iter()
                .all(|&x| self.g.shape(x) == self.g.shape(a))
            && self.readers[a.index()]
                .iter()
                .all(|&u| u == norm.index() || u > id.index());
        if joins {
            members.push(a.index());
        }
        Some(members)
    }

    /// `norm(x + r)`, at the norm.
    fn residual_norm(&self, id: NodeId) -> Option<Vec<usize>> {
        if !matches!(self.op(id), Op::RmsNorm { .. } | Op::LayerNorm { .. }) {
            return None;
        }
        let x = self.g.node(id).inputs[0];
        (matches!(self.op(x), Op::Binary(BinaryOp::Add))
            && self.g.shape(x) == self.g.shape(self.g.node(x).inputs[0])
            && self.g.shape(x) == self.g.shape(self.g.node(x).inputs[1]))
        .then(|| vec![x.index(), id.index()])
    }

    /// A product, then a bias along its rows and/or an activation, at the last of them.
    fn epilogue(&self, id: NodeId) -> Option<Vec<usize>> {
        if !self.product(id) || !self.single(id) {
            return None;
        }
        let mut members = vec![id.index()];
        let mut cur = id;
        let cols = self.g.shape(id).dims().last()?.clone();
        let reader = |x: NodeId| NodeId(self.readers[x.index()][0] as u32);
        let u = reader(cur);
        if let Op::Binary(BinaryOp::Add) = self.op(u) {
            let other = self.g.node(u).inputs.iter().copied().find(|&x| x != cur)?;
            let bias = self.g.shape(other).dims();
            if bias.last() == Some(&cols)
                && bias[..bias.len() - 1]
                    .iter()
                    .all(|d| *d == rlx_ir::Dim::Static(1))
            {
                members.push(u.index());
                cur = u;
            }
        }
        if cur == id || self.single(cur) {
            let u = reader(cur);
            if matches!(self.op(u), Op::Activation(_)) {
                members.push(u.index());
            }
        }
        (members.len() > 1).then_some(members)
    }
}

/// A [`FusionKind::NormMatMul`] region's values as nodes of the graph holding it: what a
/// backend's kernel for the region reads and writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormMatMulParts {
    /// The product's block type (`None`: a plain `MatMul`).
    pub scheme: Option<QuantScheme>,
    /// The norm's operand; with a residual add, the add's first operand.
    pub x: NodeId,
    /// The add's second operand, where the region has the add.
    pub residual: Option<NodeId>,
    /// The node of the add's sum (the region's second result), where something outside the
    /// region reads it.
    pub sum: Option<NodeId>,
    /// The norm's scale.
    pub gamma: NodeId,
    /// The norm's epsilon.
    pub eps: f32,
    /// The product's second operand.
    pub w: NodeId,
}

/// The parts of the `norm_matmul` region whose result `id` is (its first or its sum), or
/// `None` where `id` is no such region or its body is not the pattern's shape (a region
/// written by hand).
pub fn norm_matmul_parts(g: &Graph, id: NodeId) -> Option<NormMatMulParts> {
    let head = g.fused_head(id)?;
    let node = g.node(head);
    let Op::Fused(r) = &node.op else {
        return None;
    };
    if r.kind != FusionKind::NormMatMul {
        return None;
    }
    let b = &*r.body;
    // The body's inputs, in order, are the region's operands.
    let mut outer: Vec<Option<NodeId>> = vec![None; b.len()];
    let mut k = 0;
    for bid in b.ids() {
        if matches!(b.node(bid).op, Op::Input { .. }) {
            outer[bid.index()] = Some(*node.inputs.get(k)?);
            k += 1;
        }
    }
    let at = |x: NodeId| outer[x.index()];
    let outs = b.outputs();
    let p = *outs.first()?;
    let scheme = match b.node(p).op {
        Op::DequantMatMul { scheme } => Some(scheme),
        Op::MatMul => None,
        _ => return None,
    };
    let (h, w) = (b.node(p).inputs[0], b.node(p).inputs[1]);
    let Op::RmsNorm { eps } = b.node(h).op else {
        return None;
    };
    let (a, gamma) = (b.node(h).inputs[0], b.node(h).inputs[1]);
    let (x, residual, sum) = match b.node(a).op {
        Op::Binary(BinaryOp::Add) => {
            let sum = match outs[1..] {
                [] => None,
                [s] if s == a => Some(g.fused_results(head).first()?.1),
                _ => return None,
            };
            let ins = &b.node(a).inputs;
            (at(ins[0])?, Some(at(ins[1])?), sum)
        }
        _ if outs.len() == 1 => (at(a)?, None, None),
        _ => return None,
    };
    Some(NormMatMulParts {
        scheme,
        x,
        residual,
        sum,
        gamma: at(gamma)?,
        eps,
        w: at(w)?,
    })
}

/// The position-form cache writes (one position) whose update is a rotation read by nothing
/// else, through reshapes that nothing else reads either, and which `takes(graph, rope,
/// cache_write)` accepts: `of[cache_write] = Some(rope)`. A backend rotates such an update
/// straight into the cache, one step instead of two. The rule every backend reads; not a region
/// of the IR, because a cache write inside a region's body would update a region input (not a
/// param) in place.
pub fn ropes_into_cache_writes(
    g: &Graph,
    takes: &dyn Fn(&Graph, NodeId, NodeId) -> bool,
) -> Vec<Option<NodeId>> {
    let mut readers: Vec<Vec<NodeId>> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for x in &g.node(id).inputs {
            readers[x.index()].push(id);
        }
    }
    let mut of = vec![None; g.len()];
    for id in g.ids() {
        let node = g.node(id);
        if !matches!(node.op, Op::CacheWrite) {
            continue;
        }
        let one_pos = g.shape(node.inputs[2]).numel() == Some(1);
        let mut u = node.inputs[1];
        let mut next = id;
        while matches!(g.node(u).op, Op::Reshape { .. }) && readers[u.index()] == [next] {
            next = u;
            u = g.node(u).inputs[0];
        }
        let fits = matches!(g.node(u).op, Op::Rope { .. })
            && readers[u.index()] == [next]
            && !g.outputs().contains(&u)
            && one_pos
            && takes(g, u, id);
        if fits {
            of[id.index()] = Some(u);
        }
    }
    of
}

impl Pass for FusePatterns<'_> {
    fn name(&self) -> &str {
        "fuse_patterns"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        let (out, report, _) = self.fuse_mapped(g)?;
        Ok((out, report.regions.len()))
    }
}
