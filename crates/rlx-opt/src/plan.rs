//! The lowering plan: the decisions the compiler makes for every backend after optimizing, as
//! IR (fused regions) plus side tables a backend reads while lowering.
//!
//! - **Fusion** ([`FuseElementwise`]) with the backend's region kernels: the graph gets
//!   [`rlx_ir::Op::Fused`] nodes.
//! - **Causal skips** ([`causal_skips`]): products one of whose operands is known to be zero on
//!   one side of a diagonal (causal attention's probabilities and their gradients), or whose
//!   result no reader needs there (the scores a -inf mask hides). A GEMM may skip that part.
//! - **Permuted stores** ([`permuted_stores`]): a product or an attention whose one reader
//!   transposes it (the head merge `[b, h, t, d] -> [b, t, h, d]`) may be stored in the
//!   transposed order, so the transpose is a dense view.
//! - **Donations** ([`donations`]): the param updates a backend may compute straight into the
//!   param's storage (JAX's buffer donation), because nothing reads the old value afterwards.
//! - **Panel params** ([`panel_params`]): 2-D bf16 weights read only as the right operand of
//!   products, stored in column panels of the width the backend's GEMM streams (a product
//!   then reads each panel as one contiguous run; the runtime converts when params are set and
//!   read, so users see row-major weights).
//!
//! [`prepare`] runs them in order and returns the graph to lower with its [`LoweringPlan`].
//! Options live in [`LoweringOptions`]; the environment only overrides them.

use crate::fusion::{Accepts, FuseElementwise, FusionOptions, FusionReport};
use crate::patterns::FusePatterns;
use rlx_ir::{BinaryOp, DType, Error, FusionKind, Graph, NodeId, Op, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which compile-time decisions [`prepare`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoweringOptions {
    /// Fusion.
    pub fusion: FusionOptions,
    /// Find causal skips (`RLX_CAUSAL_SKIP=0` turns them off through [`LoweringOptions::with_env`]).
    pub causal_skip: bool,
    /// Store products in the order their one transposing reader wants.
    pub permuted_stores: bool,
    /// Compute param updates in place where sound.
    pub donate: bool,
    /// Column-panel width for [`panel_params`] (the backend's, see `Backend::param_panels`);
    /// 0 keeps every param row-major. `RLX_PARAM_PANELS=0` turns it off through
    /// [`LoweringOptions::with_env`].
    pub param_panels: usize,
}

impl Default for LoweringOptions {
    fn default() -> Self {
        LoweringOptions {
            fusion: FusionOptions::default(),
            causal_skip: true,
            permuted_stores: true,
            donate: true,
            param_panels: 0,
        }
    }
}

impl LoweringOptions {
    /// These options with the environment's overrides applied: `RLX_FUSION=0/1`,
    /// `RLX_CAUSAL_SKIP=0/1`, `RLX_PARAM_PANELS=0`.
    pub fn with_env(self) -> Self {
        let causal_skip = rlx_ir::env::switch(rlx_ir::env::CAUSAL_SKIP).unwrap_or(self.causal_skip);
        let param_panels = if rlx_ir::env::is_off(rlx_ir::env::PARAM_PANELS) {
            0
        } else {
            self.param_panels
        };
        LoweringOptions {
            fusion: self.fusion.with_env(),
            causal_skip,
            param_panels,
            ..self
        }
    }
}

/// Which part of a product `C = A B` (over the last two axes) can be skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Skip {
    /// A is zero for depth `p > i + off`: row `i` of C sums depths `p <= i + off`.
    RowMax(isize),
    /// A is zero for `p < i - off`: row `i` sums depths `p >= i - off`.
    RowMin(isize),
    /// B is zero for `p < j - off`: column `j` sums depths `p >= j - off`.
    ColMin(isize),
    /// No operand has zeros, but no reader needs C where column `j > i + off`; writing zeros
    /// there instead gives the same results.
    Unneeded(isize),
}

/// A param update computed in place: graph output `output` is written straight into param
/// `param`'s storage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Donation {
    /// The output index.
    pub output: usize,
    /// The param's name.
    pub param: String,
}

