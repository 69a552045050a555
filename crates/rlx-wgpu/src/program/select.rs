//! The first phase of [`super::compile`]: each node's kernel, chosen by op family, and the
//! arena requests (sizes and live step ranges) of the values, in node order.

use super::kernel::{
    axis_len_in, broadcast_strides, dense_strides, dims, Elementwise, Kernel, Movement, QuantKv,
    Reduction, SumAt,
};
use super::{unsupported, GpuProgram, Loc};
use crate::values::Form;
use crate::{shaders, Gpu};
use rlx_driver::IoSlot;
use rlx_ir::ops::complex::{primitive_of, Primitive};
use rlx_ir::{Error, Graph, Node, NodeId, Op, Result};
use rlx_opt::BufferRequest;

/// The kernels of a graph's steps and the words of its values.
pub(super) struct Selection {
    /// Params in the params buffer: byte offset of each node that is one (or an alias of one).
    pub(super) pbuf_of: Vec<Option<u64>>,
    /// Bytes of the params buffer this graph's own params take.
    pub(super) pbuf_size: u64,
    /// Each param's offset in the params buffer, or `None` for one in the arena.
    pub(super) param_loc: Vec<Option<u64>>,
    /// Arena request of each node's words (aliases share one), in node order.
    pub(super) req_of: Vec<Option<usize>>,
    /// Bytes from the start of its request (or param) at which each node's words begin: non-zero
    /// for a view of part of another value ([`rlx_driver::views::narrow_view`]).
    pub(super) off_of: Vec<usize>,
    /// The arena requests.
    pub(super) reqs: Vec<BufferRequest>,
    /// The steps: the node each computes (for) and its kernel.
    pub(super) pending: Vec<(usize, Kernel)>,
    /// The constants: arena request, bytes, form.
    pub(super) consts: Vec<(usize, Vec<u8>, Form)>,
    pub(super) inputs: Vec<IoSlot>,
    pub(super) params: Vec<IoSlot>,
    /// Arena request of each input.
    pub(super) input_req: Vec<usize>,
    /// Arena request of each param (`usize::MAX` for one in the params buffer).
    pub(super) param_req: Vec<usize>,
    /// Further results: computed by the step of node.
    extra_of: Vec<Option<usize>>,
    /// Rotations written into the cache by the cache write reading them
    /// (`rlx_opt::ropes_into_cache_writes`): by the cache write's node, the rotation.
    rope_of: Vec<Option<NodeId>>,
}

/// The node being lowered.
struct At<'a> {
    id: NodeId,
    i: usize,
    node: &'a Node,
    /// Its dims.
    d: Vec<usize>,
    /// Its form.
    form: Form,
    /// Bytes of its words.
    bytes: u64,
    /// The index of its first step.
    step: usize,
    /// Its operands' indices.
    ins: Vec<usize>,
}

