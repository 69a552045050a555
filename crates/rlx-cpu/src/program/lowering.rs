//! The first phase of [`super::lower`]: each node becomes a value (an input, param or constant
//! buffer, a view, or the output of a pending step) with the arena requests it needs.

use super::chain::chain_of;
use super::{Buf, Program, Val};
use crate::buffer::Buffer;
use crate::kernels::{self, Lowered, NodeInfo};
use crate::layout::{Layout, MAX_RANK};
use kernels::gemm::half::PANEL;
use rlx_driver::IoSlot;
use rlx_ir::{DType, Error, Graph, Node, NodeId, Op, Result, Shape};
use rlx_opt::{BufferRequest, LoweringPlan, Skip};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub(super) fn check_node(g: &Graph, id: rlx_ir::NodeId) -> Result<Vec<usize>> {
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
    let complex_ok = n.op.is_leaf() || kernels::takes_complex(&n.op);
    if dims.len() > MAX_RANK || (n.shape.dtype() == DType::C64 && !complex_ok) {
        return Err(Error::Unsupported {
            backend: "cpu".into(),
            op: n.op.name().into(),
            node: id,
            msg: format!(
                "shape {} (the CPU backend handles rank <= {MAX_RANK}, and c64 values only in complex, real, imag and fft)",
                n.shape
            ),
        });
    }
    Ok(dims)
}

/// A compute step before addresses are fixed: node, operand nodes, arena request of its output,
/// scratch request, kernel builder.
pub(super) type Pending = (usize, Vec<usize>, usize, Option<usize>, kernels::Build);

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

/// Params adding up to this many bytes or more share one buffer (in huge pages, see
/// [`Buffer::part`]); fewer get a buffer each.
const PARAM_SLAB_MIN: usize = 2 << 20;

/// Whether a program's params may share one buffer (`RLX_PARAM_SLAB=0`: one buffer each, for
/// A/B measurements).
fn param_slab_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !rlx_ir::env::is_off(rlx_ir::env::PARAM_SLAB))
}

/// What lowering a node needs to know of it besides the node: its result's dims, dtype and
/// bytes, its dense layout, and the index its step would have.
pub(super) struct At<'g> {
    pub(super) id: NodeId,
    pub(super) node: &'g Node,
    pub(super) dims: Vec<usize>,
    pub(super) dtype: DType,
    pub(super) bytes: usize,
    pub(super) dense: Layout,
    pub(super) step: usize,
}

/// The state threaded through the nodes of a graph as they are lowered in order.
pub(super) struct Lowering<'g> {
    pub(super) g: &'g Graph,
    pub(super) plan: &'g LoweringPlan,
    pub(super) threads: usize,
    pub(super) share: Option<&'g Program>,
    pub(super) vals: Vec<Val>,
    pub(super) reqs: Vec<BufferRequest>,
    pub(super) consts: Vec<Buffer>,
    pub(super) param_bufs: Vec<Arc<Buffer>>,
    pub(super) param_panels: Vec<Option<[usize; 2]>>,
    /// Param nodes stored in column panels (the plan's, less those shared row-major).
    pub(super) panel_nodes: HashSet<usize>,
    pub(super) inputs: Vec<IoSlot>,
    pub(super) params: Vec<IoSlot>,
    pub(super) input_reqs: Vec<usize>,
    pub(super) pending: Vec<Pending>,
    /// Values computed by the step of an earlier node (further results of a region).
    pub(super) computed: HashMap<usize, Val>,
    /// Profile name and description of each chain step, by node.
    pub(super) chain_steps: HashMap<usize, (&'static str, String)>,
    /// The buffer the params this program owns share, if they do, and the bytes of it used.
    pub(super) slab: Option<Arc<Buffer>>,
    pub(super) slab_used: usize,
    pub(super) shared: kernels::Shared,
}

