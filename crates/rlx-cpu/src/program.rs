//! Compiling a graph into a CPU program: lower each node, plan one arena for every
//! intermediate, fix every buffer's address, then build the kernels.

use crate::buffer::Buffer;
use crate::kernels::{self, Kernel, Lowered, NodeInfo, Ptr, TRef};
use crate::layout::{Layout, MAX_RANK};
use crate::pool::Pool;
use rlx_driver::{Executable, IoSlot};
use rlx_ir::{DType, Error, Graph, Op, Result};
use rlx_opt::{plan_memory, BufferRequest};
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
    /// Computed inside a fused chain; never read outside it.
    Fused,
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

/// Fused elementwise groups: for each group's root (its last node), the members in order; for
/// every other member, its root.
struct Groups {
    members: std::collections::HashMap<usize, Vec<usize>>,
    member_of: Vec<Option<usize>>,
    /// Members stored as extra results: graph outputs, and members read by steps after the group.
    stored: Vec<bool>,
}

/// The updates of `updates` that can be computed in place: `(node, param index)` for each
/// output node produced by a fused group (whose loop copes with its output aliasing a dense
/// operand) such that every step reading the param runs no later than that group, and the
/// group itself reads it only densely, element for element. The output's planned arena buffer
/// then goes unused.
fn donations(
    g: &Graph,
    groups: &Groups,
    vals: &[Val],
    pending: &[Pending],
    params: &[IoSlot],
    updates: &[(String, usize)],
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (name, o) in updates {
        let Some(v) = g.outputs().get(*o).map(|v| v.index()) else {
            continue;
        };
        let Some(p) = params.iter().position(|s| s.name == *name) else {
            continue;
        };
        // The step computing `v`: its own, or its group's (an extra result of a fused group).
        let owner = groups.member_of[v].unwrap_or(v);
        let Some(sv) = pending.iter().position(|e| e.0 == owner) else {
            continue;
        };
        let reads_p = |i: usize| matches!(vals[i].buf, Buf::Param(q) if q == p);
        let dense_like_v = |i: usize| {
            vals[i].layout.is_contiguous()
                && vals[i].layout.offset == 0
                && vals[i].layout.dims() == vals[v].layout.dims()
        };
        let ok = groups.members.contains_key(&owner)
            && kernels::fused::row_sum(g, rlx_ir::NodeId(owner as u32)).is_none()
            && matches!(vals[v].buf, Buf::Arena(_))
            && params[p].shape == *g.shape(rlx_ir::NodeId(v as u32))
            && g.outputs().iter().filter(|x| x.index() == v).count() == 1
            && !g.outputs().iter().any(|x| reads_p(x.index()))
            && !out.iter().any(|&(w, q)| w == v || q == p)
            && pending.iter().enumerate().all(|(s, e)| {
                e.1.iter()
                    .all(|&i| !reads_p(i) || s < sv || (s == sv && dense_like_v(i)))
            });
        if ok {
            out.push((v, p));
        }
    }
    out
}