/// The side tables a backend reads while lowering the graph [`prepare`] returned. Node ids are
/// that graph's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoweringPlan {
    /// Products that may skip part of their work.
    pub skips: BTreeMap<u32, Skip>,
    /// Products to store in the order of their one transposing reader: the reader's `perm`.
    pub permuted_stores: BTreeMap<u32, Vec<usize>>,
    /// Param updates computed in place.
    pub donations: Vec<Donation>,
    /// Params stored in column panels: param node → panel width (see [`panel_params`]).
    pub panel_params: BTreeMap<u32, usize>,
    /// What fusion did.
    pub fusion: FusionReport,
    /// The plans of the graphs a node carries (a control-flow op's branches or bodies, in the
    /// order of `OpDef::graphs`), by node: the session takes those graphs through the same
    /// pipeline as this one when the backend runs the op natively, and a backend lowers each
    /// with its plan here.
    #[serde(default)]
    pub nested: BTreeMap<u32, Vec<LoweringPlan>>,
}

impl LoweringPlan {
    /// The skip of node `id`, if any.
    pub fn skip(&self, id: NodeId) -> Option<Skip> {
        self.skips.get(&id.0).copied()
    }

    /// The permutation node `id` should be stored in, if any.
    pub fn permuted_store(&self, id: NodeId) -> Option<&[usize]> {
        self.permuted_stores.get(&id.0).map(Vec::as_slice)
    }

    /// The plan of graph `index` (in `OpDef::graphs` order) that node `id` carries, if the
    /// session planned it.
    pub fn nested(&self, id: NodeId, index: usize) -> Option<&LoweringPlan> {
        self.nested.get(&id.0)?.get(index)
    }

    /// The panel width param `id` is stored in, if it is stored in column panels.
    pub fn panels(&self, id: NodeId) -> Option<usize> {
        self.panel_params.get(&id.0).copied()
    }

    /// Check that the plan can belong to `g` (the graph [`prepare`] returned with it): every
    /// entry names a node of `g` of the kind it applies to, skip offsets lie within the
    /// product's dims, permutations permute the node's axes, panel widths divide the param's
    /// columns and donations name an output and a param of `g`. A plan read from outside (a
    /// compile-cache entry) passes this before a backend lowers with it; a plan that fails it
    /// would make kernels compute wrong values or address the wrong bytes.
    pub fn check(&self, g: &Graph) -> Result<()> {
        let node = |id: u32, what: &str| {
            if (id as usize) < g.len() {
                Ok(g.node(NodeId(id)))
            } else {
                Err(Error::Invalid(format!(
                    "lowering plan: {what} names node %{id}, but the graph has {} nodes",
                    g.len()
                )))
            }
        };
        let dims = |id: u32| g.node(NodeId(id)).shape.static_dims().unwrap_or_default();
        for (&id, skip) in &self.skips {
            let n = node(id, "a skip")?;
            let bound = n
                .inputs
                .iter()
                .flat_map(|&i| dims(i.0))
                .chain(dims(id))
                .max()
                .unwrap_or(0);
            let (Skip::RowMax(off) | Skip::RowMin(off) | Skip::ColMin(off) | Skip::Unneeded(off)) =
                *skip;
            if !matches!(n.op, Op::MatMul) || off.unsigned_abs() > bound {
                return Err(Error::Invalid(format!(
                    "lowering plan: skip {skip:?} at %{id} ({} {}) is not a skip of a product",
                    n.op.name(),
                    n.shape
                )));
            }
        }
        for (&id, perm) in &self.permuted_stores {
            let n = node(id, "a permuted store")?;
            let mut seen = vec![false; perm.len()];
            let permutes = perm.len() == n.shape.rank()
                && perm
                    .iter()
                    .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
            if !matches!(n.op, Op::MatMul | Op::Attention { .. }) || !permutes {
                return Err(Error::Invalid(format!(
                    "lowering plan: permuted store {perm:?} at %{id} ({} {}) does not permute \
                     the axes of a product or attention",
                    n.op.name(),
                    n.shape
                )));
            }
        }
        for (&id, &width) in &self.panel_params {
            let n = node(id, "a param in panels")?;
            let d = dims(id);
            if !matches!(n.op, Op::Param { .. }) || d.len() != 2 || width == 0 || d[1] % width != 0
            {
                return Err(Error::Invalid(format!(
                    "lowering plan: panels of {width} columns at %{id} ({} {}) do not fit a \
                     2-D param",
                    n.op.name(),
                    n.shape
                )));
            }
        }
        for d in &self.donations {
            let is_param =
                |n: &rlx_ir::Node| matches!(&n.op, Op::Param { name } if *name == d.param);
            if d.output >= g.outputs().len() || !g.nodes().iter().any(is_param) {
                return Err(Error::Invalid(format!(
                    "lowering plan: donation of output {} to param \"{}\" names no output or \
                     param of the graph ({} outputs)",
                    d.output,
                    d.param,
                    g.outputs().len()
                )));
            }
        }
        for (&id, plans) in &self.nested {
            let n = node(id, "a nested plan")?;
            let graphs = match &n.op {
                Op::Defined(d) => d.def().graphs(),
                _ => Vec::new(),
            };
            if graphs.len() != plans.len() {
                return Err(Error::Invalid(format!(
                    "lowering plan: {} nested plans at %{id} ({}), which carries {} graphs",
                    plans.len(),
                    n.op.name(),
                    graphs.len()
                )));
            }
            for ((_, body), plan) in graphs.iter().zip(plans) {
                plan.check(body)?;
            }
        }
        Ok(())
    }
}