/// Choose the kernels of `g`'s nodes (`form`: each value's form); params that `share` holds in
/// its params buffer are placed there.
pub(super) fn select(
    gpu: &Gpu,
    g: &Graph,
    share: Option<&GpuProgram>,
    form: &[Form],
) -> Result<Selection> {
    let n = g.len();
    let mut s = Selection {
        pbuf_of: vec![None; n],
        pbuf_size: 0,
        param_loc: Vec::new(),
        req_of: vec![None; n],
        off_of: vec![0; n],
        reqs: Vec::new(),
        pending: Vec::new(),
        consts: Vec::new(),
        inputs: Vec::new(),
        params: Vec::new(),
        input_req: Vec::new(),
        param_req: Vec::new(),
        extra_of: vec![None; n],
        rope_of: rlx_opt::ropes_into_cache_writes(g, &|g, rope, _| crate::nn::native(g, rope)),
    };
    let mut into_cache = vec![false; n];
    for r in s.rope_of.iter().flatten() {
        into_cache[r.index()] = true;
    }
    for id in g.ids() {
        check(gpu, g, id)?;
        let i = id.index();
        let node = g.node(id);
        let d = dims(g, id)?;
        let elems = d.iter().product::<usize>().max(1);
        let at = At {
            id,
            i,
            node,
            bytes: form[i].bytes(elems) as u64,
            step: s.pending.len(),
            ins: node.inputs.iter().map(|x| x.index()).collect(),
            d,
            form: form[i],
        };
        // Operands stay live through this step.
        s.keep_operands(node, at.step);
        if s.extra_of[i].is_some() || into_cache[i] {
            continue;
        }
        let kernel = match &node.op {
            Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => {
                s.leaf(share, form, &at)?;
                None
            }
            Op::Fused(r) if r.kind == rlx_ir::FusionKind::NormMatMul => s.norm_product(g, &at)?,
            Op::Binary(_)
            | Op::Activation(_)
            | Op::Compare(_)
            | Op::Where
            | Op::Cast { .. }
            | Op::Fused(_) => Some(s.elementwise(g, &at)?),
            Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Narrow { .. }
            | Op::Expand { .. }
            | Op::Concat { .. }
            | Op::Gather { .. }
            | Op::ScatterAdd { .. } => s.movement(g, &at)?,
            Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Attention { .. }
            | Op::Rope { .. }
            | Op::Conv(_)
            | Op::Pool(_) => Some(Kernel::Native),
            Op::Reduce { .. } | Op::Softmax { .. } | Op::Cumsum { .. } | Op::TopK { .. } => {
                Some(reduction(&at)?)
            }
            Op::MatMul => Some(Kernel::MatMul {
                a: at.ins[0],
                b: at.ins[1],
            }),
            Op::DequantMatMul { .. }
            | Op::DequantizeRows { .. }
            | Op::CachedAttention { .. }
            | Op::CacheWrite => s.quant_kv(g, &at)?,
            Op::Defined(_) => match primitive_of(&node.op) {
                Some(p) => s.complex(g, &at, p)?,
                None if crate::registered::kernel_for(g, id).is_some() => Some(Kernel::Registered),
                None => return Err(no_kernel(&node.op, id)),
            },
            other => return Err(no_kernel(other, id)),
        };
        if let Some(kernel) = kernel {
            s.place(g, &at, kernel)?;
        }
    }
    let nsteps = s.pending.len();
    for r in s.reqs.iter_mut() {
        r.end = r.end.min(nsteps);
    }
    for o in g.outputs() {
        if let Some(r) = s.req_of[o.index()] {
            s.reqs[r].end = nsteps;
        }
    }
    Ok(s)
}

/// Node `id` runs on `gpu`: it has a kernel ([`unsupported`]) and no invocation of it loops
/// longer than the adapter lets one.
fn check(gpu: &Gpu, g: &Graph, id: NodeId) -> Result<()> {
    let why = unsupported(g, id).or_else(|| {
        let n = loop_len(g, id, shaders::matvec_groups(gpu.loop_limited()));
        (gpu.loop_limited() && n > crate::nn::LOOP_LIMIT).then(|| {
            format!(
                "one invocation would loop {n} times; this adapter ({}) ends an invocation's loops after 65535",
                gpu.info.name
            )
        })
    });
    match why {
        Some(why) => Err(Error::Unsupported {
            backend: "wgpu".into(),
            op: g.node(id).op.name().into(),
            node: id,
            msg: why,
        }),
        None => Ok(()),
    }
}