/// Form groups of fusible nodes, from the outputs back: a fusible node joins the (earliest)
/// group of one of its users when every user outside that group runs after the group's root,
/// it has the group's dims, and it reads no param that a `CacheWrite` updates in place (members
/// run at the root's position, so they must not read state written in between). A member that
/// is a graph output or has users outside the group is stored by the group as an extra result
/// (an optimizer's new moments beside the new param; a normalized value beside its scaled
/// one). Values outside a group that a member reads are computed before the root, and values
/// of members read outside it only after, so groups never form cycles with the rest of the
/// graph.
fn fusion_groups(g: &Graph, users: &[Vec<usize>], fuse: bool) -> Groups {
    let mut member_of = vec![None; g.len()];
    if !fuse {
        return Groups {
            members: Default::default(),
            member_of,
            stored: Vec::new(),
        };
    }
    let mut written: Vec<bool> = vec![false; g.len()];
    for id in g.ids() {
        let n = g.node(id);
        if matches!(n.op, Op::CacheWrite) {
            written[n.inputs[0].index()] = true;
        }
    }
    // Root of each fusible node's group (itself when it starts one). A row-summing Reduce
    // starts a group of the elementwise nodes computing its operand; their dims are the
    // operand's, and none of them may be a graph output (it would be stored at other dims).
    let mut root: Vec<Option<usize>> = vec![None; g.len()];
    let is_output = |i: usize| g.outputs().iter().any(|o| o.index() == i);
    let group_dims = |r: usize| {
        let n = g.node(rlx_ir::NodeId(r as u32));
        let d = if matches!(n.op, Op::Reduce { .. }) {
            n.inputs[0]
        } else {
            rlx_ir::NodeId(r as u32)
        };
        g.shape(d).dims()
    };
    for id in g.ids().collect::<Vec<_>>().into_iter().rev() {
        let i = id.index();
        if !kernels::fused::fusible(g, id) {
            if kernels::fused::row_sum(g, id).is_some() {
                root[i] = Some(i);
            }
            continue;
        }
        // Join the earliest group of a user such that every user outside it runs after it
        // (the node is then also stored, for those users, as an extra result of the group).
        let mut candidates: Vec<usize> = users[i].iter().filter_map(|&u| root[u]).collect();
        candidates.sort_unstable();
        let group = candidates.into_iter().find(|&r| {
            let reduce = matches!(g.node(rlx_ir::NodeId(r as u32)).op, Op::Reduce { .. });
            let outside = |u: usize| root[u] != Some(r);
            !g.node(id).inputs.iter().any(|x| written[x.index()])
                && users[i].iter().all(|&u| !outside(u) || (u > r && !reduce))
                && g.shape(id).dims() == group_dims(r)
                && (!reduce || !is_output(i))
        });
        root[i] = Some(group.unwrap_or(i));
    }
    let mut members: std::collections::HashMap<usize, Vec<usize>> = Default::default();
    for (i, r) in root.iter().enumerate() {
        if let Some(r) = *r {
            members.entry(r).or_default().push(i);
        }
    }
    // A lone activation also runs as a group: the group loop is compiled for the widest vector
    // unit (the separate kernel for AVX2 at most), which pays for the transcendental ones. A
    // Reduce no elementwise node joined stays a plain Reduce.
    members.retain(|&r, m| {
        m.len() > 1 || matches!(g.node(rlx_ir::NodeId(r as u32)).op, Op::Activation(_))
    });
    let mut stored = vec![false; g.len()];
    for (&r, m) in &members {
        for &i in m {
            if i != r {
                member_of[i] = Some(r);
                stored[i] = is_output(i) || users[i].iter().any(|&u| root[u] != Some(r));
            }
        }
    }
    Groups {
        members,
        member_of,
        stored,
    }
}

/// The instructions of a group and its external operands (node indices, in first-use order).
fn chain(g: &Graph, members: &[usize]) -> (Vec<kernels::fused::Instr>, Vec<usize>) {
    use kernels::fused::{Instr, Src};
    let mut ext: Vec<usize> = Vec::new();
    let mut code = Vec::new();
    let src = |i: usize, ext: &mut Vec<usize>| -> Src {
        match members.iter().position(|&m| m == i) {
            Some(j) => Src::Tmp(j),
            None => Src::Ext(ext.iter().position(|&e| e == i).unwrap_or_else(|| {
                ext.push(i);
                ext.len() - 1
            })),
        }
    };
    for &m in members {
        let n = g.node(rlx_ir::NodeId(m as u32));
        code.push(match &n.op {
            Op::Binary(b) => {
                let a = src(n.inputs[0].index(), &mut ext);
                let c = src(n.inputs[1].index(), &mut ext);
                Instr::Binary(*b, a, c)
            }
            Op::Activation(a) => Instr::Unary(*a, src(n.inputs[0].index(), &mut ext)),
            _ => unreachable!("only fusible ops join chains"),
        });
    }
    (code, ext)
}

