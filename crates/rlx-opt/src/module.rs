//! A graph at one of three stages, and the text that shows each.
//!
//! - **HIR**: a graph that may hold blocks (`linear`, `embedding`, `mlp`, `transformer_block`,
//!   see `rlx_ir::ops::blocks`), as a model builder writes it (`Graph::define`).
//! - **MIR**: the tensor DAG every pass works on: the blocks lowered by their decompositions
//!   (one rule per block, `lower:<block>`).
//! - **LIR**: MIR plus what a backend compiles from: the schedule (execution order), the
//!   buffer plan (one arena: offset, size and live steps of every computed value, packed by
//!   [`plan_memory`]), the view aliases (a reshape is its operand's buffer, in any row-major
//!   backend) and the I/O manifest (inputs, params and outputs by name, shape and node).
//!
//! [`CompilePipeline::compile_module`] takes a module through all three; `inspect_hir`,
//! `inspect_mir`, `inspect_lir`, `inspect_pipeline` and `inspect_mir_diff` print them; with
//! `RLX_IR_DUMP=<dir>` the compile writes `<graph>.hir.txt`, `.mir.txt` and `.lir.txt` there.

use crate::memory::{plan_memory, BufferRequest, MemoryPlan};
use crate::pipeline::{CompilePipeline, CompileResult, PassRecord};
use crate::{Pass, Rule, RuleSet, Site};
use rlx_ir::ops::{blocks, decompose};
use rlx_ir::{Error, Graph, NodeId, Op, OpKind, Result, Shape};
use std::fmt::Write;

/// The stage a [`GraphModule`] is at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Blocks and tensor ops.
    Hir,
    /// Tensor ops only.
    Mir,
    /// MIR with its [`Lir`] plan.
    Lir,
}

impl Stage {
    /// `hir`, `mir` or `lir`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Hir => "hir",
            Stage::Mir => "mir",
            Stage::Lir => "lir",
        }
    }
}

/// A value in the I/O manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct IoEntry {
    /// Its name (outputs: `out<i>`).
    pub name: String,
    /// Its node.
    pub node: NodeId,
    /// Its shape and dtype.
    pub shape: Shape,
}

/// A computed value's place in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LirBuffer {
    /// The node whose value it holds.
    pub node: NodeId,
    /// Byte offset in the arena.
    pub offset: usize,
    /// Bytes.
    pub bytes: usize,
    /// First and last step (schedule positions) it is live.
    pub live: (usize, usize),
}

/// What the LIR stage adds to MIR.
#[derive(Clone, Debug, PartialEq)]
pub struct Lir {
    /// Execution order of the computed nodes.
    pub schedule: Vec<NodeId>,
    /// One buffer per computed value that is not an alias.
    pub buffers: Vec<LirBuffer>,
    /// The arena's size in bytes.
    pub arena_bytes: usize,
    /// `(view, of)`: the view's value is the buffer of `of` (reshapes).
    pub aliases: Vec<(NodeId, NodeId)>,
    /// Inputs by name.
    pub inputs: Vec<IoEntry>,
    /// Params by name.
    pub params: Vec<IoEntry>,
    /// Outputs in order.
    pub outputs: Vec<IoEntry>,
}

/// A graph at a [`Stage`].
#[derive(Clone, Debug)]
pub struct GraphModule {
    stage: Stage,
    graph: Graph,
    lir: Option<Lir>,
}

/// Alignment of LIR buffers (bytes).
const ALIGN: usize = 64;

impl GraphModule {
    /// A module of `graph`: HIR if it holds a block, else MIR.
    pub fn new(graph: Graph) -> GraphModule {
        let stage = if graph.ids().any(|i| blocks::is_block(&graph.node(i).op)) {
            Stage::Hir
        } else {
            Stage::Mir
        };
        GraphModule {
            stage,
            graph,
            lir: None,
        }
    }

