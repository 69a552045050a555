//! Fusion as IR: a pass that groups chains of elementwise ops into [`Op::Fused`] regions whose
//! body is the chain itself, and a [`FusionReport`] saying what it did and why it left the rest.
//!
//! A region is formed from its last node (the root) backwards (see [`FuseElementwise`]); its
//! members compute over the same iteration space (their own operands may broadcast), and the
//! members other nodes read are stored beside the root as further results of the region. A
//! backend says which nodes its region kernels take; the generic pass takes every elementwise,
//! broadcast and cast node. Regions of one op stay as they are.
//!
//! A backend that has a kernel for the elementwise kind runs each region as one step (the body
//! is the program of that kernel; a GPU backend generates one shader per region); any other
//! inlines the body (`Decompose`), getting back the graph it would have had.

use crate::Pass;
use rlx_ir::{FusedRegion, FusionKind, Graph, NodeId, Op, ReduceKind, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Which fusions run. Defaults: all on; `RLX_FUSION=0` turns them off when applied with
/// [`FusionOptions::with_env`] (the environment only overrides what the caller chose).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusionOptions {
    /// Form elementwise and multiply-reduce regions.
    pub elementwise: bool,
    /// Form the regions of known shapes: attention, gated MLP, residual norm, matmul epilogue
    /// (see [`crate::patterns`]).
    pub patterns: bool,
    /// Largest number of ops in one region.
    pub max_region_ops: usize,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions {
            elementwise: true,
            patterns: true,
            max_region_ops: 64,
        }
    }
}

impl FusionOptions {
    /// These options with `RLX_FUSION=0` (all off) or `RLX_FUSION=1` (all on) applied, then
    /// `RLX_FUSE_PATTERNS=0` (no pattern regions).
    pub fn with_env(self) -> Self {
        let o = self.with_fusion_env();
        FusionOptions {
            patterns: o.patterns && !rlx_ir::env::is_off(rlx_ir::env::FUSE_PATTERNS),
            ..o
        }
    }

    fn with_fusion_env(self) -> Self {
        match rlx_ir::env::switch(rlx_ir::env::FUSION) {
            Some(false) => FusionOptions {
                elementwise: false,
                patterns: false,
                ..self
            },
            Some(true) => FusionOptions {
                elementwise: true,
                patterns: true,
                ..self
            },
            None => self,
        }
    }
}

/// Why a node was not fused into its user's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MissReason {
    /// The op is not one the backend's kernel for the kind takes (for the generic pass: not
    /// elementwise, broadcast or cast).
    NotElementwise,
    /// A reader outside the region runs before the region's root (the value would be needed
    /// before the region computes it).
    ReadEarly,
    /// The value is a graph output, and the region ends in a row reduction (whose one result
    /// is the reduced value).
    GraphOutput,
    /// The node computes over other dims than its user (a broadcast or a reduction between).
    OtherDims,
    /// It reads a value that a `CacheWrite` updates in place (members run at the root's
    /// position, after the write).
    ReadsWrittenState,
    /// No reader is in a region.
    UserNotFused,
    /// The region reached [`FusionOptions::max_region_ops`].
    RegionFull,
    /// The fusion is switched off.
    Disabled,
    /// No neighbour could join: a region of one op is left as it is.
    Alone,
}

impl MissReason {
    /// What one could do about it.
    pub fn hint(self) -> &'static str {
        match self {
            MissReason::NotElementwise => "only elementwise ops the backend's region kernel takes join elementwise regions; matmul epilogues and norms are other fused kinds",
            MissReason::ReadEarly => "reorder so that the value's other readers run after the region",
            MissReason::GraphOutput => "a region ending in a reduction has one result; the output is computed on its own",
            MissReason::OtherDims => "fusing across a broadcast or reduction needs a multiply-reduce or broadcast-aware region",
            MissReason::ReadsWrittenState => "a value updated in place by a cache write is read where it is, not fused",
            MissReason::UserNotFused => "its readers start no region",
            MissReason::RegionFull => "raise FusionOptions::max_region_ops",
            MissReason::Disabled => "RLX_FUSION=0 or FusionOptions switched it off",
            MissReason::Alone => "nothing to fuse with",
        }
    }
}