/// Loop iterations one invocation of node `id`'s kernel runs, for the kernels that loop over a
/// whole axis (reductions, softmax, cumsum, top-k, multiply-reduce regions, products, cached
/// attention); 0 for the others (the native kernels of `nn` check their own).
fn loop_len(g: &Graph, id: NodeId, groups: usize) -> usize {
    let n = g.node(id);
    let axis_len = |x: NodeId, a: usize| axis_len_in(g, x, a);
    match &n.op {
        Op::Reduce { axes, .. } => {
            let m: usize = axes.iter().map(|&a| axis_len(n.inputs[0], a)).product();
            // Long rows take a workgroup per result: each invocation walks a 64th, then the tree.
            if m >= shaders::WIDE_REDUCE {
                m.div_ceil(shaders::WG as usize) + 8
            } else {
                m
            }
        }
        Op::Softmax { axis } | Op::Cumsum { axis } => {
            let len = axis_len(n.inputs[0], *axis);
            // Long rows take a workgroup per row; a tree or scan is log2(WG) steps.
            let chunks = len.div_ceil(shaders::WG as usize);
            let steps = shaders::WG.trailing_zeros() as usize;
            match (&n.op, len >= shaders::WIDE_ROW) {
                // Three walks over a 64th of the row, two trees.
                (Op::Softmax { .. }, true) => 3 * chunks + 2 * steps,
                // Per chunk of the row, one load and the scan's steps.
                (_, true) => chunks * (1 + steps),
                _ => 3 * len,
            }
        }
        // The contraction (the tiled product's tiles of 16, plus the loads).
        Op::MatMul => 2 * axis_len(n.inputs[0], g.shape(n.inputs[0]).rank() - 1),
        Op::DequantMatMul { .. } => product_loops(g, n.inputs[0], n.inputs[1], false, groups),
        // The product's loops, and the norm's: a walk over the rows to stage them, one per row
        // for its squares, a tree, a walk to scale them.
        Op::Fused(r) if r.kind == rlx_ir::FusionKind::NormMatMul => {
            rlx_opt::norm_matmul_parts(g, id)
                .map_or(0, |p| product_loops(g, p.x, p.w, true, groups))
        }
        // The weights step loops over the cache rows three times.
        Op::CachedAttention { .. } => 3 * axis_len(n.inputs[1], 0),
        // A pass over a 64th of the row and a tree for each result.
        Op::TopK { k, .. } => {
            let len = g
                .shape(n.inputs[0])
                .static_dims()
                .and_then(|d| d.last().copied());
            len.map_or(0, |l| k * (l.div_ceil(shaders::WG as usize) + 8) + 8)
        }
        Op::Fused(r) if r.kind == rlx_ir::FusionKind::MultiplyReduce => r
            .body
            .outputs()
            .first()
            .map_or(0, |&o| match &r.body.node(o).op {
                Op::Reduce { axes, .. } => {
                    let x = r.body.node(o).inputs[0];
                    axes.iter().map(|&a| axis_len_in(&r.body, x, a)).product()
                }
                _ => 0,
            }),
        Op::Defined(_) => crate::registered::kernel_for(g, id).map_or(0, |k| k.longest_loop),
        _ => 0,
    }
}

/// Loop iterations of an invocation of a GGUF product of activations `x` and weights `w`: each
/// of k weights decoded once for up to QROWS rows; a staged decode product takes several
/// columns in turn, after staging its activations (and, with `norm`, normalizing them).
fn product_loops(g: &Graph, x: NodeId, w: NodeId, norm: bool, groups: usize) -> usize {
    let rank = g.shape(x).rank();
    let k = axis_len_in(g, x, rank - 1);
    let xe: usize = (0..rank).map(|a| axis_len_in(g, x, a)).product();
    let rows = xe.checked_div(k).unwrap_or(0);
    let cols = axis_len_in(g, w, 0);
    let walk = xe.div_ceil(shaders::WG as usize);
    // (`rows`: all the product's rows, as the kernel choice counts them.)
    if shaders::matvec_staged(rows, xe) {
        shaders::matvec_columns(cols, k, groups) * shaders::matvec_column_loops(k)
            + 2 * walk
            + 64
            + if norm { 3 * walk + 16 * rows } else { 0 }
    } else {
        k * (shaders::QROWS as usize + 1)
    }
}

/// The error for an op no family lowers.
fn no_kernel(op: &Op, node: NodeId) -> Error {
    Error::Unsupported {
        backend: "wgpu".into(),
        op: op.name().into(),
        node,
        msg: "no WGSL kernel".into(),
    }
}

impl Selection {
    /// A request of the node's bytes, live over steps `start..=end`.
    fn request(&mut self, at: &At, start: usize, end: usize) -> usize {
        self.reqs.push(BufferRequest {
            size: at.bytes as usize,
            start,
            end,
        });
        self.reqs.len() - 1
    }

    /// Keep the words of `node`'s operands live through step `end`.
    fn keep_operands(&mut self, node: &Node, end: usize) {
        for x in &node.inputs {
            if let Some(r) = self.req_of[x.index()] {
                self.reqs[r].end = self.reqs[r].end.max(end);
            }
        }
    }