/// Fuse `g` for a backend whose region kernels take the nodes `accepts` names (see
/// [`FuseElementwise::for_backend`]) and compute the side tables, for the param updates
/// `updates` (`(param name, output index)`).
pub fn prepare(
    g: &Graph,
    options: &LoweringOptions,
    accepts: Accepts<'_>,
    updates: &[(String, usize)],
) -> Result<(Graph, LoweringPlan)> {
    // Skips are found on the unfused graph (they read through elementwise chains) and follow
    // the products, which fusion never moves into a region.
    let skips = if options.causal_skip {
        causal_skips(g)
    } else {
        BTreeMap::new()
    };
    let (fused, fusion, map) = fuse(g, options.fusion, accepts)?;
    let (fused, fusion) = mark_optimizer_updates(fused, fusion, accepts, updates);
    let skips = skips
        .into_iter()
        .filter_map(|(id, s)| Some((map[id as usize]?, s)))
        .filter(|(id, _)| matches!(fused.node(*id).op, Op::MatMul))
        .map(|(id, s)| (id.0, s))
        .collect();
    let permuted_stores = if options.permuted_stores {
        permuted_stores(&fused)
    } else {
        BTreeMap::new()
    };
    let donations = if options.donate {
        donations(&fused, updates)
    } else {
        Vec::new()
    };
    let panel_params = panel_params(&fused, options.param_panels, updates);
    Ok((
        fused,
        LoweringPlan {
            skips,
            permuted_stores,
            donations,
            panel_params,
            fusion,
            nested: BTreeMap::new(),
        },
    ))
}

/// The params to store in column panels of `width` (0: none): 2-D bf16 params `[k, n]` with
/// `n` a multiple of `width`, read only as the right operand `B` of products (every reader a
/// `MatMul` taking the param itself as its second operand and not as its first), neither a
/// graph output nor updated by one (`updates`). Panel `t` holds columns `t·width ..
/// (t+1)·width` of every row, row-major: element `(r, c)` sits at `(c / width) · k · width +
/// r · width + c % width`. A GEMM reading B in place then streams each panel as one contiguous
/// run instead of a cache line per row a whole row apart (at batch 1 a sentence embedding's
/// products read 21 MB of bf16 weights this way). The layout is the backend's business: params
/// are still set and read row-major.
pub fn panel_params(g: &Graph, width: usize, updates: &[(String, usize)]) -> BTreeMap<u32, usize> {
    let mut out = BTreeMap::new();
    if width == 0 {
        return out;
    }
    let mut ok = vec![true; g.len()];
    let mut read = vec![false; g.len()];
    for &o in g.outputs() {
        ok[o.index()] = false;
    }
    for id in g.ids() {
        let n = g.node(id);
        for (pos, &i) in n.inputs.iter().enumerate() {
            read[i.index()] = true;
            ok[i.index()] &= matches!(n.op, Op::MatMul) && pos == 1 && n.inputs[0] != i;
        }
    }
    for id in g.ids() {
        let n = g.node(id);
        let Op::Param { name } = &n.op else { continue };
        let dims = n.shape.static_dims();
        let fits = n.shape.dtype() == DType::BF16
            && dims
                .as_deref()
                .is_some_and(|d| d.len() == 2 && d[0] > 0 && d[1] > 0 && d[1] % width == 0);
        if fits && ok[id.index()] && read[id.index()] && !updates.iter().any(|(p, _)| p == name) {
            out.insert(id.0, width);
        }
    }
    out
}