/// What the pass decided for one candidate node (of the input graph).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// The node in the input graph.
    pub node: u32,
    /// Its op.
    pub op: String,
    /// The region it joined (an index into [`FusionReport::regions`]), if any.
    pub region: Option<usize>,
    /// Why not, when it joined none.
    pub miss: Option<MissReason>,
}

/// One region formed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// Its kind.
    pub kind: FusionKind,
    /// Its members (nodes of the input graph), the root last.
    pub nodes: Vec<u32>,
    /// Members other than the root that the region also stores, because a graph output or a
    /// node outside the region reads them (the region's results 1, 2, ...).
    pub stored: Vec<u32>,
    /// Its fused node in the output graph (result 0; result `k` is the node `fused_node + k`).
    pub fused_node: u32,
}

/// What a fusion pass did: ops per kind before and after, the regions, and a decision for every
/// candidate (XLA's `FusionDecision`: fused, or a reason and a hint).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusionReport {
    /// Op name → count in the input graph.
    pub ops_before: BTreeMap<String, usize>,
    /// Op name → count in the output graph (`fused:<kind>` for regions).
    pub ops_after: BTreeMap<String, usize>,
    /// The regions formed.
    pub regions: Vec<Region>,
    /// Every elementwise node and every producer of one, with its decision.
    pub candidates: Vec<Candidate>,
}

impl FusionReport {
    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports serialize")
    }
}

impl fmt::Display for FusionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = |m: &BTreeMap<String, usize>| m.values().sum::<usize>();
        writeln!(
            f,
            "fusion: {} ops -> {} ops, {} regions",
            total(&self.ops_before),
            total(&self.ops_after),
            self.regions.len()
        )?;
        for (i, r) in self.regions.iter().enumerate() {
            let nodes: Vec<String> = r.nodes.iter().map(|n| format!("%{n}")).collect();
            writeln!(
                f,
                "  region {i} ({}): {} -> fused %{}",
                r.kind.name(),
                nodes.join(" "),
                r.fused_node
            )?;
        }
        for c in self.candidates.iter().filter(|c| c.region.is_none()) {
            if let Some(m) = c.miss {
                writeln!(f, "  %{} {}: not fused, {m:?} ({})", c.node, c.op, m.hint())?;
            }
        }
        Ok(())
    }
}

pub(crate) fn op_counts(g: &Graph) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for n in g.nodes() {
        let name = match &n.op {
            Op::Fused(r) => format!("fused:{}", r.kind.name()),
            op => op.name().to_string(),
        };
        *m.entry(name).or_default() += 1;
    }
    m
}

/// Whether `op` may join an elementwise region of the generic pass (no backend given).
pub fn elementwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Binary(_)
            | Op::Compare(_)
            | Op::Where
            | Op::Activation(_)
            | Op::Cast { .. }
            | Op::Expand { .. }
    )
}

/// Which nodes may join (or, for [`FusionKind::MultiplyReduce`], end) a region a backend
/// lowers natively: `(graph, node, kind)`.
pub type Accepts<'a> = &'a (dyn Fn(&Graph, NodeId, FusionKind) -> bool + 'a);

/// The elementwise fusion pass. It forms elementwise regions and, where the backend takes a
/// row reduction as a region's root, multiply-reduce regions (the `x * y` summed by a softmax
/// or norm backward pass, computed row by row and never stored).
///
/// Regions are formed from the outputs back: a node joins the earliest region of one of its
/// readers such that every reader outside that region runs after the region's root, it has
/// the region's dims, and it reads nothing a `CacheWrite` updates in place. Members that a graph
/// output or a node outside the region reads are stored as extra results. Operands of members
/// come from before the root and stored values are read only after it, so the regions form no
/// cycles with the rest of the graph.
pub struct FuseElementwise<'a> {
    /// Options.
    pub options: FusionOptions,
    /// The backend's kernels: which nodes they take. `None`: every node [`elementwise`] names
    /// joins elementwise regions, and no multiply-reduce regions are formed.
    pub accepts: Option<Accepts<'a>>,
}