    /// The stage.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// The graph (at LIR, the MIR graph the plan describes).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The LIR plan, at the LIR stage.
    pub fn lir(&self) -> Option<&Lir> {
        self.lir.as_ref()
    }

    /// Lower the blocks to MIR (a module already at MIR or LIR is returned as MIR), with the
    /// record of the rules that fired.
    pub fn to_mir(&self) -> Result<(GraphModule, PassRecord)> {
        let (out, fired, sites) = lower_blocks().apply_logged(&self.graph)?;
        let rec = PassRecord {
            pass: "lower_hir".into(),
            nodes_before: self.graph.len(),
            nodes_after: out.len(),
            rewrites: fired.values().sum(),
            fired,
            sites,
        };
        Ok((
            GraphModule {
                stage: Stage::Mir,
                graph: out,
                lir: None,
            },
            rec,
        ))
    }

    /// Plan the MIR graph: schedule, buffers, aliases and I/O manifest.
    pub fn to_lir(&self) -> Result<GraphModule> {
        let m = if self.stage == Stage::Hir {
            self.to_mir()?.0
        } else {
            self.clone()
        };
        let lir = plan(&m.graph)?;
        Ok(GraphModule {
            stage: Stage::Lir,
            graph: m.graph,
            lir: Some(lir),
        })
    }
}

/// One rule per block kind: replace it by its decomposition (`lower:<block>`).
fn lower_blocks() -> RuleSet<'static> {
    let mut set = RuleSet::new("lower_hir");
    for kind in OpKind::all()
        .into_iter()
        .filter(|k| blocks::BLOCKS.contains(&k.name()))
    {
        set = set.with(Rule::new(
            format!("lower:{}", kind.name()),
            &[kind],
            |g: &mut Graph, s: &Site| match decompose(g, s.op, s.ins) {
                Some(r) => r.map(Some),
                None => Err(Error::op(s.op.name(), "is a block without a lowering")),
            },
        ));
    }
    set
}

/// The LIR plan of a MIR graph.
fn plan(g: &Graph) -> Result<Lir> {
    if let Some(id) = g.ids().find(|&i| blocks::is_block(&g.node(i).op)) {
        return Err(Error::Invalid(format!(
            "node {id} ({}) is an HIR block: lower the module to MIR first",
            g.node(id).op.name()
        )));
    }
    let leaf = |op: &Op| {
        matches!(
            op,
            Op::Input { .. } | Op::Param { .. } | Op::Constant { .. }
        )
    };
    let schedule: Vec<NodeId> = g.ids().filter(|&i| !leaf(&g.node(i).op)).collect();
    let step: Vec<Option<usize>> = {
        let mut s = vec![None; g.len()];
        for (k, &id) in schedule.iter().enumerate() {
            s[id.index()] = Some(k);
        }
        s
    };
    // A reshape is its operand's buffer: follow aliases to the owner.
    let mut owner: Vec<NodeId> = g.ids().collect();
    let mut aliases = Vec::new();
    for &id in &schedule {
        let n = g.node(id);
        if matches!(n.op, Op::Reshape { .. }) {
            let of = owner[n.inputs[0].index()];
            owner[id.index()] = of;
            aliases.push((id, of));
        }
    }
    // Each owner lives from its step to the last step reading it or any alias of it (outputs
    // to the end).
    let end = schedule.len();
    let mut last: Vec<usize> = step.iter().map(|s| s.unwrap_or(0)).collect();
    for &id in &schedule {
        for &i in &g.node(id).inputs {
            let o = owner[i.index()].index();
            last[o] = last[o].max(step[id.index()].unwrap_or(0));
        }
    }
    for &o in g.outputs() {
        last[owner[o.index()].index()] = end;
    }
    let owned: Vec<NodeId> = schedule
        .iter()
        .copied()
        .filter(|&id| owner[id.index()] == id)
        .collect();
    let mut reqs = Vec::with_capacity(owned.len());
    for &id in &owned {
        let bytes = g.shape(id).size_bytes().ok_or_else(|| {
            Error::Invalid(format!("node {id} has a dynamic shape {}", g.shape(id)))
        })?;
        let start = step[id.index()].unwrap_or(0);
        reqs.push(BufferRequest {
            size: bytes,
            start,
            end: last[id.index()].max(start),
        });
    }
    let MemoryPlan {
        offsets,
        arena_size,
    } = plan_memory(&reqs, ALIGN);
    let buffers = owned
        .iter()
        .zip(&reqs)
        .zip(&offsets)
        .map(|((&node, r), &offset)| LirBuffer {
            node,
            offset,
            bytes: r.size,
            live: (r.start, r.end),
        })
        .collect();
    let entry = |(name, node): (&str, NodeId)| IoEntry {
        name: name.to_string(),
        node,
        shape: g.shape(node).clone(),
    };
    Ok(Lir {
        schedule,
        buffers,
        arena_bytes: arena_size,
        aliases,
        inputs: g.inputs().into_iter().map(entry).collect(),
        params: g.params().into_iter().map(entry).collect(),
        outputs: g
            .outputs()
            .iter()
            .enumerate()
            .map(|(i, &o)| IoEntry {
                name: format!("out{i}"),
                node: o,
                shape: g.shape(o).clone(),
            })
            .collect(),
    })
}