    /// The node's words, live from its first step to the one that computes it (a product may
    /// round its activations in a step before), and `kernel` as its last step.
    fn place(&mut self, g: &Graph, at: &At, kernel: Kernel) -> Result<()> {
        let r = self.request(at, at.step, self.pending.len());
        self.req_of[at.i] = Some(r);
        for &s in kernel.extra() {
            let sd = dims(g, NodeId(s as u32))?;
            self.reqs.push(BufferRequest {
                size: sd.iter().product::<usize>().max(1) * 4,
                start: at.step,
                end: at.step,
            });
            self.req_of[s] = Some(self.reqs.len() - 1);
        }
        self.pending.push((at.i, kernel));
        Ok(())
    }

    /// Inputs, params and constants: words of their own (a shared param: the other graph's).
    fn leaf(&mut self, share: Option<&GpuProgram>, form: &[Form], at: &At) -> Result<()> {
        let (i, node) = (at.i, at.node);
        match &node.op {
            Op::Input { name } => {
                self.inputs.push(IoSlot {
                    name: name.clone(),
                    shape: node.shape.clone(),
                });
                let r = self.request(at, 0, 0);
                self.input_req.push(r);
                self.req_of[i] = Some(r);
            }
            Op::Param { name } => {
                self.params.push(IoSlot {
                    name: name.clone(),
                    shape: node.shape.clone(),
                });
                let shared = share.and_then(|o| {
                    let k = o
                        .params
                        .iter()
                        .position(|p| p.name == *name && p.shape == node.shape)?;
                    if o.param_form[k] != form[i] {
                        return None;
                    }
                    match o.param_at[k] {
                        Loc::Params(off) => Some(off),
                        Loc::Arena(_) => None,
                    }
                });
                let place = match (share, shared) {
                    (_, Some(off)) => Some(off),
                    (None, None) => {
                        let off = self.pbuf_size;
                        self.pbuf_size += at.bytes.next_multiple_of(16);
                        Some(off)
                    }
                    // Sharing, but the other graph has no such param: its own words in the arena.
                    (Some(_), None) => None,
                };
                match place {
                    Some(off) => {
                        self.pbuf_of[i] = Some(off);
                        self.param_req.push(usize::MAX);
                    }
                    None => {
                        let r = self.request(at, 0, usize::MAX);
                        self.param_req.push(r);
                        self.req_of[i] = Some(r);
                    }
                }
                self.param_loc.push(place);
            }
            Op::Constant { data } => {
                let r = self.request(at, 0, usize::MAX);
                self.consts.push((r, data.clone(), form[i]));
                self.req_of[i] = Some(r);
            }
            other => return Err(no_kernel(other, at.id)),
        }
        Ok(())
    }