impl FuseElementwise<'_> {
    /// The generic pass with `options`.
    pub fn new(options: FusionOptions) -> FuseElementwise<'static> {
        FuseElementwise {
            options,
            accepts: None,
        }
    }
}

impl<'a> FuseElementwise<'a> {
    /// The pass for a backend whose region kernels take the nodes `accepts` names.
    pub fn for_backend(options: FusionOptions, accepts: Accepts<'a>) -> FuseElementwise<'a> {
        FuseElementwise {
            options,
            accepts: Some(accepts),
        }
    }

    /// Whether node `id` may join (for a multiply-reduce region: end) a region of `kind`: an
    /// elementwise, broadcast or cast op (a Sum or Mean reduction) that the backend takes.
    fn takes(&self, g: &Graph, id: NodeId, kind: FusionKind) -> bool {
        let op = &g.node(id).op;
        let shape_ok = match kind {
            FusionKind::Elementwise => elementwise(op),
            FusionKind::MultiplyReduce => matches!(
                op,
                Op::Reduce {
                    kind: ReduceKind::Sum | ReduceKind::Mean,
                    ..
                }
            ),
            _ => false,
        };
        shape_ok
            && self.accepts.is_none_or(|f| f(g, id, kind))
            && (self.accepts.is_some() || kind == FusionKind::Elementwise)
    }

    /// Fuse `g`, returning the new graph and the report.
    pub fn fuse(&self, g: &Graph) -> Result<(Graph, FusionReport)> {
        self.fuse_mapped(g).map(|(out, report, _)| (out, report))
    }

    /// [`FuseElementwise::fuse`], also returning where each node of `g` went: its node in the
    /// new graph (for a member of a region: the region's node giving its value, when stored),
    /// or `None` for members computed only inside a region.
    pub fn fuse_mapped(&self, g: &Graph) -> Result<(Graph, FusionReport, Vec<Option<NodeId>>)> {
        let n = g.len();
        let Uses {
            readers,
            written,
            is_output,
        } = Uses::of(g);
        let nid = |i: usize| NodeId(i as u32);
        // Root of each node's region (None: in none), from the outputs back.
        let mut root: Vec<Option<usize>> = vec![None; n];
        let mut reduce = vec![false; n];
        let mut size: Vec<usize> = vec![0; n];
        let mut miss: Vec<Option<MissReason>> = vec![None; n];
        // The dims a region computes over: its root's, or a reduction's operand's.
        let region_dims = |r: usize, reduce: &[bool]| {
            let d = if reduce[r] {
                g.node(nid(r)).inputs[0]
            } else {
                nid(r)
            };
            g.shape(d).dims().to_vec()
        };
        for i in (0..n).rev() {
            let id = nid(i);
            if self.options.elementwise && self.takes(g, id, FusionKind::MultiplyReduce) {
                root[i] = Some(i);
                reduce[i] = true;
                continue;
            }
            if !self.takes(g, id, FusionKind::Elementwise) {
                continue;
            }
            if !self.options.elementwise {
                miss[i] = Some(MissReason::Disabled);
                continue;
            }
            let mut candidates: Vec<usize> = readers[i].iter().filter_map(|&u| root[u]).collect();
            candidates.sort_unstable();
            candidates.dedup();
            let mut why = if candidates.is_empty() {
                MissReason::UserNotFused
            } else {
                MissReason::ReadEarly
            };
            let reads_written = g.node(id).inputs.iter().any(|x| written[x.index()]);
            let joined = candidates.into_iter().find(|&r| {
                let verdict = if reads_written {
                    Err(MissReason::ReadsWrittenState)
                } else if !readers[i]
                    .iter()
                    .all(|&u| root[u] == Some(r) || (u > r && !reduce[r]))
                {
                    Err(MissReason::ReadEarly)
                } else if g.shape(id).dims() != region_dims(r, &reduce).as_slice() {
                    Err(MissReason::OtherDims)
                } else if reduce[r] && is_output[i] {
                    Err(MissReason::GraphOutput)
                } else if size[r] >= self.options.max_region_ops {
                    Err(MissReason::RegionFull)
                } else {
                    Ok(())
                };
                if let Err(m) = verdict {
                    why = m;
                }
                verdict.is_ok()
            });
            match joined {
                Some(r) => {
                    root[i] = Some(r);
                    size[r] += 1;
                }
                None => {
                    root[i] = Some(i);
                    size[i] = 1;
                    miss[i] = Some(why);
                }
            }
        }
        // Producers of region members that could not join are candidates too.
        for i in 0..n {
            if root[i].is_none()
                && miss[i].is_none()
                && readers[i].iter().any(|&u| root[u].is_some())
                && !g.node(nid(i)).op.is_leaf()
            {
                miss[i] = Some(MissReason::NotElementwise);
            }
        }
        let mut members: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, r) in root.iter().enumerate() {
            if let Some(r) = *r {
                members.entry(r).or_default().push(i);
            }
        }
        members.retain(|&r, m| {
            if m.len() == 1 && miss[r].is_none() && !reduce[r] {
                miss[r] = Some(MissReason::Alone);
            }
            m.len() > 1
        });

        let regions: Vec<(FusionKind, Vec<usize>)> = members
            .into_iter()
            .map(|(r, m)| {
                let kind = if reduce[r] {
                    FusionKind::MultiplyReduce
                } else {
                    FusionKind::Elementwise
                };
                (kind, m)
            })
            .collect();
        let (out, mut report, map) = emit(g, &regions)?;
        let mut region_of: Vec<Option<usize>> = vec![None; n];
        for (k, r) in report.regions.iter().enumerate() {
            for &j in &r.nodes {
                region_of[j as usize] = Some(k);
            }
        }
        for (i, (region, miss)) in region_of.into_iter().zip(miss).enumerate() {
            if region.is_some() || miss.is_some() {
                report.candidates.push(Candidate {
                    node: i as u32,
                    op: g.node(nid(i)).op.name().to_string(),
                    region,
                    miss: if region.is_some() { None } else { miss },
                });
            }
        }
        Ok((out, report, map))
    }
}

