//! Fusion as IR: a pass that groups chains of elementwise ops into [`Op::Fused`] regions whose
//! body is the chain itself, and a [`FusionReport`] saying what it did and why it left the rest.
//!
//! A region is formed from its last node (the root) backwards: an elementwise, broadcast or cast
//! node joins the region of its user when that user is the node's only reader, the node is not a
//! graph output, and it has the region's dims (it computes over the same iteration space; its
//! own operands may broadcast). Every other reader would need the value stored, which a
//! single-result region cannot give. Members all run at the root's position, which is sound
//! because nothing outside the region reads them. Regions of one op stay as they are.
//!
//! A backend that has a kernel for the elementwise kind runs each region as one step (the body
//! is the program of that kernel; a GPU backend generates one shader per region); any other
//! inlines the body (`Decompose`), getting back the graph it would have had.

use crate::Pass;
use rlx_ir::{FusedRegion, FusionKind, Graph, NodeId, Op, Result, Shape};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// Which fusions run. Defaults: all on; `RLX_FUSION=0` turns them off when applied with
/// [`FusionOptions::with_env`] (the environment only overrides what the caller chose).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusionOptions {
    /// Form elementwise regions.
    pub elementwise: bool,
    /// Largest number of ops in one region.
    pub max_region_ops: usize,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions {
            elementwise: true,
            max_region_ops: 64,
        }
    }
}

impl FusionOptions {
    /// These options with `RLX_FUSION=0` (all off) or `RLX_FUSION=1` (all on) applied.
    pub fn with_env(self) -> Self {
        match std::env::var("RLX_FUSION").as_deref() {
            Ok("0") => FusionOptions {
                elementwise: false,
                ..self
            },
            Ok("1") => FusionOptions {
                elementwise: true,
                ..self
            },
            _ => self,
        }
    }
}

/// Why a node was not fused into its user's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum MissReason {
    /// The op is not elementwise, broadcast or cast.
    NotElementwise,
    /// More than one node reads the value (a single-result region could not give it to them).
    SeveralReaders,
    /// The value is a graph output.
    GraphOutput,
    /// The node computes over other dims than its user (a broadcast or a reduction between).
    OtherDims,
    /// The user is not in a region.
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
            MissReason::NotElementwise => "only elementwise, broadcast and cast ops join elementwise regions; matmul epilogues and norms are other fused kinds",
            MissReason::SeveralReaders => "multi-output regions (storing the value beside the result) are not formed yet",
            MissReason::GraphOutput => "an output must be stored; a multi-output region could still take it",
            MissReason::OtherDims => "fusing across a broadcast or reduction needs a multiply-reduce or broadcast-aware region",
            MissReason::UserNotFused => "its reader starts no region",
            MissReason::RegionFull => "raise FusionOptions::max_region_ops",
            MissReason::Disabled => "RLX_FUSION=0 or FusionOptions switched it off",
            MissReason::Alone => "nothing to fuse with",
        }
    }
}

/// What the pass decided for one candidate node (of the input graph).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Region {
    /// Its kind.
    pub kind: FusionKind,
    /// Its members (nodes of the input graph), the root last.
    pub nodes: Vec<u32>,
    /// Its fused node in the output graph.
    pub fused_node: u32,
}

/// What a fusion pass did: ops per kind before and after, the regions, and a decision for every
/// candidate (XLA's `FusionDecision`: fused, or a reason and a hint).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
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