impl CompilePipeline<'_> {
    /// Take `module` through every stage: HIR lowered to MIR, this pipeline's passes on the MIR,
    /// then the LIR plan. The records start with `lower_hir`. With `RLX_IR_DUMP=<dir>` (or
    /// [`CompilePipeline::dump_to`]) each stage's text is written there too.
    pub fn compile_module(&self, module: &GraphModule) -> Result<(GraphModule, CompileResult)> {
        let (mir, rec) = module.to_mir()?;
        if module.stage() == Stage::Hir {
            self.dump_stage(module.graph(), "hir", &inspect_hir(module));
        }
        let mut result = self.run(mir.graph())?;
        result.records.insert(0, rec);
        let mir = GraphModule::new(result.graph.clone());
        self.dump_stage(mir.graph(), "mir", &inspect_mir(&mir)?);
        let lir = mir.to_lir()?;
        self.dump_stage(lir.graph(), "lir", &inspect_lir(&lir)?);
        Ok((lir, result))
    }
}

/// With `RLX_IR_DUMP=<dir>`, write the stages of a compile of `input` whose passes gave `mir`:
/// `<graph>.hir.txt` (when `input` holds blocks), `<graph>.mir.txt` and `<graph>.lir.txt`.
/// Sessions call it after their passes.
pub fn maybe_dump_pipeline(input: &Graph, mir: &Graph) {
    let pipe = CompilePipeline::new();
    if !pipe.dumps() {
        return;
    }
    let m = GraphModule::new(input.clone());
    if m.stage() == Stage::Hir {
        pipe.dump_stage(input, "hir", &inspect_hir(&m));
    }
    let mir = GraphModule::new(mir.clone());
    match inspect_mir(&mir).and_then(|t| Ok((t, inspect_lir(&mir)?))) {
        Ok((mt, lt)) => {
            pipe.dump_stage(input, "mir", &mt);
            pipe.dump_stage(input, "lir", &lt);
        }
        Err(e) => eprintln!("rlx: IR dump of \"{}\": {e}", input.name()),
    }
}

/// The module's HIR text (its graph as built, blocks included).
pub fn inspect_hir(module: &GraphModule) -> String {
    format!("; stage hir\n{}", module.graph())
}

/// The module's MIR text (lowering its blocks first if needed).
pub fn inspect_mir(module: &GraphModule) -> Result<String> {
    let g = match module.stage() {
        Stage::Hir => module.to_mir()?.0.graph,
        _ => module.graph.clone(),
    };
    Ok(format!("; stage mir\n{g}"))
}