/// Who reads each node, which nodes a `CacheWrite` updates in place, which are graph outputs.
pub(crate) struct Uses {
    pub readers: Vec<Vec<usize>>,
    pub written: Vec<bool>,
    pub is_output: Vec<bool>,
}

impl Uses {
    pub fn of(g: &Graph) -> Uses {
        let n = g.len();
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut written = vec![false; n];
        for id in g.ids() {
            let node = g.node(id);
            for i in &node.inputs {
                readers[i.index()].push(id.index());
            }
            if matches!(node.op, Op::CacheWrite) {
                written[node.inputs[0].index()] = true;
            }
        }
        let is_output = (0..n)
            .map(|i| g.outputs().iter().any(|o| o.index() == i))
            .collect();
        Uses {
            readers,
            written,
            is_output,
        }
    }
}

/// The graph with each of `regions` (a kind and its members, node indices of `g` in order, the
/// root last) made one fused region at its root's position, the report of the regions (no
/// candidates), and where each node of `g` went (see [`FuseElementwise::fuse_mapped`]).
///
/// Each region must be sound: every reader of a member other than the root is a member or runs
/// after the root (such members are stored as further results, as are graph outputs).
pub(crate) fn emit(
    g: &Graph,
    regions: &[(FusionKind, Vec<usize>)],
) -> Result<(Graph, FusionReport, Vec<Option<NodeId>>)> {
    let n = g.len();
    let nid = |i: usize| NodeId(i as u32);
    let Uses {
        readers, is_output, ..
    } = Uses::of(g);
    // Region of each member, and the region a root ends.
    let mut region_of: Vec<Option<usize>> = vec![None; n];
    let mut ends: Vec<Option<usize>> = vec![None; n];
    for (k, (_, m)) in regions.iter().enumerate() {
        for &j in m {
            region_of[j] = Some(k);
        }
        ends[*m.last().expect("a region has members")] = Some(k);
    }
    let mut out = Graph::new(g.name());
    let mut map: Vec<Option<NodeId>> = vec![None; n];
    let mut report = FusionReport {
        ops_before: op_counts(g),
        ..Default::default()
    };
    for id in g.ids() {
        let i = id.index();
        let node = g.node(id);
        if let Some(k) = ends[i] {
            let (kind, m) = (regions[k].0, &regions[k].1);
            let stored: Vec<usize> = m[..m.len() - 1]
                .iter()
                .copied()
                .filter(|&j| is_output[j] || readers[j].iter().any(|&u| region_of[u] != Some(k)))
                .collect();
            let results: Vec<usize> = std::iter::once(i).chain(stored.iter().copied()).collect();
            let name = format!("{}.region{}", g.name(), report.regions.len());
            let (body, ext) = region_body(g, m, &results, &name)?;
            let ins: Vec<NodeId> = ext
                .iter()
                .map(|&e| map[e].expect("operands of a region are computed before its root"))
                .collect();
            let body = Box::new(body);
            // Several results: their nodes share an id.
            let region = (results.len() > 1).then_some(report.regions.len() as u32);
            let mut first = None;
            for (r, &j) in results.iter().enumerate() {
                let f = out.push_unchecked(
                    Op::Fused(FusedRegion {
                        kind,
                        body: body.clone(),
                        output: r,
                        region,
                    }),
                    ins.clone(),
                    g.shape(nid(j)).clone(),
                );
                first.get_or_insert(f);
                map[j] = Some(f);
            }
            report.regions.push(Region {
                kind,
                nodes: m.iter().map(|&j| j as u32).collect(),
                stored: stored.iter().map(|&j| j as u32).collect(),
                fused_node: first.expect("a region has a result").0,
            });
        } else if region_of[i].is_none() {
            let ins = node
                .inputs
                .iter()
                .map(|x| map[x.index()].expect("operands are computed first"))
                .collect();
            map[i] = Some(out.push_unchecked(node.op.clone(), ins, node.shape.clone()));
        }
    }
    out.set_outputs_unchecked(
        g.outputs()
            .iter()
            .map(|o| map[o.index()].expect("outputs are stored"))
            .collect(),
    );
    report.ops_after = op_counts(&out);
    Ok((out, report, map))
}