impl<'g> Lowering<'g> {
    pub(super) fn new(
        g: &'g Graph,
        plan: &'g LoweringPlan,
        threads: usize,
        share: Option<&'g Program>,
    ) -> Result<Self> {
        let vals: Vec<Val> = Vec::with_capacity(g.len());
        // The params this program owns (not shared with `share`) live in one buffer when they
        // add up to a huge page or more, each at a multiple of 64 bytes (see `Buffer::part`).
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
        Ok(Lowering {
            g,
            plan,
            threads,
            share,
            vals,
            reqs: Vec::new(),
            consts: Vec::new(),
            param_bufs: Vec::new(),
            param_panels: Vec::new(),
            panel_nodes: HashSet::new(),
            inputs: Vec::new(),
            params: Vec::new(),
            input_reqs: Vec::new(),
            pending: Vec::new(),
            computed: Default::default(),
            chain_steps: Default::default(),
            slab,
            slab_used: 0,
            shared: kernels::Shared::default(),
        })
    }

    /// Lower node `id`, the next in order: its value joins `vals`.
    pub(super) fn node(&mut self, id: NodeId) -> Result<()> {
        let g = self.g;
        if let Some(v) = (!self.computed.is_empty())
            .then(|| self.computed.remove(&id.index()))
            .flatten()
        {
            self.vals.push(v);
            return Ok(());
        }
        let dims = check_node(g, id)?;
        let node = g.node(id);
        let dtype = node.shape.dtype();
        let bytes = dims.iter().product::<usize>() * dtype.size_bytes();
        let dense = Layout::contiguous(&dims);
        let step = self.pending.len();
        let chain = if node.op.is_leaf() {
            None
        } else {
            chain_of(g, id)
        };
        let at = At {
            id,
            node,
            dims,
            dtype,
            bytes,
            dense,
            step,
        };
        let val = match &node.op {
            Op::Input { name } => self.input(name, &at),
            Op::Param { name } => self.param(name, &at)?,
            Op::Constant { data } => self.constant(data, &at)?,
            _ if chain.is_some() => self.chain(chain.expect("checked"), &at)?,
            Op::Fused(r) if kernels::patterns::of(r).is_some() => {
                let p = kernels::patterns::of(r).expect("checked");
                self.pattern(p, r.output, &at)?
            }
            _ => self.kernel(&at)?,
        };
        self.vals.push(val);
        Ok(())
    }

    fn input(&mut self, name: &str, at: &At) -> Val {
        self.reqs.push(BufferRequest {
            size: at.bytes,
            start: 0,
            end: 0,
        });
        self.inputs.push(IoSlot {
            name: name.to_owned(),
            shape: at.node.shape.clone(),
        });
        self.input_reqs.push(self.reqs.len() - 1);
        Val {
            buf: Buf::Arena(self.reqs.len() - 1),
            layout: at.dense,
            dtype: at.dtype,
        }
    }