/// Pattern fusion, then elementwise fusion, with one report over both (region members are
/// nodes of `g`, fused nodes those of the result) and where each node of `g` went.
pub fn fuse(
    g: &Graph,
    options: FusionOptions,
    accepts: Accepts<'_>,
) -> Result<(Graph, FusionReport, Vec<Option<NodeId>>)> {
    let (g1, r1, map1) = FusePatterns::new(options, Some(accepts)).fuse_mapped(g)?;
    let (g2, r2, map2) = FuseElementwise::for_backend(options, accepts).fuse_mapped(&g1)?;
    // Nodes of `g1` outside pattern regions stand for the node of `g` they were copied from.
    let mut back: Vec<Option<u32>> = vec![None; g1.len()];
    let in_pattern: std::collections::BTreeSet<u32> = r1
        .regions
        .iter()
        .flat_map(|r| r.nodes.iter().copied())
        .collect();
    for (i, m) in map1.iter().enumerate() {
        if let (Some(m), false) = (m, in_pattern.contains(&(i as u32))) {
            back[m.index()] = Some(i as u32);
        }
    }
    let orig = |x: u32| back[x as usize].unwrap_or(x);
    let mut report = FusionReport {
        ops_before: r1.ops_before,
        ops_after: r2.ops_after.clone(),
        ..Default::default()
    };
    for mut r in r1.regions {
        r.fused_node = map2[r.fused_node as usize].expect("fused nodes are kept").0;
        report.regions.push(r);
    }
    let offset = report.regions.len();
    for mut r in r2.regions {
        r.nodes = r.nodes.into_iter().map(orig).collect();
        r.stored = r.stored.into_iter().map(orig).collect();
        report.regions.push(r);
    }
    for mut c in r2.candidates {
        c.node = orig(c.node);
        c.region = c.region.map(|k| k + offset);
        report.candidates.push(c);
    }
    report.regions.sort_by_key(|r| r.fused_node);
    let map = map1
        .into_iter()
        .map(|m| m.and_then(|m| map2[m.index()]))
        .collect();
    Ok((g2, report, map))
}

/// Elementwise regions computing a param's new value (an output bound to a param by `updates`)
/// become [`FusionKind::Optimizer`] regions where the backend takes them (asked with the
/// region's first node): the backend may run them with its optimizer kernels.
fn mark_optimizer_updates(
    g: Graph,
    mut report: FusionReport,
    accepts: Accepts<'_>,
    updates: &[(String, usize)],
) -> (Graph, FusionReport) {
    let updated: Vec<NodeId> = updates
        .iter()
        .filter_map(|(_, o)| g.outputs().get(*o).copied())
        .collect();
    let mut relabel: Vec<u32> = Vec::new();
    for r in report.regions.iter_mut() {
        let results = r.fused_node..r.fused_node + 1 + r.stored.len() as u32;
        if r.kind == FusionKind::Elementwise
            && updated.iter().any(|u| results.contains(&u.0))
            && accepts(&g, NodeId(r.fused_node), FusionKind::Optimizer)
        {
            r.kind = FusionKind::Optimizer;
            relabel.extend(results);
        }
    }
    if relabel.is_empty() {
        return (g, report);
    }
    let mut out = Graph::new(g.name());
    for id in g.ids() {
        let n = g.node(id);
        let op = match &n.op {
            Op::Fused(r) if relabel.contains(&id.0) => Op::Fused(rlx_ir::FusedRegion {
                kind: FusionKind::Optimizer,
                ..r.clone()
            }),
            op => op.clone(),
        };
        out.push_unchecked(op, n.inputs.clone(), n.shape.clone());
    }
    out.set_outputs_unchecked(g.outputs().to_vec());
    report.ops_after = crate::fusion::op_counts(&out);
    (out, report)
}

/// The last two dims of a node's shape.
fn tail(g: &Graph, id: NodeId) -> Option<(usize, usize)> {
    let d = g.shape(id).static_dims()?;
    (d.len() >= 2).then(|| (d[d.len() - 2], d[d.len() - 1]))
}

/// For a constant `[t, u]` f32 mask that is -inf exactly at columns past `row + off` and
/// finite elsewhere (causal attention's), `Some(off)`.
fn mask_offset(g: &Graph, id: NodeId) -> Option<isize> {
    let n = g.node(id);
    let Op::Constant { data } = &n.op else {
        return None;
    };
    let d = n.shape.static_dims()?;
    if n.shape.dtype() != DType::F32 || d.len() != 2 || d[0] == 0 || d[1] == 0 {
        return None;
    }
    let v = |i: usize, j: usize| {
        let at = (i * d[1] + j) * 4;
        f32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
    };
    let first = (0..d[1])
        .find(|&j| v(0, j) == f32::NEG_INFINITY)
        .unwrap_or(d[1]);
    let off = first as isize - 1;
    let ok = (0..d[0]).all(|i| {
        (0..d[1]).all(|j| {
            if j as isize > i as isize + off {
                v(i, j) == f32::NEG_INFINITY
            } else {
                v(i, j).is_finite()
            }
        })
    });
    ok.then_some(off)
}

