//! Compiling a graph into a CPU program: lower each node, plan one arena for every
//! intermediate, fix every buffer's address, then build the kernels.

use crate::buffer::Buffer;
use crate::kernels::{self, Kernel, Lowered, NodeInfo, Ptr, TRef};
use crate::layout::{Layout, MAX_RANK};
use crate::pool::Pool;
use kernels::fused::RegionProgram;
use kernels::gemm::half::PANEL;
use rlx_driver::{Executable, IoSlot};
use rlx_ir::{DType, Error, FusionKind, Graph, NodeId, Op, Result, Shape};
use rlx_opt::{plan_memory, BufferRequest, LoweringOptions, LoweringPlan, Skip};
use std::sync::Arc;

/// Where a value's bytes live.
#[derive(Clone, Copy, Debug)]
enum Buf {
    /// Arena buffer request `i`.
    Arena(usize),
    /// Param storage `i`.
    Param(usize),
    /// Constant storage `i`.
    Const(usize),
}

#[derive(Clone, Copy)]
struct Val {
    buf: Buf,
    layout: Layout,
    dtype: DType,
}

/// A compiled CPU program.
pub struct Program {
    steps: Vec<Box<dyn Kernel>>,
    /// Op name of each step (for the profile).
    step_ops: Vec<&'static str>,
    /// Node, operand dims and result dims of each step (`RLX_PROFILE=nodes` only).
    step_desc: Option<Vec<String>>,
    /// Per-step accumulated nanoseconds and call counts when `RLX_PROFILE` is set.
    profile: Option<Vec<(u64, u64)>>,
    pool: Arc<Pool>,
    inputs: Vec<IoSlot>,
    params: Vec<IoSlot>,
    outputs: Vec<IoSlot>,
    input_ptrs: Vec<Ptr>,
    param_bufs: Vec<Arc<Buffer>>,
    /// `[k, n]` of each param stored in column panels (the plan's `panel_params`), else `None`.
    param_panels: Vec<Option<[usize; 2]>>,
    output_refs: Vec<TRef>,
    // Owned storage the kernels point into; kept alive (and unmoved) for the program's lifetime.
    _arena: Buffer,
    _consts: Vec<Buffer>,
    arena_bytes: usize,
    in_place_updates: usize,
}

impl Program {
    /// Bytes of the single arena holding every input and intermediate.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// How many of the updates given to [`compile_with_updates`] are computed in place.
    pub fn in_place_updates(&self) -> usize {
        self.in_place_updates
    }

    /// Number of kernel launches per run.
    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// The kind of each step, in run order, as `RLX_PROFILE` names them: the op (`matmul`,
    /// `softmax`, …), `fused` for an elementwise group, `adam` for a group run as the one-pass
    /// Adam update.
    pub fn step_kinds(&self) -> &[&'static str] {
        &self.step_ops
    }
}

fn check_node(g: &Graph, id: rlx_ir::NodeId) -> Result<Vec<usize>> {
    let n = g.node(id);
    let dims = n.shape.static_dims().ok_or_else(|| Error::Unsupported {
        backend: "cpu".into(),
        op: n.op.name().into(),
        node: id,
        msg: format!(
            "shape {} has symbolic dimensions; bind them before compiling",
            n.shape
        ),
    })?;
    if dims.len() > MAX_RANK || n.shape.dtype() == DType::C64 {
        return Err(Error::Unsupported {
            backend: "cpu".into(),
            op: n.op.name().into(),
            node: id,
            msg: format!(
                "shape {} (the CPU backend handles rank <= {MAX_RANK} and no c64)",
                n.shape
            ),
        });
    }
    Ok(dims)
}

/// A compute step before addresses are fixed: node, operand nodes, arena request of its output,
/// scratch request, kernel builder.
type Pending = (usize, Vec<usize>, usize, Option<usize>, kernels::Build);

/// Whether the CPU's region kernels take node `id` into a region of `kind` (what
/// `CpuBackend::fuses` answers): f32 Binary / Activation nodes into elementwise regions, a row
/// sum or mean as the end of a multiply-reduce region, and an elementwise region updating a
/// param as an optimizer region.
pub fn fuses(g: &Graph, id: NodeId, kind: FusionKind) -> bool {
    match kind {
        FusionKind::Elementwise => kernels::fused::fusible(g, id),
        FusionKind::MultiplyReduce => kernels::fused::row_sum(g, id).is_some(),
        // An elementwise region updating a param: the group loop runs it (as the one-pass
        // Adam update when it is one).
        FusionKind::Optimizer => {
            matches!(&g.node(id).op, Op::Fused(r) if kernels::fused::region_program(r).is_some())
        }
        // No kernels for these shapes: the products, norms and attention run on their own.
        FusionKind::MatMulEpilogue
        | FusionKind::ResidualNorm
        | FusionKind::GatedMlp
        | FusionKind::Attention => false,
    }
}