/// The layout a computed value is stored in: dense, except for an f32 MatMul whose one user
/// is a Transpose that keeps the column axis last (attention's `[b, h, t, d] -> [b, t, h, d]`
/// before heads are merged): the product is stored in the transposed order, so the Transpose
/// is a dense view and the Reshape after it needs no copy. The GEMM writes C rows `ldc` apart.
fn output_layout(g: &Graph, id: rlx_ir::NodeId, users: &[usize], dims: &[usize]) -> Layout {
    let dense = Layout::contiguous(dims);
    let n = g.node(id);
    if !matches!(n.op, Op::MatMul) || n.shape.dtype() != DType::F32 || g.outputs().contains(&id) {
        return dense;
    }
    let [u] = users else { return dense };
    let Op::Transpose { perm } = &g.node(rlx_ir::NodeId(*u as u32)).op else {
        return dense;
    };
    let r = dims.len();
    if perm.len() != r || r < 3 || perm[r - 1] != r - 1 {
        return dense;
    }
    let transposed: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let mut inverse = vec![0; r];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    Layout::contiguous(&transposed).permute(&inverse)
}

/// For a constant `[t, u]` f32 mask that is -inf exactly at columns past `row + off` and
/// finite elsewhere (causal attention's), `Some(off)`.
fn mask_offset(g: &Graph, id: rlx_ir::NodeId) -> Option<isize> {
    let n = g.node(id);
    let Op::Constant { data } = &n.op else {
        return None;
    };
    let d = n.shape.static_dims()?;
    if n.shape.dtype() != DType::F32 || d.len() != 2 || d[0] == 0 || d[1] == 0 {
        return None;
    }
    let v = |i: usize, j: usize| {
        f32::from_le_bytes(
            data[(i * d[1] + j) * 4..(i * d[1] + j) * 4 + 4]
                .try_into()
                .expect("4 bytes"),
        )
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
/// column is past the row by more than `off` — causal attention's probabilities (a softmax of
/// scores plus a constant mask that is -inf exactly there) and what multiplies them (the
/// softmax's gradient). Assumes the scores are finite (as attention kernels that skip the
/// masked part do).
fn causal_zeros(g: &Graph) -> Vec<Option<isize>> {
    let tail = |id: rlx_ir::NodeId| -> Option<(usize, usize)> {
        let d = g.shape(id).static_dims()?;
        (d.len() >= 2).then(|| (d[d.len() - 2], d[d.len() - 1]))
    };
    let mask_off = |id: rlx_ir::NodeId| mask_offset(g, id);
    let mut z: Vec<Option<isize>> = vec![None; g.len()];
    for id in g.ids() {
        let n = g.node(id);
        z[id.index()] = match &n.op {
            Op::Softmax { axis } if *axis + 1 == n.shape.rank() => {
                let x = g.node(n.inputs[0]);
                match (&x.op, tail(n.inputs[0])) {
                    (Op::Binary(rlx_ir::BinaryOp::Add), Some(t)) => {
                        x.inputs.iter().find_map(|&c| {
                            mask_off(c).filter(|_| {
                                g.shape(c).static_dims().is_some_and(|d| (d[0], d[1]) == t)
                            })
                        })
                    }
                    _ => None,
                }
            }
            Op::Binary(rlx_ir::BinaryOp::Mul) => {
                let t = tail(id);
                n.inputs
                    .iter()
                    .find_map(|&a| z[a.index()].filter(|_| tail(a) == t))
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
/// softmax gradient before its product with the probabilities). A product may leave those
/// elements out; under the same assumption of finite values, writing zeros there instead gives
/// the same results.
fn causal_unneeded(g: &Graph, zeros: &[Option<isize>]) -> Vec<Option<isize>> {
    let tail = |id: rlx_ir::NodeId| -> Option<(usize, usize)> {
        let d = g.shape(id).static_dims()?;
        (d.len() >= 2).then(|| (d[d.len() - 2], d[d.len() - 1]))
    };
    let mut users: Vec<Vec<rlx_ir::NodeId>> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for &i in &g.node(id).inputs {
            users[i.index()].push(id);
        }
    }
    let ids: Vec<rlx_ir::NodeId> = g.ids().collect();
    let mut unneeded: Vec<Option<isize>> = vec![None; g.len()];
    for &id in ids.iter().rev() {
        let t = tail(id);
        if t.is_none()
            || users[id.index()].is_empty()
            || g.outputs().contains(&id)
            || g.shape(id).dtype() != DType::F32
        {
            continue;
        }
        // The region every reader ignores is the intersection of theirs (the largest offset).
        let reader = |u: rlx_ir::NodeId| -> Option<isize> {
            let n = g.node(u);
            let other = n.inputs.iter().copied().find(|&i| i != id);
            let own = unneeded[u.index()].filter(|_| tail(u) == t);
            match &n.op {
                Op::Binary(rlx_ir::BinaryOp::Add) => other
                    .and_then(|c| mask_offset(g, c))
                    .filter(|_| other.and_then(tail) == t)
                    .or(own),
                Op::Binary(rlx_ir::BinaryOp::Mul) => other
                    .and_then(|y| zeros[y.index()].filter(|_| tail(y) == t))
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

/// How a MatMul's GEMM may skip depths, from [`causal_zeros`] of its operands, or else tiles
/// of its result, from [`causal_unneeded`].
fn matmul_zeros(
    g: &Graph,
    id: rlx_ir::NodeId,
    z: &[Option<isize>],
    unneeded: &[Option<isize>],
) -> kernels::gemm::Tri {
    use kernels::gemm::Tri;
    let n = g.node(id);
    if !matches!(n.op, Op::MatMul) || n.shape.dtype() != DType::F32 {
        return Tri::Full;
    }
    let (a, b) = (n.inputs[0], n.inputs[1]);
    if let Some(off) = z[a.index()] {
        return Tri::RowMax(off);
    }
    let an = g.node(a);
    if let Op::Transpose { perm } = &an.op {
        let r = perm.len();
        let swaps_last = r >= 2
            && perm[r - 1] == r - 2
            && perm[r - 2] == r - 1
            && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p);
        if let Some(off) = z[an.inputs[0].index()].filter(|_| swaps_last) {
            return Tri::RowMin(off);
        }
    }
    z[b.index()]
        .map(Tri::ColMin)
        .or(unneeded[id.index()].map(Tri::Unneeded))
        .unwrap_or(Tri::Full)
}

/// Whether elementwise fusion is on: yes unless `RLX_FUSION=0`.
fn fusion_enabled() -> bool {
    std::env::var_os("RLX_FUSION").is_none_or(|v| v != "0")
}

/// Compile `g` (verified, decomposed to supported ops) for `threads` threads, with elementwise
/// fusion unless `RLX_FUSION=0` (fused and unfused programs give bit-identical results).
pub fn compile(g: &Graph, threads: usize) -> Result<Program> {
    compile_with_fusion(g, threads, fusion_enabled())
}

/// [`compile`] with params that have the same name and shape as a param of `share` using that
/// param's storage (see `Backend::compile_sharing`).
pub fn compile_shared(g: &Graph, threads: usize, share: Option<&Program>) -> Result<Program> {
    compile_inner(g, threads, fusion_enabled(), share, &[])
}

/// [`compile`] with elementwise fusion switched explicitly.
pub fn compile_with_fusion(g: &Graph, threads: usize, fuse: bool) -> Result<Program> {
    compile_inner(g, threads, fuse, None, &[])
}

/// [`compile`] for a graph whose outputs will overwrite params after each run (`(param name,
/// output index)`, see `CompileOptions::updates`): an output computed by a fused elementwise
/// group, when no later step reads the param's old value and the group reads it only at the
/// element it writes, is written straight into the param's storage. The program's outputs
/// then already are the params, and `assign_param` has nothing to copy.
pub fn compile_with_updates(
    g: &Graph,
    threads: usize,
    updates: &[(String, usize)],
) -> Result<Program> {
    compile_inner(g, threads, fusion_enabled(), None, updates)
}

fn compile_inner(
    g: &Graph,
    threads: usize,
    fuse: bool,
    share: Option<&Program>,
    updates: &[(String, usize)],
) -> Result<Program> {
    let threads = threads.max(1);
    let mut vals: Vec<Val> = Vec::with_capacity(g.len());
    let mut reqs: Vec<BufferRequest> = Vec::new();
    let mut consts: Vec<Buffer> = Vec::new();
    let mut param_bufs: Vec<Arc<Buffer>> = Vec::new();
    let (mut inputs, mut params) = (Vec::new(), Vec::new());
    let mut input_reqs = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    // The steps reading each node, in node order (a node reading a value twice is listed twice).
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for i in &g.node(id).inputs {
            users[i.index()].push(id.index());
        }
    }
    let groups = fusion_groups(g, &users, fuse);
    let (zeros, unneeded) = if std::env::var_os("RLX_CAUSAL_SKIP").is_some_and(|v| v == "0") {
        (vec![None; g.len()], vec![None; g.len()])
    } else {
        let z = causal_zeros(g);
        let u = causal_unneeded(g, &z);
        (z, u)
    };
    for id in g.ids() {
        if groups.member_of[id.index()].is_some() {
            vals.push(Val {
                buf: Buf::Fused,
                layout: Layout::contiguous(&[]),
                dtype: g.shape(id).dtype(),
            });
            continue;
        }
        let dims = check_node(g, id)?;
        let node = g.node(id);
        let dtype = node.shape.dtype();
        let bytes = dims.iter().product::<usize>() * dtype.size_bytes();
        let dense = Layout::contiguous(&dims);
        let step = pending.len();
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
                let shared = share.and_then(|p| {
                    let i = p
                        .params
                        .iter()
                        .position(|s| s.name == *name && s.shape == node.shape)?;
                    Some(p.param_bufs[i].clone())
                });
                param_bufs.push(shared.unwrap_or_else(|| Arc::new(Buffer::zeroed(bytes))));
                Val {
                    buf: Buf::Param(param_bufs.len() - 1),
                    layout: dense,
                    dtype,
                }
            }
            Op::Constant { data } => {
                consts.push(Buffer::from_bytes(data));
                Val {
                    buf: Buf::Const(consts.len() - 1),
                    layout: dense,
                    dtype,
                }
            }
            _ if groups.members.contains_key(&id.index()) => {
                // A group ending in a row sum: its members compute the Reduce's operand.
                let rows = kernels::fused::row_sum(g, id);
                let members = &groups.members[&id.index()];
                let elementwise = if rows.is_some() {
                    &members[..members.len() - 1]
                } else {
                    &members[..]
                };
                let (code, ext) = chain(g, elementwise);
                let group_dims = g
                    .shape(rlx_ir::NodeId(
                        *elementwise.last().expect("a group has a member") as u32,
                    ))
                    .static_dims()
                    .expect("checked static");
                let block = kernels::fused::block_len(rows.map(|r| r.row));
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
                    size: kernels::fused::scratch_bytes(ext.len(), code.len(), threads, block),
                    start: step,
                    end: step,
                });
                let scratch_req = Some(reqs.len() - 1);
                // Members that are graph outputs get buffers of their own, written by the group
                // too; they follow the external operands in the step's operand list.
                let mut extra = Vec::new();
                let mut operands = ext.clone();
                for (j, &m) in members.iter().enumerate() {
                    if m != id.index() && groups.stored[m] {
                        reqs.push(BufferRequest {
                            size: bytes,
                            start: step,
                            end: step,
                        });
                        vals[m] = Val {
                            buf: Buf::Arena(reqs.len() - 1),
                            layout: dense,
                            dtype,
                        };
                        extra.push(j);
                        operands.push(m);
                    }
                }
                let n_ext = ext.len();
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
                    zeros: matmul_zeros(g, id, &zeros, &unneeded),
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
                        Val {
                            buf: Buf::Arena(out_req),
                            layout: output_layout(g, id, &users[id.index()], &dims),
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
    let donated = donations(g, &groups, &vals, &pending, &params, updates);
    for &(vi, p) in &donated {
        vals[vi].buf = Buf::Param(p);
    }
    let plan = plan_memory(&reqs, 64);
    let arena = Buffer::zeroed(plan.arena_size);
    let base = |b: Buf| -> Ptr {
        // SAFETY: offsets from the plan lie within the arena.
        Ptr(match b {
            Buf::Arena(r) => unsafe { arena.ptr().add(plan.offsets[r]) },
            Buf::Param(i) => param_bufs[i].ptr(),
            Buf::Const(i) => consts[i].ptr(),
            Buf::Fused => unreachable!("fused intermediates are only read inside their group"),
        })
    };
    let tref = |v: &Val| TRef {
        ptr: base(v.buf),
        layout: v.layout,
        dtype: v.dtype,
    };
    let mut steps = Vec::with_capacity(nsteps);
    let mut step_ops = Vec::with_capacity(nsteps);
    let by_node = std::env::var_os("RLX_PROFILE").is_some_and(|v| v == "nodes");
    let mut step_desc = by_node.then(Vec::new);
    for (node, operands, out_req, scratch_req, build) in pending {
        let n = g.node(rlx_ir::NodeId(node as u32));
        // Whether the step is a group that runs as the one-pass Adam update (`fused::build`
        // decides the same way).
        let adam = groups.members.get(&node).is_some_and(|m| {
            let id = rlx_ir::NodeId(node as u32);
            kernels::fused::row_sum(g, id).is_none() && {
                let (code, ext) = chain(g, m);
                let layouts: Vec<Layout> = ext.iter().map(|&e| vals[e].layout).collect();
                let extra: Vec<usize> = (0..m.len())
                    .filter(|&j| m[j] != node && groups.stored[m[j]])
                    .collect();
                let dims = g.shape(id).static_dims().unwrap_or_default();
                kernels::fused::as_adam(&code, &layouts, &dims, &extra, None).is_some()
            }
        });
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
            let what = match groups.members.get(&node) {
                Some(m) => {
                    let names: Vec<&str> = m
                        .iter()
                        .map(|&i| g.node(rlx_ir::NodeId(i as u32)).op.name())
                        .collect();
                    format!(
                        "fused group of {} ({}){}",
                        m.len(),
                        names.join(" "),
                        if adam { " as one Adam pass" } else { "" }
                    )
                }
                None => match matmul_zeros(g, rlx_ir::NodeId(node as u32), &zeros, &unneeded) {
                    kernels::gemm::Tri::Full => n.op.name().to_string(),
                    tri => format!("{} (skipping zeros: {tri:?})", n.op.name()),
                },
            };
            d.push(format!(
                "{} {what} ({}) -> {}",
                rlx_ir::NodeId(node as u32),
                ins.join(", "),
                g.shape(rlx_ir::NodeId(node as u32))
            ));
        }
        step_ops.push(match &n.op {
            _ if adam => "adam",
            _ if groups.members.contains_key(&node) => "fused",
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
    let profile = std::env::var_os("RLX_PROFILE").map(|_| vec![(0, 0); steps.len()]);
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
        output_refs,
        arena_bytes: plan.arena_size,
        in_place_updates: donated.len(),
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
            let top = std::env::var("RLX_PROFILE_TOP")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(30);
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

    fn write_input(&mut self, idx: usize, bytes: &[u8]) {
        let want = self.inputs[idx].shape.size_bytes().unwrap_or(0);
        assert_eq!(
            bytes.len(),
            want,
            "input byte length checked by the runtime"
        );
        // SAFETY: the arena slot has exactly `want` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.input_ptrs[idx].0, want) };
    }

    fn write_param(&mut self, idx: usize, bytes: &[u8]) {
        let b = &self.param_bufs[idx];
        assert_eq!(
            bytes.len(),
            b.len(),
            "param byte length checked by the runtime"
        );
        // SAFETY: the param buffer has exactly `b.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.ptr(), b.len()) };
    }

    fn write_param_range(&mut self, idx: usize, offset: usize, bytes: &[u8]) {
        let b = &self.param_bufs[idx];
        assert!(
            offset + bytes.len() <= b.len(),
            "param range checked by the runtime"
        );
        // SAFETY: the range lies inside the param buffer.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.ptr().add(offset), bytes.len()) };
    }

    fn read_param(&self, idx: usize, out: &mut [u8]) {
        let b = &self.param_bufs[idx];
        // SAFETY: lengths checked by the caller; `out.len() == b.len()`.
        unsafe { std::ptr::copy_nonoverlapping(b.ptr(), out.as_mut_ptr(), b.len().min(out.len())) };
    }

    fn execute(&mut self) {
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

    fn read_output(&self, idx: usize, out: &mut [u8]) {
        kernels::materialize(&self.output_refs[idx], out);
    }

    fn assign_param(&mut self, param: usize, output: usize) {
        let src = self.output_refs[output];
        let dst = &self.param_bufs[param];
        if src.ptr.0 == dst.ptr() {
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