/// The module's LIR text: the MIR graph, then the manifest, schedule, aliases and buffers.
pub fn inspect_lir(module: &GraphModule) -> Result<String> {
    let lir_module;
    let m = match module.lir() {
        Some(_) => module,
        None => {
            lir_module = module.to_lir()?;
            &lir_module
        }
    };
    let lir = m
        .lir()
        .ok_or_else(|| Error::Invalid("no LIR plan".into()))?;
    let mut s = format!("; stage lir\n{}", m.graph());
    let io = |s: &mut String, what: &str, v: &[IoEntry]| {
        for e in v {
            let _ = writeln!(s, "{what} {:?} = {} : {}", e.name, e.node, e.shape);
        }
    };
    s += "\n; manifest\n";
    io(&mut s, "input", &lir.inputs);
    io(&mut s, "param", &lir.params);
    io(&mut s, "output", &lir.outputs);
    s += "\n; schedule\n";
    let steps: Vec<String> = lir.schedule.iter().map(|n| n.to_string()).collect();
    let _ = writeln!(s, "{}", steps.join(" "));
    s += "\n; aliases\n";
    for (v, of) in &lir.aliases {
        let _ = writeln!(s, "{v} = view of {of}");
    }
    let _ = writeln!(s, "\n; buffers (arena {} bytes)", lir.arena_bytes);
    for b in &lir.buffers {
        let _ = writeln!(
            s,
            "{} @ {} : {} bytes, steps {}..={}",
            b.node, b.offset, b.bytes, b.live.0, b.live.1
        );
    }
    Ok(s)
}

/// Every stage of `graph` through `pipeline`: HIR (when it holds blocks), MIR after the passes,
/// LIR, one after the other.
pub fn inspect_pipeline(graph: &Graph, pipeline: &CompilePipeline) -> Result<String> {
    let m = GraphModule::new(graph.clone());
    let (lir, _) = pipeline.compile_module(&m)?;
    let mut s = String::new();
    if m.stage() == Stage::Hir {
        s += &inspect_hir(&m);
        s += "\n";
    }
    s += &inspect_mir(&GraphModule::new(lir.graph().clone()))?;
    s += "\n";
    s += &inspect_lir(&lir)?;
    Ok(s)
}

/// A line diff of two graphs' texts (say, MIR before and after a pass): `-` lines only in
/// `before`, `+` lines only in `after`, unchanged lines with two spaces; an empty string when
/// they are equal.
pub fn inspect_mir_diff(before: &Graph, after: &Graph) -> String {
    let (a, b) = (before.to_string(), after.to_string());
    if a == b {
        return String::new();
    }
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    // Longest common subsequence of lines, then walk it.
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut s) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(s, "  {}", a[i]);
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            let _ = writeln!(s, "+ {}", b[j]);
            j += 1;
        } else {
            let _ = writeln!(s, "- {}", a[i]);
            i += 1;
        }
    }
    s
}

impl Pass for LowerHir {
    fn name(&self) -> &str {
        "lower_hir"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        let (out, fired) = self.run_counted(g)?;
        Ok((out, fired.values().sum()))
    }

    fn run_counted(&self, g: &Graph) -> Result<(Graph, std::collections::BTreeMap<String, usize>)> {
        let (out, fired, _) = self.run_logged(g)?;
        Ok((out, fired))
    }

    /// Per-block rule counts; a graph without blocks (MIR already, every later round of a
    /// session's pipeline) is returned as it is, without a rebuild.
    fn run_logged(
        &self,
        g: &Graph,
    ) -> Result<(
        Graph,
        std::collections::BTreeMap<String, usize>,
        Vec<crate::rewrite::RuleSite>,
    )> {
        if !g.ids().any(|i| blocks::is_block(&g.node(i).op)) {
            return Ok((g.clone(), Default::default(), Vec::new()));
        }
        lower_blocks().apply_logged(g)
    }
}

/// The HIR → MIR lowering as a pass (rules `lower:<block>`).
pub struct LowerHir;