/// The compiler's lowering plan for `g` with the CPU's region kernels: fusion (unless
/// `fuse` is false), causal skips, permuted stores and donations of `updates`, each switched by
/// `LoweringOptions::with_env`.
pub fn prepare(
    g: &Graph,
    fuse: bool,
    updates: &[(String, usize)],
) -> Result<(Graph, LoweringPlan)> {
    let mut options = LoweringOptions {
        param_panels: kernels::gemm::half::PANEL,
        ..LoweringOptions::default()
    }
    .with_env();
    options.fusion.elementwise &= fuse;
    rlx_opt::prepare(g, &options, &fuses, updates)
}

/// Run the compiler's lowering plan (see [`prepare`]) over `g` and lower it, with elementwise
/// fusion unless `RLX_FUSION=0` (fused and unfused programs give bit-identical results). A
/// convenience for graphs that did not go through a session; sessions plan and then call
/// [`lower`].
pub fn compile(g: &Graph, threads: usize) -> Result<Program> {
    compile_with_fusion(g, threads, true)
}

/// [`compile`] with elementwise fusion switched explicitly (`RLX_FUSION` still overrides).
pub fn compile_with_fusion(g: &Graph, threads: usize, fuse: bool) -> Result<Program> {
    let (g, plan) = prepare(g, fuse, &[])?;
    lower(&g, &plan, threads, None)
}

/// [`compile`] for a graph whose outputs will overwrite params after each run (`(param name,
/// output index)`, see `CompileOptions::updates`): the updates the plan donates are written
/// straight into the param's storage, so `assign_param` has nothing to copy for them.
pub fn compile_with_updates(
    g: &Graph,
    threads: usize,
    updates: &[(String, usize)],
) -> Result<Program> {
    let (g, plan) = prepare(g, true, updates)?;
    lower(&g, &plan, threads, None)
}

/// How a node is run as a step of the group loop: its program, the nodes of its external
/// operands, and the nodes of the region's further results it stores, with the instruction
/// computing each.
struct Chain {
    prog: kernels::fused::RegionProgram,
    ext: Vec<usize>,
    stored: Vec<(usize, usize)>,
    /// Body ops, for the profile.
    names: Vec<&'static str>,
}

/// The chain running node `id`: a fused region the group loop runs (with the results of the
/// nodes after it that belong to the same region), or a lone f32 activation (the loop is
/// compiled for the widest vector unit, which pays for the transcendental ones).
fn chain_of(g: &Graph, id: NodeId) -> Option<Chain> {
    use kernels::fused::{Instr, RegionProgram, Src};
    let n = g.node(id);
    match &n.op {
        Op::Fused(r) => {
            let mut prog = kernels::fused::region_program(r)?;
            let ext = n.inputs.iter().map(|i| i.index()).collect();
            let names = r.op_names();
            if r.output != 0 {
                // A result whose region's first result is gone: compute up to it alone.
                let j = prog.outputs[r.output]?;
                prog.code.truncate(j + 1);
                prog.outputs = vec![Some(j)];
                return Some(Chain {
                    prog,
                    ext,
                    stored: Vec::new(),
                    names,
                });
            }
            let mut stored = Vec::new();
            for (k, s) in g.fused_results(id) {
                stored.push((s.index(), prog.outputs[k]?));
            }
            Some(Chain {
                prog,
                ext,
                stored,
                names,
            })
        }
        Op::Activation(a) if kernels::fused::fusible(g, id) => {
            let dims = n.shape.static_dims()?;
            let prog = RegionProgram {
                code: vec![Instr::Unary(*a, Src::Ext(0))],
                rows: None,
                outputs: vec![Some(0)],
                dims,
            };
            Some(Chain {
                prog,
                ext: vec![n.inputs[0].index()],
                stored: Vec::new(),
                names: vec![n.op.name()],
            })
        }
        _ => None,
    }
}