fn op_counts(g: &Graph) -> BTreeMap<String, usize> {
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

/// Whether `op` may join an elementwise region.
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

/// The elementwise fusion pass.
pub struct FuseElementwise {
    /// Options.
    pub options: FusionOptions,
}

impl FuseElementwise {
    /// Fuse `g`, returning the new graph and the report.
    pub fn fuse(&self, g: &Graph) -> Result<(Graph, FusionReport)> {
        let n = g.len();
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
        for id in g.ids() {
            for i in &g.node(id).inputs {
                readers[i.index()].push(id.index());
            }
        }
        let is_output: Vec<bool> = (0..n)
            .map(|i| g.outputs().iter().any(|o| o.index() == i))
            .collect();
        // Root of each node's region (None: not elementwise), from the outputs back.
        let mut root: Vec<Option<usize>> = vec![None; n];
        let mut size: Vec<usize> = vec![0; n];
        let mut miss: Vec<Option<MissReason>> = vec![None; n];
        for i in (0..n).rev() {
            let op = &g.node(NodeId(i as u32)).op;
            if !elementwise(op) {
                continue;
            }
            if !self.options.elementwise {
                miss[i] = Some(MissReason::Disabled);
                continue;
            }
            let joined = match readers[i].as_slice() {
                _ if is_output[i] => Err(MissReason::GraphOutput),
                [u] => match root[*u] {
                    None => Err(MissReason::UserNotFused),
                    Some(r)
                        if g.shape(NodeId(i as u32)).dims() != g.shape(NodeId(r as u32)).dims() =>
                    {
                        Err(MissReason::OtherDims)
                    }
                    Some(r) if size[r] >= self.options.max_region_ops => {
                        Err(MissReason::RegionFull)
                    }
                    Some(r) => Ok(r),
                },
                [] => Err(MissReason::UserNotFused),
                _ => Err(MissReason::SeveralReaders),
            };
            match joined {
                Ok(r) => {
                    root[i] = Some(r);
                    size[r] += 1;
                }
                Err(m) => {
                    root[i] = Some(i);
                    size[i] = 1;
                    miss[i] = Some(m);
                }
            }
        }
        // Non-elementwise producers of region members are candidates too.
        for i in 0..n {
            if root[i].is_none()
                && miss[i].is_none()
                && readers[i].iter().any(|&u| root[u].is_some())
                && !g.node(NodeId(i as u32)).op.is_leaf()
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
            if m.len() == 1 && miss[r].is_none() {
                miss[r] = Some(MissReason::Alone);
            }
            m.len() > 1
        });

        let mut out = Graph::new(g.name());
        let mut map: Vec<NodeId> = vec![NodeId(u32::MAX); n];
        let mut report = FusionReport {
            ops_before: op_counts(g),
            ..Default::default()
        };
        let mut region_of: Vec<Option<usize>> = vec![None; n];
        for id in g.ids() {
            let i = id.index();
            let node = g.node(id);
            match root[i].filter(|r| members.contains_key(r)) {
                // A member other than the root: built with its region.
                Some(r) if r != i => {}
                Some(r) => {
                    let m = &members[&r];
                    let (body, ext) = region_body(
                        g,
                        m,
                        &format!("{}.region{}", g.name(), report.regions.len()),
                    )?;
                    let ins: Vec<NodeId> = ext.iter().map(|&e| map[e]).collect();
                    let shape: Shape = node.shape.clone();
                    let fused = out.push_unchecked(
                        Op::Fused(FusedRegion {
                            kind: FusionKind::Elementwise,
                            body: Box::new(body),
                        }),
                        ins,
                        shape,
                    );
                    map[i] = fused;
                    for &j in m {
                        region_of[j] = Some(report.regions.len());
                    }
                    report.regions.push(Region {
                        kind: FusionKind::Elementwise,
                        nodes: m.iter().map(|&j| j as u32).collect(),
                        fused_node: fused.0,
                    });
                }
                None => {
                    let ins = node.inputs.iter().map(|x| map[x.index()]).collect();
                    map[i] = out.push_unchecked(node.op.clone(), ins, node.shape.clone());
                }
            }
        }
        out.set_outputs_unchecked(g.outputs().iter().map(|o| map[o.index()]).collect());
        report.ops_after = op_counts(&out);
        for i in 0..n {
            if region_of[i].is_some() || miss[i].is_some() {
                report.candidates.push(Candidate {
                    node: i as u32,
                    op: g.node(NodeId(i as u32)).op.name().to_string(),
                    region: region_of[i],
                    miss: if region_of[i].is_some() {
                        None
                    } else {
                        miss[i]
                    },
                });
            }
        }
        Ok((out, report))
    }
}

/// The body of a region with `members` (node indices of `g`, the root last) and its external
/// operands in first-use order (the body's inputs, in the same order).
fn region_body(g: &Graph, members: &[usize], name: &str) -> Result<(Graph, Vec<usize>)> {
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
    let root = *members.last().expect("a region has members");
    body.set_outputs(vec![local[&root]]);
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

impl Pass for FuseElementwise {
    fn name(&self) -> &str {
        "fuse_elementwise"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        let (out, report) = self.fuse(g)?;
        Ok((out, report.regions.len()))
    }
}