/// For each node, `Some(off)` when its value is zero wherever (in its last two axes) the
/// column is past the row by more than `off`: causal attention's probabilities (a softmax of
/// scores plus a constant mask that is -inf exactly there) and what multiplies them (the
/// softmax's gradient). Assumes the scores are finite (as attention kernels that skip the
/// masked part do).
fn causal_zeros(g: &Graph) -> Vec<Option<isize>> {
    let mut z: Vec<Option<isize>> = vec![None; g.len()];
    for id in g.ids() {
        let n = g.node(id);
        z[id.index()] = match &n.op {
            Op::Softmax { axis } if *axis + 1 == n.shape.rank() => {
                let x = g.node(n.inputs[0]);
                match (&x.op, tail(g, n.inputs[0])) {
                    (Op::Binary(BinaryOp::Add), Some(t)) => x.inputs.iter().find_map(|&c| {
                        mask_offset(g, c)
                            .filter(|_| g.shape(c).static_dims().is_some_and(|d| (d[0], d[1]) == t))
                    }),
                    _ => None,
                }
            }
            Op::Binary(BinaryOp::Mul) => {
                let t = tail(g, id);
                n.inputs
                    .iter()
                    .find_map(|&a| z[a.index()].filter(|_| tail(g, a) == t))
            }
            _ => None,
        };
    }
    z
}

/// For each node, `Some(off)` when no reader needs its elements (in the last two axes) whose
/// column is past the row by more than `off`: each reader adds causal attention's -inf mask
/// there (`scores + mask`), multiplies by a value that is zero there (see [`causal_zeros`]), or
/// is elementwise with such a value of its own (the scale before the mask, the `dP - s` of the
/// softmax gradient before its product with the probabilities).
fn causal_unneeded(g: &Graph, zeros: &[Option<isize>]) -> Vec<Option<isize>> {
    let mut users: Vec<Vec<NodeId>> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for &i in &g.node(id).inputs {
            users[i.index()].push(id);
        }
    }
    let ids: Vec<NodeId> = g.ids().collect();
    let mut unneeded: Vec<Option<isize>> = vec![None; g.len()];
    for &id in ids.iter().rev() {
        let t = tail(g, id);
        if t.is_none()
            || users[id.index()].is_empty()
            || g.outputs().contains(&id)
            || g.shape(id).dtype() != DType::F32
        {
            continue;
        }
        // The region every reader ignores is the intersection of theirs (the largest offset).
        let reader = |u: NodeId| -> Option<isize> {
            let n = g.node(u);
            let other = n.inputs.iter().copied().find(|&i| i != id);
            let own = unneeded[u.index()].filter(|_| tail(g, u) == t);
            match &n.op {
                Op::Binary(BinaryOp::Add) => other
                    .and_then(|c| mask_offset(g, c))
                    .filter(|_| other.and_then(|c| tail(g, c)) == t)
                    .or(own),
                Op::Binary(BinaryOp::Mul) => other
                    .and_then(|y| zeros[y.index()].filter(|_| tail(g, y) == t))
                    .or(own),
                Op::Binary(_) | Op::Activation(_) => own,
                _ => None,
            }
        };
        unneeded[id.index()] = users[id.index()]
            .iter()
            .try_fold(None, |acc: Option<isize>, &u| {
                let o = reader(u)?;
                Some(Some(acc.map_or(o, |a| a.max(o))))
            })
            .flatten();
    }
    unneeded
}

/// The f32 products of `g` that may skip work, from `causal_zeros` of their operands, or
/// else tiles of their result, from `causal_unneeded` (node index → skip).
pub fn causal_skips(g: &Graph) -> BTreeMap<u32, Skip> {
    let z = causal_zeros(g);
    let unneeded = causal_unneeded(g, &z);
    let mut out = BTreeMap::new();
    for id in g.ids() {
        let n = g.node(id);
        if !matches!(n.op, Op::MatMul) || n.shape.dtype() != DType::F32 {
            continue;
        }
        let (a, b) = (n.inputs[0], n.inputs[1]);
        let an = g.node(a);
        let swapped = match &an.op {
            Op::Transpose { perm } => {
                let r = perm.len();
                let swaps_last = r >= 2
                    && perm[r - 1] == r - 2
                    && perm[r - 2] == r - 1
                    && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p);
                z[an.inputs[0].index()].filter(|_| swaps_last)
            }
            _ => None,
        };
        let skip = z[a.index()]
            .map(Skip::RowMax)
            .or(swapped.map(Skip::RowMin))
            .or(z[b.index()].map(Skip::ColMin))
            .or(unneeded[id.index()].map(Skip::Unneeded));
        if let Some(s) = skip {
            out.insert(id.0, s);
        }
    }
    out
}