fn tri(s: Option<Skip>) -> kernels::gemm::Tri {
    use kernels::gemm::Tri;
    match s {
        None => Tri::Full,
        Some(Skip::RowMax(o)) => Tri::RowMax(o),
        Some(Skip::RowMin(o)) => Tri::RowMin(o),
        Some(Skip::ColMin(o)) => Tri::ColMin(o),
        Some(Skip::Unneeded(o)) => Tri::Unneeded(o),
    }
}

/// The layout a computed value is stored in: dense, or permuted as the plan says (the GEMM
/// then writes C rows `ldc` apart, and the transpose reading it is a dense view).
fn output_layout(plan: &LoweringPlan, id: NodeId, dims: &[usize]) -> Layout {
    let Some(perm) = plan.permuted_store(id).filter(|p| p.len() == dims.len()) else {
        return Layout::contiguous(dims);
    };
    let transposed: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let mut inverse = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    Layout::contiguous(&transposed).permute(&inverse)
}

/// The runs of bytes `range` of a param (row-major, as users see it) as it is stored: calls
/// `f(logical, stored, len)` for each run contiguous in both. A plain param is one run; one
/// stored in column panels (`[k, n]` of 2-byte elements, see [`HMat::panels`]) a run per
/// panel row.
///
/// [`HMat::panels`]: kernels::gemm::half::HMat::panels
fn stored_runs(
    panels: Option<[usize; 2]>,
    range: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize, usize),
) {
    let Some([k, n]) = panels else {
        if !range.is_empty() {
            f(range.start, range.start, range.len());
        }
        return;
    };
    const E: usize = 2;
    let mut at = range.start;
    while at < range.end {
        let (r, c) = (at / E / n, at / E % n);
        let end = ((r * n + (c / PANEL + 1) * PANEL) * E).min(range.end);
        f(
            at,
            kernels::gemm::half::panel_offset(k, r, c) * E + at % E,
            end - at,
        );
        at = end;
    }
}

/// Params adding up to this many bytes or more share one buffer (in huge pages, see
/// [`Buffer::part`]); fewer get a buffer each.
const PARAM_SLAB_MIN: usize = 2 << 20;

/// Whether a program's params may share one buffer (`RLX_PARAM_SLAB=0`: one buffer each, for
/// A/B measurements).
fn param_slab_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !rlx_ir::env::is_off("RLX_PARAM_SLAB"))
}