/// The body of a region with `members` (node indices of `g`, the root last) returning the values
/// of `results`, and its external operands in first-use order (the body's inputs, in the same
/// order).
fn region_body(
    g: &Graph,
    members: &[usize],
    results: &[usize],
    name: &str,
) -> Result<(Graph, Vec<usize>)> {
    let mut body = Graph::new(name);
    let mut ext: Vec<usize> = Vec::new();
    let mut local: BTreeMap<usize, NodeId> = BTreeMap::new();
    for &m in members {
        for x in &g.node(NodeId(m as u32)).inputs {
            let x = x.index();
            if !members.contains(&x) && !ext.contains(&x) {
                ext.push(x);
                let arg = body.try_input(
                    &format!("in{}", ext.len() - 1),
                    g.shape(NodeId(x as u32)).clone(),
                )?;
                local.insert(x, arg);
            }
        }
        let n = g.node(NodeId(m as u32));
        let ins: Vec<NodeId> = n.inputs.iter().map(|x| local[&x.index()]).collect();
        local.insert(m, body.push_unchecked(n.op.clone(), ins, n.shape.clone()));
    }
    body.set_outputs(results.iter().map(|r| local[r]).collect());
    // Inputs come first in a body; members were appended as met, so rebuild in that order.
    Ok((inputs_first(&body), ext))
}

/// `body` with its inputs moved before every other node (same meaning, inputs in order).
fn inputs_first(body: &Graph) -> Graph {
    let mut out = Graph::new(body.name());
    let mut map = vec![NodeId(0); body.len()];
    let order = body
        .ids()
        .filter(|&i| matches!(body.node(i).op, Op::Input { .. }))
        .chain(
            body.ids()
                .filter(|&i| !matches!(body.node(i).op, Op::Input { .. })),
        );
    for id in order {
        let n = body.node(id);
        map[id.index()] = out.push_unchecked(
            n.op.clone(),
            n.inputs.iter().map(|x| map[x.index()]).collect(),
            n.shape.clone(),
        );
    }
    out.set_outputs_unchecked(body.outputs().iter().map(|o| map[o.index()]).collect());
    out
}

impl Pass for FuseElementwise<'_> {
    fn name(&self) -> &str {
        "fuse_elementwise"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        let (out, report) = self.fuse(g)?;
        Ok((out, report.regions.len()))
    }
}