/// The f32 products and the attentions (any dtype) of `g` that are no graph output and whose
/// one reader is a transpose of rank 3 or more keeping the last axis: node index → that
/// transpose's `perm`. Stored in that order, the transpose is a dense view and a reshape after
/// it needs no copy (attention's head merge `[b, h, t, d] -> [b, t, h, d]`).
pub fn permuted_stores(g: &Graph) -> BTreeMap<u32, Vec<usize>> {
    let mut readers: Vec<Vec<NodeId>> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for &i in &g.node(id).inputs {
            readers[i.index()].push(id);
        }
    }
    let mut out = BTreeMap::new();
    for id in g.ids() {
        let n = g.node(id);
        let stores = match n.op {
            Op::MatMul => n.shape.dtype() == DType::F32,
            Op::Attention { .. } => true,
            _ => false,
        };
        if !stores || g.outputs().contains(&id) {
            continue;
        }
        let [u] = readers[id.index()].as_slice() else {
            continue;
        };
        let Op::Transpose { perm } = &g.node(*u).op else {
            continue;
        };
        let r = n.shape.rank();
        if perm.len() == r && r >= 3 && perm[r - 1] == r - 1 {
            out.insert(id.0, perm.clone());
        }
    }
    out
}

/// Whether a node's value may share storage with its first operand (a view, or an in-place
/// cache write).
fn aliases_operand(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Narrow { .. }
            | Op::Expand { .. }
            | Op::CacheWrite
    )
}

/// The updates of `updates` (`(param name, output index)`) that may be computed in place: an
/// output computed by an elementwise region (whose kernel reads each operand element before
/// writing that element of the result) such that every node reading the param (or a view of
/// it) runs no later than the region, which itself reads the param directly, at the output's
/// shape. The backend then writes the output into the param's storage.
pub fn donations(g: &Graph, updates: &[(String, usize)]) -> Vec<Donation> {
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for &i in &g.node(id).inputs {
            readers[i.index()].push(id.index());
        }
    }
    let mut out: Vec<Donation> = Vec::new();
    let mut used_outputs: Vec<usize> = Vec::new();
    for (name, o) in updates {
        let Some(&v) = g.outputs().get(*o) else {
            continue;
        };
        let Some(p) = g
            .ids()
            .find(|&i| matches!(&g.node(i).op, Op::Param { name: n } if n == name))
        else {
            continue;
        };
        let Op::Fused(r) = &g.node(v).op else {
            continue;
        };
        if !matches!(r.kind, FusionKind::Elementwise | FusionKind::Optimizer)
            || g.shape(p) != g.shape(v)
            || out.iter().any(|d| d.param == *name)
            || used_outputs.contains(&v.index())
        {
            continue;
        }
        // The region's step: its first result's node and its further results.
        let Some(head) = g.fused_head(v).map(NodeId::index) else {
            continue;
        };
        let same_region = |i: usize| {
            i == head
                || g.fused_results(NodeId(head as u32))
                    .iter()
                    .any(|&(_, s)| s.index() == i)
        };
        if g.outputs().iter().filter(|&&x| x == v).count() != 1 {
            continue;
        }
        // The param and every view of it.
        let mut alias = vec![p.index()];
        let mut k = 0;
        while k < alias.len() {
            for &u in &readers[alias[k]] {
                if aliases_operand(&g.node(NodeId(u as u32)).op)
                    && g.node(NodeId(u as u32)).inputs[0].index() == alias[k]
                    && !alias.contains(&u)
                {
                    alias.push(u);
                }
            }
            k += 1;
        }
        let ok = !g.outputs().iter().any(|x| alias.contains(&x.index()))
            && alias.iter().all(|&a| {
                readers[a]
                    .iter()
                    .all(|&u| alias.contains(&u) || u < head || (same_region(u) && a == p.index()))
            });
        if ok {
            out.push(Donation {
                output: *o,
                param: name.clone(),
            });
            used_outputs.push(v.index());
        }
    }
    out
}