/// Lower `g` (verified, decomposed to what [`kernels::supports`] runs) with the decisions of
/// `plan` for `threads` threads; params with the same name and shape as a param of `share` use
/// that param's storage (see `Backend::compile_sharing`).
pub fn lower(
    g: &Graph,
    plan: &LoweringPlan,
    threads: usize,
    share: Option<&Program>,
) -> Result<Program> {
    let threads = threads.max(1);
    let mut vals: Vec<Val> = Vec::with_capacity(g.len());
    let mut reqs: Vec<BufferRequest> = Vec::new();
    let mut consts: Vec<Buffer> = Vec::new();
    let mut param_bufs: Vec<Arc<Buffer>> = Vec::new();
    let mut param_panels: Vec<Option<[usize; 2]>> = Vec::new();
    // Param nodes stored in column panels (the plan's, less those shared row-major).
    let mut panel_nodes = std::collections::HashSet::new();
    let (mut inputs, mut params) = (Vec::new(), Vec::new());
    let mut input_reqs = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    // Values computed by the step of an earlier node (further results of a region).
    let mut computed: std::collections::HashMap<usize, Val> = Default::default();
    // Profile name and description of each chain step, by node.
    let mut chain_steps: std::collections::HashMap<usize, (&'static str, String)> =
        Default::default();
    // The params this program owns (not shared with `share`) live in one buffer when they add
    // up to a huge page or more, each at a multiple of 64 bytes (see `Buffer::part`).
    let shared_param = |name: &str, shape: &Shape| {
        share.is_some_and(|p| p.params.iter().any(|s| s.name == name && s.shape == *shape))
    };
    let mut slab_len = 0usize;
    for id in g.ids() {
        let n = g.node(id);
        if let (Op::Param { name }, Some(bytes)) = (&n.op, n.shape.size_bytes()) {
            if !shared_param(name, &n.shape) {
                slab_len += bytes.next_multiple_of(64);
            }
        }
    }
    let slab = if slab_len >= PARAM_SLAB_MIN && param_slab_on() {
        Some(Arc::new(Buffer::for_compile(slab_len, || {
            format!("the params of graph \"{}\"", g.name())
        })?))
    } else {
        None
    };
    let mut slab_used = 0usize;
    let shared = kernels::Shared::default();
    for id in g.ids() {
        if let Some(v) = (!computed.is_empty())
            .then(|| computed.remove(&id.index()))
            .flatten()
        {
            vals.push(v);
            continue;
        }
        let dims = check_node(g, id)?;
        let node = g.node(id);
        let dtype = node.shape.dtype();
        let bytes = dims.iter().product::<usize>() * dtype.size_bytes();
        let dense = Layout::contiguous(&dims);
        let step = pending.len();
        let chain = if node.op.is_leaf() {
            None
        } else {
            chain_of(g, id)
        };
        let val = match &node.op {
            Op::Input { name } => {
                reqs.push(BufferRequest {
                    size: bytes,
                    start: 0,
                    end: 0,
                });
                inputs.push(IoSlot {
                    name: name.clone(),
                    shape: node.shape.clone(),
                });
                input_reqs.push(reqs.len() - 1);
                Val {
                    buf: Buf::Arena(reqs.len() - 1),
                    layout: dense,
                    dtype,
                }
            }
            Op::Param { name } => {
                params.push(IoSlot {
                    name: name.clone(),
                    shape: node.shape.clone(),
                });
                let panels = match plan.panels(id) {
                    None => None,
                    Some(w) if w == PANEL && dims.len() == 2 && dims[1] % PANEL == 0 => {
                        Some([dims[0], dims[1]])
                    }
                    Some(w) => {
                        return Err(Error::Invalid(format!(
                            "param \"{name}\" ({}): the plan stores it in panels of {w} \
                             columns; the CPU backend's are {PANEL} wide and need a 2-D \
                             param whose columns are a multiple of that",
                            node.shape
                        )))
                    }
                };
                let found = share.and_then(|p| {
                    let i = p
                        .params
                        .iter()
                        .position(|s| s.name == *name && s.shape == node.shape)?;
                    Some((p, i))
                });
                // A param shared with a program that stores it row-major is read row-major here
                // too (products read either layout); one stored in panels there can be shared
                // only if every reader here reads panels.
                let panels = match found {
                    Some((p, i)) if p.param_panels[i].is_none() => None,
                    Some(_) if panels.is_none() => {
                        return Err(Error::Invalid(format!(
                            "param \"{name}\" ({}) is stored in column panels by the program \
                             it shares storage with (there it is read only as the right operand \
                             of products) but read otherwise here; compile the program that \
                             reads it otherwise first and share with that one, or set \
                             RLX_PARAM_PANELS=0 to store every param row-major",
                            node.shape
                        )));
                    }
                    _ => panels,
                };
                if panels.is_some() {
                    panel_nodes.insert(id.index());
                }
                param_panels.push(panels);
                let shared = found.map(|(p, i)| p.param_bufs[i].clone());
                let mut own = || match &slab {
                    Some(whole) if slab_used + bytes <= whole.len() => {
                        let b = Buffer::part(whole, slab_used, bytes);
                        slab_used += bytes.next_multiple_of(64);
                        Ok(b)
                    }
                    _ => Buffer::for_compile(bytes, || format!("param \"{name}\" ({})", node.shape)),
                };
                param_bufs.push(match shared {
                    Some(b) => b,
                    None => Arc::new(own()?),
                });
                Val {
                    buf: Buf::Param(param_bufs.len() - 1),
                    layout: dense,
                    dtype,
                }
            }
            Op::Constant { data } => {
                let b = Buffer::for_compile(data.len(), || {
                    format!("constant {id} ({})", node.shape)
                })?;
                // SAFETY: `b` has `data.len()` bytes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr(), data.len()) };
                consts.push(b);
                Val {
                    buf: Buf::Const(consts.len() - 1),
                    layout: dense,
                    dtype,
                }
            }
            _ if chain.is_some() => {
                let Chain {
                    prog,
                    ext,
                    stored,
                    names,
                } = chain.expect("checked");
                let block = kernels::fused::block_len(prog.rows.map(|r| r.row));
                for &e in &ext {
                    if let Buf::Arena(r) = vals[e].buf {
                        reqs[r].end = reqs[r].end.max(step);
                    }
                }
                reqs.push(BufferRequest {
                    size: bytes,
                    start: step,
                    end: step,
                });
                let out_req = reqs.len() - 1;
                reqs.push(BufferRequest {
                    size: kernels::fused::scratch_bytes(ext.len(), prog.code.len(), threads, block),
                    start: step,
                    end: step,
                });
                let scratch_req = Some(reqs.len() - 1);
                // Further results get buffers of their own, written by the step too; they follow
                // the external operands in the step's operand list.
                let mut operands = ext.clone();
                let mut extra = Vec::new();
                for &(s, j) in &stored {
                    let sdims = check_node(g, NodeId(s as u32))?;
                    let sbytes = sdims.iter().product::<usize>()
                        * g.shape(NodeId(s as u32)).dtype().size_bytes();
                    reqs.push(BufferRequest {
                        size: sbytes,
                        start: step,
                        end: step,
                    });
                    computed.insert(
                        s,
                        Val {
                            buf: Buf::Arena(reqs.len() - 1),
                            layout: Layout::contiguous(&sdims),
                            dtype: g.shape(NodeId(s as u32)).dtype(),
                        },
                    );
                    extra.push(j);
                    operands.push(s);
                }
                // Whether the group runs as the one-pass Adam update (`fused::build` decides the
                // same way), for the profile.
                let layouts: Vec<Layout> = ext.iter().map(|&e| vals[e].layout).collect();
                let adam =
                    kernels::fused::as_adam(&prog.code, &layouts, &prog.dims, &extra, prog.rows)
                        .is_some()
                        && ext.iter().all(|&e| vals[e].dtype == DType::F32);
                let what = format!(
                    "fused group of {} ({}){}",
                    names.len(),
                    names.join(" "),
                    if adam { " as one Adam pass" } else { "" }
                );
                chain_steps.insert(id.index(), (if adam { "adam" } else { "fused" }, what));
                let n_ext = ext.len();
                let RegionProgram {
                    code,
                    rows,
                    dims: group_dims,
                    ..
                } = prog;
                let build: kernels::Build = Box::new(move |ins, out, s| {
                    let (ext_refs, extra_refs) = ins.split_at(n_ext);
                    let extra = extra.into_iter().zip(extra_refs.iter().copied()).collect();
                    kernels::fused::build(
                        code,
                        ext_refs.to_vec(),
                        group_dims,
                        out,
                        rows,
                        extra,
                        s,
                        threads,
                    )
                });
                pending.push((id.index(), operands, out_req, scratch_req, build));
                Val {
                    buf: Buf::Arena(out_req),
                    layout: dense,
                    dtype,
                }
            }
            _ => {
                let info = NodeInfo {
                    node,
                    id,
                    ins: node.inputs.iter().map(|i| vals[i.index()].layout).collect(),
                    in_dtypes: node.inputs.iter().map(|i| vals[i.index()].dtype).collect(),
                    dims: dims.clone(),
                    threads,
                    zeros: tri(plan.skip(id)),
                    b_panels: matches!(node.op, Op::MatMul)
                        && node
                            .inputs
                            .get(1)
                            .is_some_and(|b| panel_nodes.contains(&b.index())),
                    shared: &shared,
                    plan,
                };
                match kernels::lower(&info)? {
                    Lowered::View { src, layout } => {
                        let s = vals[node.inputs[src].index()];
                        Val {
                            buf: s.buf,
                            layout,
                            dtype,
                        }
                    }
                    Lowered::InPlace { src, build } => {
                        let s = vals[node.inputs[src].index()];
                        if !matches!(s.buf, Buf::Param(_)) {
                            return Err(Error::Unsupported {
                                backend: "cpu".into(),
                                op: node.op.name().into(),
                                node: id,
                                msg: format!(
                                    "operand {} is updated in place and must be a param",
                                    node.inputs[src]
                                ),
                            });
                        }
                        for i in &node.inputs {
                            if let Buf::Arena(r) = vals[i.index()].buf {
                                reqs[r].end = reqs[r].end.max(step);
                            }
                        }
                        let build: kernels::Build = Box::new(move |ins, out, _| build(ins, out));
                        pending.push((
                            id.index(),
                            node.inputs.iter().map(|i| i.index()).collect(),
                            usize::MAX,
                            None,
                            build,
                        ));
                        s
                    }
                    Lowered::Compute { scratch, build } => {
                        // Operands stay live through this step.
                        for i in &node.inputs {
                            if let Buf::Arena(r) = vals[i.index()].buf {
                                reqs[r].end = reqs[r].end.max(step);
                            }
                        }
                        reqs.push(BufferRequest {
                            size: bytes,
                            start: step,
                            end: step,
                        });
                        let out_req = reqs.len() - 1;
                        let scratch_req = (scratch > 0).then(|| {
                            reqs.push(BufferRequest {
                                size: scratch,
                                start: step,
                                end: step,
                            });
                            reqs.len() - 1
                        });
                        pending.push((
                            id.index(),
                            node.inputs.iter().map(|i| i.index()).collect(),
                            out_req,
                            scratch_req,
                            build,
                        ));
                        // The products' and attention's kernels write through their output
                        // strides (rows apart, the last axis dense).
                        let layout = if matches!(node.op, Op::MatMul | Op::Attention { .. }) {
                            output_layout(plan, id, &dims)
                        } else {
                            dense
                        };
                        Val {
                            buf: Buf::Arena(out_req),
                            layout,
                            dtype,
                        }
                    }
                }
            }
        };
        vals.push(val);
    }
    let nsteps = pending.len();
    for o in g.outputs() {
        if let Buf::Arena(r) = vals[o.index()].buf {
            reqs[r].end = nsteps;
        }
    }
    // Donations: the output's buffer is the param's storage (the plan checked that nothing
    // reads the param's old value after the step writing it).
    let mut donated = 0;
    for d in &plan.donations {
        let Some(v) = g.outputs().get(d.output).map(|v| v.index()) else {
            continue;
        };
        let Some(p) = params.iter().position(|s| s.name == d.param) else {
            continue;
        };
        if params[p].shape == *g.shape(NodeId(v as u32))
            && matches!(vals[v].buf, Buf::Arena(_))
            && chain_steps
                .keys()
                .any(|&h| g.fused_head(NodeId(v as u32)) == Some(NodeId(h as u32)))
        {
            vals[v].buf = Buf::Param(p);
            donated += 1;
        }
    }
    let mem = plan_memory(&reqs, 64);
    let arena = Buffer::for_compile(mem.arena_size, || {
        format!("the arena of graph \"{}\"", g.name())
    })?;
    let base = |b: Buf| -> Ptr {
        // SAFETY: offsets from the plan lie within the arena.
        Ptr(match b {
            Buf::Arena(r) => unsafe { arena.ptr().add(mem.offsets[r]) },
            Buf::Param(i) => param_bufs[i].ptr(),
            Buf::Const(i) => consts[i].ptr(),
        })
    };
    let tref = |v: &Val| TRef {
        ptr: base(v.buf),
        layout: v.layout,
        dtype: v.dtype,
    };
    let mut steps = Vec::with_capacity(nsteps);
    let mut step_ops = Vec::with_capacity(nsteps);
    let by_node = rlx_ir::env::get("RLX_PROFILE").is_some_and(|v| v == "nodes");
    let mut step_desc = by_node.then(Vec::new);
    for (node, operands, out_req, scratch_req, build) in pending {
        let n = g.node(rlx_ir::NodeId(node as u32));
        let chain = chain_steps.get(&node);
        if let Some(d) = &mut step_desc {
            let dims = |i: usize| {
                format!(
                    "{:?}{}",
                    vals[i].layout.dims(),
                    if vals[i].layout.is_contiguous() {
                        ""
                    } else {
                        "(strided)"
                    }
                )
            };
            let ins: Vec<String> = operands.iter().map(|&i| dims(i)).collect();
            let what = match (chain, plan.skip(NodeId(node as u32))) {
                (Some((_, what)), _) => what.clone(),
                (None, None) => n.op.name().to_string(),
                (None, Some(skip)) => format!("{} (skipping zeros: {skip:?})", n.op.name()),
            };
            d.push(format!(
                "{} {what} ({}) -> {}",
                NodeId(node as u32),
                ins.join(", "),
                g.shape(NodeId(node as u32))
            ));
        }
        step_ops.push(match &n.op {
            _ if chain.is_some() => chain.expect("checked").0,
            // Quantized products are told apart by weight format in the profile.
            Op::DequantMatMul { scheme } => kernels::quant::profile_name(*scheme),
            op => op.name(),
        });
        let ins: Vec<TRef> = operands.iter().map(|&i| tref(&vals[i])).collect();
        let out = tref(&vals[node]);
        debug_assert!(
            out_req == usize::MAX
                || matches!(vals[node].buf, Buf::Param(_))
                || matches!(vals[node].buf, Buf::Arena(r) if r == out_req)
        );
        let scratch = scratch_req.map_or(Ptr(std::ptr::null_mut()), |r| base(Buf::Arena(r)));
        steps.push(build(&ins, out, scratch));
    }
    let outputs = g
        .outputs()
        .iter()
        .enumerate()
        .map(|(i, o)| IoSlot {
            name: format!("out{i}"),
            shape: g.shape(*o).clone(),
        })
        .collect();
    let output_refs = g.outputs().iter().map(|o| tref(&vals[o.index()])).collect();
    let input_ptrs = input_reqs.iter().map(|&r| base(Buf::Arena(r))).collect();
    let profile = rlx_ir::env::is_set("RLX_PROFILE").then(|| vec![(0, 0); steps.len()]);
    Ok(Program {
        steps,
        step_ops,
        step_desc,
        profile,
        pool: Pool::shared(threads),
        inputs,
        params,
        outputs,
        input_ptrs,
        param_bufs,
        param_panels,
        output_refs,
        arena_bytes: mem.arena_size,
        in_place_updates: donated,
        _arena: arena,
        _consts: consts,
    })
}

impl Program {
    /// Time per op kind accumulated over all runs (`RLX_PROFILE=1`): `(op, total ns, calls)`,
    /// slowest first. Empty when profiling is off.
    pub fn profile(&self) -> Vec<(&'static str, u64, u64)> {
        let Some(prof) = &self.profile else {
            return Vec::new();
        };
        let mut by: Vec<(&'static str, u64, u64)> = Vec::new();
        for (op, (ns, n)) in self.step_ops.iter().zip(prof) {
            match by.iter_mut().find(|e| e.0 == *op) {
                Some(e) => {
                    e.1 += ns;
                    e.2 += n;
                }
                None => by.push((op, *ns, *n)),
            }
        }
        by.sort_by_key(|e| std::cmp::Reverse(e.1));
        by
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let by = self.profile();
        let total: u64 = by.iter().map(|e| e.1).sum();
        if total == 0 {
            return;
        }
        eprintln!(
            "rlx profile ({} steps per run, {:.3} ms in total):",
            self.steps.len(),
            total as f64 / 1e6
        );
        for (op, ns, n) in by {
            eprintln!(
                "  {op:<14} {:>10.3} ms {:>5.1}%  {n} calls",
                ns as f64 / 1e6,
                100.0 * ns as f64 / total as f64
            );
        }
        if let (Some(desc), Some(prof)) = (&self.step_desc, &self.profile) {
            let mut order: Vec<usize> = (0..desc.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(prof[i].0));
            eprintln!("  slowest steps (of {}):", desc.len());
            let top = rlx_ir::env::count("RLX_PROFILE_TOP").unwrap_or(30);
            for &i in order.iter().take(top) {
                let (ns, n) = prof[i];
                eprintln!(
                    "  {:>9.3} ms/call {:>5.1}%  {}",
                    ns as f64 / 1e6 / n.max(1) as f64,
                    100.0 * ns as f64 / total as f64,
                    desc[i]
                );
            }
        }
    }
}

/// The executable's operations, infallible on the CPU (every buffer was allocated at compile
/// time): tests and benchmarks that compile with [`crate::compile`] call them directly. They
/// panic on a buffer of the wrong length; the [`Executable`] methods answer an error instead.
impl Program {
    /// Copy the bytes of input `idx` (exactly its byte size).
    pub fn write_input(&mut self, idx: usize, bytes: &[u8]) {
        let want = self.inputs[idx].shape.size_bytes().unwrap_or(0);
        assert_eq!(
            bytes.len(),
            want,
            "input byte length checked by the runtime"
        );
        // SAFETY: the arena slot has exactly `want` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.input_ptrs[idx].0, want) };
    }

    /// Copy the bytes of param `idx` (exactly its byte size).
    pub fn write_param(&mut self, idx: usize, bytes: &[u8]) {
        let b = &self.param_bufs[idx];
        assert_eq!(
            bytes.len(),
            b.len(),
            "param byte length checked by the runtime"
        );
        self.write_param_range(idx, 0, bytes);
    }

    /// Overwrite bytes `offset..offset + bytes.len()` of param `idx`.
    pub fn write_param_range(&mut self, idx: usize, offset: usize, bytes: &[u8]) {
        let b = &self.param_bufs[idx];
        assert!(
            offset + bytes.len() <= b.len(),
            "param range checked by the runtime"
        );
        // SAFETY: every run lies inside the param buffer (the range is checked above and a
        // panel layout is a permutation of the buffer's elements).
        stored_runs(
            self.param_panels[idx],
            offset..offset + bytes.len(),
            |at, to, len| unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr().add(at - offset), b.ptr().add(to), len)
            },
        );
    }

    /// Read param `idx` back into `out`.
    pub fn read_param(&self, idx: usize, out: &mut [u8]) {
        let b = &self.param_bufs[idx];
        let len = b.len().min(out.len());
        // SAFETY: as in `write_param_range`; `out` holds `len` bytes.
        stored_runs(self.param_panels[idx], 0..len, |at, from, n| unsafe {
            std::ptr::copy_nonoverlapping(b.ptr().add(from), out.as_mut_ptr().add(at), n)
        });
    }

    /// Run the program on the current inputs and params.
    pub fn execute(&mut self) {
        match &mut self.profile {
            None => {
                for s in &self.steps {
                    s.run(&self.pool);
                }
            }
            Some(prof) => {
                for (s, p) in self.steps.iter().zip(prof.iter_mut()) {
                    let t = std::time::Instant::now();
                    s.run(&self.pool);
                    p.0 += t.elapsed().as_nanos() as u64;
                    p.1 += 1;
                }
            }
        }
    }

    /// Copy output `idx` (dense, row-major) into `out` (exactly its byte size).
    pub fn read_output(&self, idx: usize, out: &mut [u8]) {
        kernels::materialize(&self.output_refs[idx], out);
    }

    /// Overwrite param `param` with output `output` (same shape and dtype).
    pub fn assign_param(&mut self, param: usize, output: usize) {
        let src = self.output_refs[output];
        let dst = &self.param_bufs[param];
        if src.ptr.0 == dst.ptr() || self.param_panels[param].is_some() {
            if src.layout.is_contiguous() && src.layout.offset == 0 {
                return; // the output is the param itself
            }
            let mut tmp = vec![0u8; dst.len()];
            kernels::materialize(&src, &mut tmp);
            self.write_param(param, &tmp);
            return;
        }
        // SAFETY: the param buffer has exactly the output's byte size (checked by the runtime)
        // and does not overlap the output's buffer.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.ptr(), dst.len()) };
        kernels::materialize(&src, out);
    }
}