    fn param(&mut self, name: &str, at: &At) -> Result<Val> {
        let (id, node, dims, bytes) = (at.id, at.node, &at.dims, at.bytes);
        self.params.push(IoSlot {
            name: name.to_owned(),
            shape: node.shape.clone(),
        });
        let panels = match self.plan.panels(id) {
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
        let found = self.share.and_then(|p| {
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
            self.panel_nodes.insert(id.index());
        }
        self.param_panels.push(panels);
        let shared = found.map(|(p, i)| p.param_bufs[i].clone());
        let (slab, slab_used) = (&self.slab, &mut self.slab_used);
        let mut own = || match slab {
            Some(whole) if *slab_used + bytes <= whole.len() => {
                let b = Buffer::part(whole, *slab_used, bytes);
                *slab_used += bytes.next_multiple_of(64);
                Ok(b)
            }
            _ => Buffer::for_compile(bytes, || format!("param \"{name}\" ({})", node.shape)),
        };
        self.param_bufs.push(match shared {
            Some(b) => b,
            None => Arc::new(own()?),
        });
        Ok(Val {
            buf: Buf::Param(self.param_bufs.len() - 1),
            layout: at.dense,
            dtype: at.dtype,
        })
    }

    fn constant(&mut self, data: &[u8], at: &At) -> Result<Val> {
        let b = Buffer::for_compile(data.len(), || {
            format!("constant {} ({})", at.id, at.node.shape)
        })?;
        // SAFETY: `b` has `data.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr(), data.len()) };
        self.consts.push(b);
        Ok(Val {
            buf: Buf::Const(self.consts.len() - 1),
            layout: at.dense,
            dtype: at.dtype,
        })
    }

    /// Arena operands of a step stay live through it.
    pub(super) fn keep_live(&mut self, operands: impl IntoIterator<Item = usize>, step: usize) {
        for e in operands {
            if let Buf::Arena(r) = self.vals[e].buf {
                self.reqs[r].end = self.reqs[r].end.max(step);
            }
        }
    }

    /// What kernel lowering knows of the node at `at`.
    pub(super) fn info(&self, at: &At<'g>) -> NodeInfo<'_> {
        let (id, node, plan) = (at.id, at.node, self.plan);
        NodeInfo {
            node,
            id,
            ins: node
                .inputs
                .iter()
                .map(|i| self.vals[i.index()].layout)
                .collect(),
            in_dtypes: node
                .inputs
                .iter()
                .map(|i| self.vals[i.index()].dtype)
                .collect(),
            dims: at.dims.clone(),
            threads: self.threads,
            zeros: tri(plan.skip(id)),
            b_panels: matches!(node.op, Op::MatMul)
                && node
                    .inputs
                    .get(1)
                    .is_some_and(|b| self.panel_nodes.contains(&b.index())),
            consts: node
                .inputs
                .iter()
                .map(|i| {
                    let v = &self.vals[i.index()];
                    match v.buf {
                        Buf::Const(j) if v.layout.is_contiguous() && v.layout.offset == 0 => {
                            let b = &self.consts[j];
                            // SAFETY: the constant's buffer holds `len` bytes, written once at
                            // compile and never again.
                            Some(unsafe {
                                std::slice::from_raw_parts(b.ptr() as *const u8, b.len())
                            })
                        }
                        _ => None,
                    }
                })
                .collect(),
            shared: &self.shared,
            plan: self.plan,
        }
    }

    /// A node run by its own kernel (see [`kernels::lower`]): a view, an in-place update of a
    /// param, or a step computing a new value.
    fn kernel(&mut self, at: &At<'g>) -> Result<Val> {
        let (id, node, dtype, step) = (at.id, at.node, at.dtype, at.step);
        let plan = self.plan;
        let info = self.info(at);
        let operands = || node.inputs.iter().map(|i| i.index());
        Ok(match kernels::lower(&info)? {
            Lowered::View { src, layout } => {
                let s = self.vals[node.inputs[src].index()];
                Val {
                    buf: s.buf,
                    layout,
                    dtype,
                }
            }
            Lowered::InPlace { src, build } => {
                let s = self.vals[node.inputs[src].index()];
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
                self.keep_live(operands(), step);
                let build: kernels::Build = Box::new(move |ins, out, _| build(ins, out));
                self.pending
                    .push((id.index(), operands().collect(), usize::MAX, None, build));
                s
            }
            Lowered::Compute { scratch, build } => {
                // Operands stay live through this step.
                self.keep_live(operands(), step);
                let out_req = self.request(at.bytes, step);
                let scratch_req = (scratch > 0).then(|| self.request(scratch, step));
                self.pending.push((
                    id.index(),
                    operands().collect(),
                    out_req,
                    scratch_req,
                    build,
                ));
                // The products' and attention's kernels write through their output
                // strides (rows apart, the last axis dense).
                let layout = if matches!(node.op, Op::MatMul | Op::Attention { .. }) {
                    output_layout(plan, id, &at.dims)
                } else {
                    at.dense
                };
                Val {
                    buf: Buf::Arena(out_req),
                    layout,
                    dtype,
                }
            }
        })
    }

    /// A new arena request of `size` bytes live during step `step` only.
    pub(super) fn request(&mut self, size: usize, step: usize) -> usize {
        self.reqs.push(BufferRequest {
            size,
            start: step,
            end: step,
        });
        self.reqs.len() - 1
    }
}