    /// Elementwise ops (as a body of one op) and fused regions.
    fn elementwise(&mut self, g: &Graph, at: &At) -> Result<Kernel> {
        let (i, node) = (at.i, at.node);
        let operands = at.ins.clone();
        Ok(Kernel::Elementwise(match &node.op {
            Op::Binary(_) | Op::Activation(_) | Op::Compare(_) | Op::Where | Op::Cast { .. } => {
                let mut body = Graph::new("op");
                let args: Vec<NodeId> = node
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(k, x)| body.try_input(&format!("in{k}"), g.shape(*x).clone()))
                    .collect::<Result<_>>()?;
                let y = body.try_op(node.op.clone(), &args)?;
                body.set_outputs(vec![y]);
                Elementwise::Map {
                    body,
                    operands,
                    extra: Vec::new(),
                }
            }
            Op::Fused(r) if r.kind == rlx_ir::FusionKind::MultiplyReduce => {
                Elementwise::MultiplyReduce {
                    body: (*r.body).clone(),
                    operands,
                }
            }
            Op::Fused(r) => {
                // Further results of this region, computed by this node's kernel.
                let mut extra: Vec<usize> = g
                    .fused_results(NodeId(i as u32))
                    .into_iter()
                    .map(|(_, s)| s.index())
                    .collect();
                let mut body = (*r.body).clone();
                if r.output != 0 || extra.len() + 1 != r.body.outputs().len() {
                    // Compute just the result this node names; the others compute their own.
                    let o = body.outputs()[r.output];
                    body.set_outputs(vec![o]);
                    extra.clear();
                }
                for &s in &extra {
                    self.extra_of[s] = Some(i);
                }
                Elementwise::Map {
                    body,
                    operands,
                    extra,
                }
            }
            other => return Err(no_kernel(other, at.id)),
        }))
    }

    /// The byte offset at which a narrow that is a view of its operand starts
    /// ([`rlx_driver::views::narrow_view`]), in words or halves on a 16-byte boundary (the
    /// alignment the arena gives the values it places, kept for views too); `None` when the
    /// narrow copies.
    fn view(&self, g: &Graph, at: &At) -> Option<usize> {
        let elems = rlx_driver::views::narrow_view(g, at.id)?;
        let bytes = match at.form {
            Form::Words(dt) => elems * 4 * crate::values::words_per(dt),
            Form::Half => elems * 2,
            Form::Packed => return None,
        };
        bytes.is_multiple_of(16).then_some(bytes)
    }

    /// Reshapes (the operand's words), strided copies, concatenation (a copy per part) and the
    /// index ops; `None` when the node needs no step of its own after those placed here.
    fn movement(&mut self, g: &Graph, at: &At) -> Result<Option<Kernel>> {
        let (i, node, d, ins) = (at.i, at.node, &at.d, &at.ins);
        let copy = |src_off: usize, src_strides: Vec<usize>| {
            Kernel::Movement(Movement::Copy {
                src: ins[0],
                src_off,
                src_strides,
                dims: d.clone(),
                dst_off: 0,
                dst_strides: dense_strides(d),
            })
        };
        Ok(Some(match &node.op {
            Op::Reshape { .. } => {
                self.req_of[i] = self.req_of[ins[0]];
                self.pbuf_of[i] = self.pbuf_of[ins[0]];
                self.off_of[i] = self.off_of[ins[0]];
                return Ok(None);
            }
            Op::Transpose { perm } => {
                let ss = dense_strides(&dims(g, node.inputs[0])?);
                copy(0, perm.iter().map(|&p| ss[p]).collect())
            }
            Op::Narrow { axis, start, .. } => {
                if let Some(off) = self.view(g, at) {
                    self.req_of[i] = self.req_of[ins[0]];
                    self.pbuf_of[i] = self.pbuf_of[ins[0]];
                    self.off_of[i] = self.off_of[ins[0]] + off;
                    return Ok(None);
                }
                let ss = dense_strides(&dims(g, node.inputs[0])?);
                copy(start * ss[*axis], ss)
            }
            Op::Expand { .. } => copy(0, broadcast_strides(&dims(g, node.inputs[0])?, d)),
            Op::Concat { axis } => {
                self.concat(g, at, *axis)?;
                return Ok(None);
            }
            Op::Gather { axis } => Kernel::Movement(Movement::Gather {
                x: ins[0],
                idx: ins[1],
                axis: *axis,
            }),
            Op::ScatterAdd { axis } => Kernel::Movement(Movement::ScatterAdd {
                x: ins[0],
                idx: ins[1],
                u: ins[2],
                axis: *axis,
            }),
            other => return Err(no_kernel(other, at.id)),
        }))
    }

    /// The complex primitives as word copies: c64 values are pairs of f32 words, so `real` and
    /// `imag` read every other word (from the first or the second) and `complex` writes its
    /// operands (broadcast) into every other word, one copy each.
    fn complex(&mut self, g: &Graph, at: &At, p: Primitive) -> Result<Option<Kernel>> {
        let dense = dense_strides(&at.d);
        let pairs: Vec<usize> = dense.iter().map(|s| 2 * s).collect();
        let part = |src: usize, src_off: usize, src_strides: Vec<usize>, dst_off, dst_strides| {
            Kernel::Movement(Movement::Copy {
                src,
                src_off,
                src_strides,
                dims: at.d.clone(),
                dst_off,
                dst_strides,
            })
        };
        match p {
            Primitive::Real | Primitive::Imag => {
                let off = usize::from(p == Primitive::Imag);
                Ok(Some(part(at.ins[0], off, pairs, 0, dense)))
            }
            Primitive::Complex => {
                let r = self.request(at, at.step, at.step);
                self.req_of[at.i] = Some(r);
                for (k, &x) in at.ins.iter().enumerate() {
                    let xd = dims(g, NodeId(x as u32))?;
                    let kernel = part(x, 0, broadcast_strides(&xd, &at.d), k, pairs.clone());
                    self.pending.push((at.i, kernel));
                }
                self.keep_operands(at.node, self.pending.len());
                self.reqs[r].end = self.pending.len();
                Ok(None)
            }
        }
    }

    /// One copy per part into its slice of the result.
    fn concat(&mut self, g: &Graph, at: &At, axis: usize) -> Result<()> {
        let ds = dense_strides(&at.d);
        let r = self.request(at, at.step, at.step);
        self.req_of[at.i] = Some(r);
        let mut from = 0;
        for &x in &at.ins {
            let pd = dims(g, NodeId(x as u32))?;
            let len = pd[axis];
            self.pending.push((
                at.i,
                Kernel::Movement(Movement::Copy {
                    src: x,
                    src_off: 0,
                    src_strides: dense_strides(&pd),
                    dims: pd,
                    dst_off: from * ds[axis],
                    dst_strides: ds.clone(),
                }),
            ));
            from += len;
        }
        self.keep_operands(at.node, self.pending.len());
        self.reqs[r].end = self.pending.len();
        Ok(())
    }

    /// A `norm_matmul` region: its decode product, which stages and normalizes the norm's
    /// operand itself (adding the residual first, and writing the sum, where the region has
    /// the add).
    fn norm_product(&mut self, g: &Graph, at: &At) -> Result<Option<Kernel>> {
        let p = rlx_opt::norm_matmul_parts(g, at.id)
            .filter(|_| g.fused_head(at.id) == Some(at.id))
            .ok_or_else(|| Error::Unsupported {
                backend: "wgpu".into(),
                op: at.node.op.name().into(),
                node: at.id,
                msg: "not the first result of a norm_matmul region (a lowering bug)".into(),
            })?;
        let scheme = p.scheme.ok_or_else(|| no_kernel(&at.node.op, at.id))?;
        let add = p.residual.map(|r| {
            let to = match p.sum {
                Some(sn) => {
                    self.extra_of[sn.index()] = Some(at.i);
                    SumAt::Value(sn.index())
                }
                None => {
                    let xe: usize = g.shape(p.x).static_dims().map_or(1, |d| d.iter().product());
                    self.reqs.push(BufferRequest {
                        size: xe.max(1) * 4,
                        start: at.step,
                        end: at.step,
                    });
                    SumAt::Scratch(self.reqs.len() - 1)
                }
            };
            (r.index(), to)
        });
        Ok(Some(Kernel::QuantKv(QuantKv::DequantMatMul {
            x: p.x.index(),
            w: p.w.index(),
            scheme,
            acts: None,
            norm: Some((p.gamma.index(), p.eps)),
            add,
            extra: p.sum.map(|s| vec![s.index()]).unwrap_or_default(),
        })))
    }

    /// GGUF products (after a step that rounds the activations, where the scheme does) and
    /// rows, cached attention (three steps) and cache writes (in place, no words of their own).
    fn quant_kv(&mut self, g: &Graph, at: &At) -> Result<Option<Kernel>> {
        let (i, node, step, ins) = (at.i, at.node, at.step, &at.ins);
        Ok(Some(Kernel::QuantKv(match &node.op {
            Op::DequantMatMul { scheme } => {
                // Activations rounded first (a step of their own, into a scratch request that
                // lives until the product has read it), unless the product stages them.
                // A decode product whose activations fit in workgroup memory rounds them
                // itself (`shaders::matvec_staged`). Blocks of 32 are followed by their sums.
                let xd = dims(g, node.inputs[0])?;
                let rows = if xd.len() >= 2 { xd[xd.len() - 2] } else { 1 };
                let xe: usize = xd.iter().product();
                let k = xd.last().copied().unwrap_or(1).max(1);
                let staged = shaders::matvec_staged(xe / k, xe);
                let acts = scheme.act_block(rows).filter(|_| !staged).map(|blk| {
                    self.reqs.push(BufferRequest {
                        size: (xe + xe / 32).max(1) * 4,
                        start: step,
                        end: step + 1,
                    });
                    let to = self.reqs.len() - 1;
                    self.pending.push((
                        i,
                        Kernel::QuantKv(QuantKv::QuantizeActs {
                            x: ins[0],
                            to,
                            blk: blk as u32,
                        }),
                    ));
                    self.keep_operands(node, step + 1);
                    to
                });
                QuantKv::DequantMatMul {
                    x: ins[0],
                    w: ins[1],
                    scheme: *scheme,
                    acts,
                    norm: None,
                    add: None,
                    extra: Vec::new(),
                }
            }
            Op::DequantizeRows { scheme } => QuantKv::DequantizeRows {
                w: ins[0],
                scheme: *scheme,
            },
            Op::CachedAttention { scale, window } => {
                let (qd, kd) = (dims(g, node.inputs[0])?, dims(g, node.inputs[1])?);
                // Decode over a cache whose scores fit in workgroup memory: one step.
                if qd[0] < rlx_ir::QuantScheme::MATRIX_ATTENTION_ROWS
                    && kd[0] <= shaders::ATTENTION_STAGE
                {
                    return Ok(Some(Kernel::QuantKv(QuantKv::DecodeAttention {
                        q: ins[0],
                        k: ins[1],
                        v: ins[2],
                        pos: ins[3],
                        scale: *scale,
                        window: *window,
                    })));
                }
                self.reqs.push(BufferRequest {
                    size: (qd[0] * qd[1] * kd[0]).max(1) * 4,
                    start: step,
                    end: step + 2,
                });
                let scores = self.reqs.len() - 1;
                self.keep_operands(node, step + 2);
                let attn = |step: u8| {
                    Kernel::QuantKv(QuantKv::CachedAttention {
                        q: ins[0],
                        k: ins[1],
                        v: ins[2],
                        pos: ins[3],
                        scale: *scale,
                        window: *window,
                        scores,
                        step,
                    })
                };
                self.pending.push((i, attn(0)));
                self.pending.push((i, attn(1)));
                return Ok(Some(attn(2)));
            }
            Op::CacheWrite => {
                // The cache is updated in place: the result is the cache's own words.
                self.req_of[i] = self.req_of[ins[0]];
                self.pbuf_of[i] = self.pbuf_of[ins[0]];
                self.off_of[i] = self.off_of[ins[0]];
                // A rotation taken in: rotated straight into the cache, its operands read here.
                if let Some(r) = self.rope_of[i] {
                    self.keep_operands(g.node(r), step);
                    let kernel = QuantKv::RopeIntoCache { rope: r.index() };
                    self.pending.push((i, Kernel::QuantKv(kernel)));
                    return Ok(None);
                }
                self.pending.push((
                    i,
                    Kernel::QuantKv(QuantKv::CacheWrite {
                        cache: ins[0],
                        upd: ins[1],
                        pos: ins[2],
                    }),
                ));
                return Ok(None);
            }
            other => return Err(no_kernel(other, at.id)),
        })))
    }
}

/// Reductions over axes, softmax, cumsum and top-k.
fn reduction(at: &At) -> Result<Kernel> {
    let src = at.ins[0];
    Ok(Kernel::Reduction(match &at.node.op {
        Op::Reduce { kind, axes, .. } => Reduction::Reduce {
            kind: *kind,
            src,
            axes: axes.clone(),
        },
        Op::Softmax { axis } => Reduction::Softmax { src, axis: *axis },
        Op::Cumsum { axis } => Reduction::Cumsum { src, axis: *axis },
        Op::TopK { k, output } => Reduction::TopK {
            x: src,
            k: *k,
            indices: *output == rlx_ir::TopKOutput::Indices,
        },
        other => return Err(no_kernel(other, at.id)),
    }))
}