impl Executable for Program {
    fn inputs(&self) -> &[IoSlot] {
        &self.inputs
    }

    fn params(&self) -> &[IoSlot] {
        &self.params
    }

    fn outputs(&self) -> &[IoSlot] {
        &self.outputs
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn write_input(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.inputs[idx];
        if Some(bytes.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("input", slot, bytes.len()));
        }
        Program::write_input(self, idx, bytes);
        Ok(())
    }

    fn write_param(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.params[idx];
        if Some(bytes.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("param", slot, bytes.len()));
        }
        Program::write_param(self, idx, bytes);
        Ok(())
    }

    fn write_param_range(&mut self, idx: usize, offset: usize, bytes: &[u8]) -> Result<()> {
        let len = self.param_bufs[idx].len();
        if offset.checked_add(bytes.len()).is_none_or(|e| e > len) {
            return Err(Error::Invalid(format!(
                "bytes {offset}..+{} are outside param \"{}\" ({len} bytes)",
                bytes.len(),
                self.params[idx].name
            )));
        }
        Program::write_param_range(self, idx, offset, bytes);
        Ok(())
    }

    fn read_param(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.params[idx];
        if Some(out.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("param", slot, out.len()));
        }
        Program::read_param(self, idx, out);
        Ok(())
    }

    fn execute(&mut self) -> Result<()> {
        Program::execute(self);
        Ok(())
    }

    fn read_output(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.outputs[idx];
        if Some(out.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("output", slot, out.len()));
        }
        Program::read_output(self, idx, out);
        Ok(())
    }

    fn assign_param(&mut self, param: usize, output: usize) -> Result<()> {
        let (p, o) = (&self.params[param], &self.outputs[output]);
        if p.shape != o.shape {
            return Err(Error::Invalid(format!(
                "output {output} ({}) cannot overwrite param \"{}\" ({})",
                o.shape, p.name, p.shape
            )));
        }
        Program::assign_param(self, param, output);
        Ok(())
    }
}
