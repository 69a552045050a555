//! Lowering a graph to a list of compute dispatches over one device arena.
//!
//! Every value is dense, one 32-bit word per element (GGUF rows: packed bytes; see [`Form`]), at
//! an offset of the graph's arena (constants, inputs, intermediates) or of the params buffers,
//! laid out by the memory planner; a reshape is the same words under
//! other dims, a transpose, narrow, expand or concat a strided copy. Each step reads its
//! shapes and offsets from its words in one meta buffer, so pipelines are shared by every step
//! of the same kind. A run is one command submission; outputs are copied out on request.

use crate::shaders::{
    self, Bound, Memory, ARENA_CHUNK, HALF, MAX_GROUPS, PARAMS_CHUNK, PARAMS_CHUNKS, RANK, SHARED,
    TILE, WG,
};
use crate::values::{device_bytes, forms, from_words, to_words, Form};
use crate::Gpu;
use rlx_driver::{Executable, IoSlot};
use rlx_ir::{DType, Error, Graph, NodeId, Op, Result};
use rlx_opt::{plan_memory, BufferRequest};
use std::sync::Arc;

/// Meta words per step are padded to this many (256 bytes, the storage offset alignment).
const META_ALIGN: usize = 64;

struct Step {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    groups: (u32, u32, u32),
}

/// Where a value's words are: a byte offset in the graph's arena or in the params buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loc {
    Arena(u64),
    Params(u64),
}

/// A graph compiled for a wgpu device.
pub struct GpuProgram {
    gpu: Arc<Gpu>,
    /// The graph's arena: one buffer, or several of `ARENA_CHUNK` bytes when it is larger than
    /// one binding may be.
    arena: Vec<wgpu::Buffer>,
    /// The params buffers: this graph's own, or those of the graph it shares params with.
    pbuf: Arc<Vec<wgpu::Buffer>>,
    steps: Vec<Step>,
    inputs: Vec<IoSlot>,
    params: Vec<IoSlot>,
    outputs: Vec<IoSlot>,
    input_at: Vec<u64>,
    param_at: Vec<Loc>,
    output_at: Vec<Loc>,
    input_form: Vec<Form>,
    param_form: Vec<Form>,
    output_form: Vec<Form>,
}

impl GpuProgram {
    /// Number of dispatches per run.
    pub fn steps(&self) -> usize {
        self.steps.len()
    }
}

/// Why the wgpu backend cannot run node `id`, or `None` when it can.
pub fn unsupported(g: &Graph, id: NodeId) -> Option<String> {
    let n = g.node(id);
    let out = n.shape.dtype();
    let ins: Vec<DType> = n.inputs.iter().map(|i| g.shape(*i).dtype()).collect();
    if let Some(d) = std::iter::once(out)
        .chain(ins.iter().copied())
        .find(|d| shaders::wgsl_type(*d).is_none())
    {
        return Some(format!(
            "{d} values do not run on the GPU (f32, f16, bf16, i32, i16, i8, u32, u8 and bool do)"
        ));
    }
    if n.shape.rank() > RANK || n.inputs.iter().any(|i| g.shape(*i).rank() > RANK) {
        return Some(format!("rank above {RANK}"));
    }
    let float = |d: DType| shaders::wgsl_type(d) == Some("f32");
    let ok = match &n.op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => true,
        Op::Binary(_) | Op::Activation(_) | Op::Compare(_) | Op::Where | Op::Cast { .. } => {
            shaders::elementwise_op(&n.op, out, &ins)
        }
        Op::MatMul => float(out) && (2..=6).contains(&n.shape.rank()),
        Op::Reduce { .. } | Op::Softmax { .. } => float(out),
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Expand { .. }
        | Op::Concat { .. } => true,
        Op::Fused(r) => match r.kind {
            rlx_ir::FusionKind::Elementwise => shaders::elementwise(&r.body).is_some(),
            rlx_ir::FusionKind::MultiplyReduce => shaders::multiply_reduce(&r.body).is_some(),
            _ => false,
        },
        Op::DotGeneral(_) => false,
        Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Attention { .. }
        | Op::Rope { .. }
        | Op::Conv(_)
        | Op::Pool(_) => crate::nn::native(g, id),
        Op::Gather { .. } => matches!(ins[1], DType::I32 | DType::U32),
        Op::Cumsum { .. } => float(out),
        Op::ScatterAdd { .. } => float(out) && matches!(ins[1], DType::I32 | DType::U32),
        Op::TopK { .. } => ins[0] != DType::Bool,
        Op::DequantMatMul { scheme } => {
            float(out) && ins[0] == DType::F32 && shaders::gguf_decoder(*scheme).is_some()
        }
        Op::DequantizeRows { scheme } => float(out) && shaders::gguf_decoder(*scheme).is_some(),
        // The position form only (the slot form of a paged cache has no WGSL kernel yet).
        Op::CacheWrite => {
            float(out) && float(ins[1]) && g.shape(n.inputs[2]).static_dims() == Some(vec![1])
        }
        Op::CachedAttention { .. } => float(out) && float(ins[1]),
        Op::Custom(_) => false,
        Op::Defined(_) | Op::PagedAttention { .. } => false,
    };
    (!ok).then(|| format!("{} on {} has no WGSL kernel yet", n.op.name(), n.shape))
}

/// Loop iterations one invocation of node `id`'s kernel runs, for the kernels that loop over a
/// whole axis (reductions, softmax, cumsum, top-k, multiply-reduce regions, products, cached
/// attention); 0 for the others (the native kernels of `nn` check their own).
fn loop_len(g: &Graph, id: NodeId) -> usize {
    let n = g.node(id);
    let axis_len = |x: NodeId, a: usize| axis_len_in(g, x, a);
    match &n.op {
        Op::Reduce { axes, .. } => axes.iter().map(|&a| axis_len(n.inputs[0], a)).product(),
        Op::Softmax { axis } | Op::Cumsum { axis } => 3 * axis_len(n.inputs[0], *axis),
        // The contraction (the tiled product's tiles of 16, plus the loads).
        Op::MatMul => 2 * axis_len(n.inputs[0], g.shape(n.inputs[0]).rank() - 1),
        // Each of k weights decoded once for up to QROWS rows.
        Op::DequantMatMul { .. } => {
            let k = axis_len(n.inputs[0], g.shape(n.inputs[0]).rank() - 1);
            k * (shaders::QROWS as usize + 1)
        }
        // The weights step loops over the cache rows three times.
        Op::CachedAttention { .. } => 3 * axis_len(n.inputs[1], 0),
        Op::TopK { .. } => {
            let len = g
                .shape(n.inputs[0])
                .static_dims()
                .and_then(|d| d.last().copied());
            len.map_or(0, |l| l * (l + 1))
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
        _ => 0,
    }
}

/// Length of axis `a` of value `x` of `g` (0 when symbolic).
fn axis_len_in(g: &Graph, x: NodeId, a: usize) -> usize {
    g.shape(x).static_dims().map_or(0, |d| d[a])
}

fn dims(g: &Graph, id: NodeId) -> Result<Vec<usize>> {
    g.shape(id).static_dims().ok_or_else(|| Error::Unsupported {
        backend: "wgpu".into(),
        op: g.node(id).op.name().into(),
        node: id,
        msg: format!(
            "shape {} has symbolic dimensions; bind them before compiling",
            g.shape(id)
        ),
    })
}

fn dense_strides(d: &[usize]) -> Vec<usize> {
    let mut s = vec![1; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * d[i + 1];
    }
    s
}

/// `v` padded with zeros to `RANK` words.
fn pad(v: &[usize]) -> Vec<u32> {
    let mut w: Vec<u32> = v.iter().map(|&x| x as u32).collect();
    w.resize(RANK, 0);
    w
}

/// Strides of an operand of dims `d` broadcast (numpy style) to `out` dims.
fn broadcast_strides(d: &[usize], out: &[usize]) -> Vec<usize> {
    let s = dense_strides(d);
    let lead = out.len() - d.len();
    (0..out.len())
        .map(|i| {
            if i < lead || d[i - lead] == 1 {
                0
            } else {
                s[i - lead]
            }
        })
        .collect()
}

/// What a step needs before addresses are fixed.
enum Kernel {
    Elementwise {
        body: Graph,
        operands: Vec<usize>,
        extra: Vec<usize>,
    },
    /// Copy `src` viewed with `(offset, strides)` over `dims` into `dst` at `dst_off` (elements) with `dst_strides`.
    Copy {
        src: usize,
        src_off: usize,
        src_strides: Vec<usize>,
        dims: Vec<usize>,
        dst_off: usize,
        dst_strides: Vec<usize>,
    },
    Reduce {
        kind: rlx_ir::ReduceKind,
        src: usize,
        axes: Vec<usize>,
    },
    Softmax {
        src: usize,
        axis: usize,
    },
    Cumsum {
        src: usize,
        axis: usize,
    },
    Gather {
        x: usize,
        idx: usize,
        axis: usize,
    },
    ScatterAdd {
        x: usize,
        idx: usize,
        u: usize,
        axis: usize,
    },
    TopK {
        x: usize,
        k: usize,
        indices: bool,
    },
    /// `x` rounded to int8 blocks of `blk` and back into arena request `to` (the product's
    /// activations, as the CPU rounds them).
    QuantizeActs {
        x: usize,
        to: usize,
        blk: u32,
    },
    DequantMatMul {
        x: usize,
        w: usize,
        scheme: rlx_ir::QuantScheme,
        /// The arena request holding the rounded activations, if the scheme rounds them.
        acts: Option<usize>,
    },
    DequantizeRows {
        w: usize,
        scheme: rlx_ir::QuantScheme,
    },
    CacheWrite {
        cache: usize,
        upd: usize,
        pos: usize,
    },
    /// Cached attention in three steps over a scratch of `[S, Hq, T]` scores (arena request
    /// `scores`): `step` 0 the scaled scores (masked keys -inf), 1 the normalized weights in
    /// place, 2 the weighted values. Each invocation loops over one axis only: lavapipe ends a
    /// shader invocation's loops after 65535 iterations in all.
    CachedAttention {
        q: usize,
        k: usize,
        v: usize,
        pos: usize,
        scale: f32,
        window: Option<usize>,
        scores: usize,
        step: u8,
    },
    MatMul {
        a: usize,
        b: usize,
    },
    MultiplyReduce {
        body: Graph,
        operands: Vec<usize>,
    },
    /// A kernel of [`crate::nn`] (norms, RoPE, attention, convolution, pooling).
    Native,
}

/// Compile `g` for `gpu`; params with the name and shape of a param that `share` holds in its
/// params buffer use that storage (`Backend::compile_sharing`), the others get their own.
pub fn compile(gpu: Arc<Gpu>, g: &Graph, share: Option<&GpuProgram>) -> Result<GpuProgram> {
    let n = g.len();
    // Params in the params buffer: byte offset of each node that is one (or an alias of one).
    let mut pbuf_of: Vec<Option<u64>> = vec![None; n];
    let mut pbuf_size: u64 = 0;
    let mut param_loc: Vec<Option<u64>> = Vec::new();
    // Arena request of each node's words (aliases share one), in node order.
    let mut req_of: Vec<Option<usize>> = vec![None; n];
    let mut reqs: Vec<BufferRequest> = Vec::new();
    let mut pending: Vec<(usize, Kernel)> = Vec::new();
    let mut consts: Vec<(usize, Vec<u8>, Form)> = Vec::new();
    let (mut inputs, mut params) = (Vec::new(), Vec::new());
    let (mut input_req, mut param_req) = (Vec::new(), Vec::new());
    let mut extra_of: Vec<Option<usize>> = vec![None; n]; // further results: computed by the step of node
                                                          // f16 values as halves where the adapter can (RLX_WGPU_F16_STORAGE=0: as words).
    let half = gpu.f16
        && !rlx_ir::env::is_off("RLX_WGPU_F16_STORAGE")
        && g.ids().any(|id| g.shape(id).dtype() == DType::F16);
    let form = forms(g, half)?;
    for id in g.ids() {
        let i = id.index();
        let why = unsupported(g, id).or_else(|| {
            let n = loop_len(g, id);
            (gpu.loop_limited() && n > crate::nn::LOOP_LIMIT).then(|| {
                format!(
                    "one invocation would loop {n} times; this adapter ({}) ends an invocation's loops after 65535",
                    gpu.info.name
                )
            })
        });
        if let Some(why) = why {
            return Err(Error::Unsupported {
                backend: "wgpu".into(),
                op: g.node(id).op.name().into(),
                node: id,
                msg: why,
            });
        }
        let node = g.node(id);
        let d = dims(g, id)?;
        let elems = d.iter().product::<usize>().max(1);
        let bytes = form[i].bytes(elems) as u64;
        let step = pending.len();
        let new_req = |start: usize, end: usize, reqs: &mut Vec<BufferRequest>| {
            reqs.push(BufferRequest {
                size: bytes as usize,
                start,
                end,
            });
            reqs.len() - 1
        };
        // Operands stay live through this step.
        for x in &node.inputs {
            if let Some(r) = req_of[x.index()] {
                reqs[r].end = reqs[r].end.max(step);
            }
        }
        if extra_of[i].is_some() {
            continue;
        }
        let ins: Vec<usize> = node.inputs.iter().map(|x| x.index()).collect();
        let kernel = match &node.op {
            Op::Input { name } => {
                inputs.push(IoSlot {
                    name: name.clone(),
                    shape: node.shape.clone(),
                });
                let r = new_req(0, 0, &mut reqs);
                input_req.push(r);
                req_of[i] = Some(r);
                continue;
            }
            Op::Param { name } => {
                params.push(IoSlot {
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
                let at = match (share, shared) {
                    (_, Some(off)) => Some(off),
                    (None, None) => {
                        let off = pbuf_size;
                        pbuf_size += bytes.next_multiple_of(16);
                        Some(off)
                    }
                    // Sharing, but the other graph has no such param: its own words in the arena.
                    (Some(_), None) => None,
                };
                match at {
                    Some(off) => {
                        pbuf_of[i] = Some(off);
                        param_req.push(usize::MAX);
                    }
                    None => {
                        let r = new_req(0, usize::MAX, &mut reqs);
                        param_req.push(r);
                        req_of[i] = Some(r);
                    }
                }
                param_loc.push(at);
                continue;
            }
            Op::Constant { data } => {
                let r = new_req(0, usize::MAX, &mut reqs);
                consts.push((r, data.clone(), form[i]));
                req_of[i] = Some(r);
                continue;
            }
            Op::Reshape { .. } => {
                req_of[i] = req_of[ins[0]];
                pbuf_of[i] = pbuf_of[ins[0]];
                continue;
            }
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
                Kernel::Elementwise {
                    body,
                    operands: ins,
                    extra: Vec::new(),
                }
            }
            Op::Fused(r) if r.kind == rlx_ir::FusionKind::MultiplyReduce => {
                Kernel::MultiplyReduce {
                    body: (*r.body).clone(),
                    operands: ins,
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
                    extra_of[s] = Some(i);
                }
                Kernel::Elementwise {
                    body,
                    operands: ins,
                    extra,
                }
            }
            Op::Transpose { perm } => {
                let sd = dims(g, node.inputs[0])?;
                let ss = dense_strides(&sd);
                Kernel::Copy {
                    src: ins[0],
                    src_off: 0,
                    src_strides: perm.iter().map(|&p| ss[p]).collect(),
                    dims: d.clone(),
                    dst_off: 0,
                    dst_strides: dense_strides(&d),
                }
            }
            Op::Narrow { axis, start, .. } => {
                let sd = dims(g, node.inputs[0])?;
                let ss = dense_strides(&sd);
                Kernel::Copy {
                    src: ins[0],
                    src_off: start * ss[*axis],
                    src_strides: ss,
                    dims: d.clone(),
                    dst_off: 0,
                    dst_strides: dense_strides(&d),
                }
            }
            Op::Expand { .. } => {
                let sd = dims(g, node.inputs[0])?;
                Kernel::Copy {
                    src: ins[0],
                    src_off: 0,
                    src_strides: broadcast_strides(&sd, &d),
                    dims: d.clone(),
                    dst_off: 0,
                    dst_strides: dense_strides(&d),
                }
            }
            Op::Concat { axis } => {
                // One copy per part into its slice of the result.
                let ds = dense_strides(&d);
                let r = new_req(step, step, &mut reqs);
                req_of[i] = Some(r);
                let mut at = 0;
                for &x in &ins {
                    let pd = dims(g, NodeId(x as u32))?;
                    let len = pd[*axis];
                    pending.push((
                        i,
                        Kernel::Copy {
                            src: x,
                            src_off: 0,
                            src_strides: dense_strides(&pd),
                            dims: pd,
                            dst_off: at * ds[*axis],
                            dst_strides: ds.clone(),
                        },
                    ));
                    at += len;
                }
                for &x in &ins {
                    if let Some(q) = req_of[x] {
                        reqs[q].end = reqs[q].end.max(pending.len());
                    }
                }
                reqs[r].end = pending.len();
                continue;
            }
            Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Attention { .. }
            | Op::Rope { .. }
            | Op::Conv(_)
            | Op::Pool(_) => Kernel::Native,
            Op::Reduce { kind, axes, .. } => Kernel::Reduce {
                kind: *kind,
                src: ins[0],
                axes: axes.clone(),
            },
            Op::Softmax { axis } => Kernel::Softmax {
                src: ins[0],
                axis: *axis,
            },
            Op::MatMul => Kernel::MatMul {
                a: ins[0],
                b: ins[1],
            },
            Op::Cumsum { axis } => Kernel::Cumsum {
                src: ins[0],
                axis: *axis,
            },
            Op::Gather { axis } => Kernel::Gather {
                x: ins[0],
                idx: ins[1],
                axis: *axis,
            },
            Op::ScatterAdd { axis } => Kernel::ScatterAdd {
                x: ins[0],
                idx: ins[1],
                u: ins[2],
                axis: *axis,
            },
            Op::TopK { k, output } => Kernel::TopK {
                x: ins[0],
                k: *k,
                indices: *output == rlx_ir::TopKOutput::Indices,
            },
            Op::DequantMatMul { scheme } => {
                // Activations rounded first (a step of their own, into a scratch request that
                // lives until the product has read it).
                let xd = dims(g, node.inputs[0])?;
                let rows = if xd.len() >= 2 { xd[xd.len() - 2] } else { 1 };
                let acts = scheme.act_block(rows).map(|blk| {
                    let xe: usize = xd.iter().product();
                    reqs.push(BufferRequest {
                        size: xe.max(1) * 4,
                        start: step,
                        end: step + 1,
                    });
                    let to = reqs.len() - 1;
                    pending.push((
                        i,
                        Kernel::QuantizeActs {
                            x: ins[0],
                            to,
                            blk: blk as u32,
                        },
                    ));
                    for x in &node.inputs {
                        if let Some(r) = req_of[x.index()] {
                            reqs[r].end = reqs[r].end.max(step + 1);
                        }
                    }
                    to
                });
                Kernel::DequantMatMul {
                    x: ins[0],
                    w: ins[1],
                    scheme: *scheme,
                    acts,
                }
            }
            Op::DequantizeRows { scheme } => Kernel::DequantizeRows {
                w: ins[0],
                scheme: *scheme,
            },
            Op::CachedAttention { scale, window } => {
                let (qd, kd) = (dims(g, node.inputs[0])?, dims(g, node.inputs[1])?);
                reqs.push(BufferRequest {
                    size: (qd[0] * qd[1] * kd[0]).max(1) * 4,
                    start: step,
                    end: step + 2,
                });
                let scores = reqs.len() - 1;
                for x in &node.inputs {
                    if let Some(r) = req_of[x.index()] {
                        reqs[r].end = reqs[r].end.max(step + 2);
                    }
                }
                let attn = |step: u8| Kernel::CachedAttention {
                    q: ins[0],
                    k: ins[1],
                    v: ins[2],
                    pos: ins[3],
                    scale: *scale,
                    window: *window,
                    scores,
                    step,
                };
                pending.push((i, attn(0)));
                pending.push((i, attn(1)));
                attn(2)
            }
            Op::CacheWrite => {
                // The cache is updated in place: the result is the cache's own words.
                req_of[i] = req_of[ins[0]];
                pbuf_of[i] = pbuf_of[ins[0]];
                pending.push((
                    i,
                    Kernel::CacheWrite {
                        cache: ins[0],
                        upd: ins[1],
                        pos: ins[2],
                    },
                ));
                continue;
            }
            other => {
                return Err(Error::Unsupported {
                    backend: "wgpu".into(),
                    op: other.name().into(),
                    node: id,
                    msg: "no WGSL kernel".into(),
                })
            }
        };
        // Live from this node's first step to the one that computes it (a product may round its
        // activations in a step before).
        let r = new_req(step, pending.len(), &mut reqs);
        req_of[i] = Some(r);
        if let Kernel::Elementwise { extra, .. } = &kernel {
            for &s in extra {
                let sd = dims(g, NodeId(s as u32))?;
                reqs.push(BufferRequest {
                    size: sd.iter().product::<usize>().max(1) * 4,
                    start: step,
                    end: step,
                });
                req_of[s] = Some(reqs.len() - 1);
            }
        }
        pending.push((i, kernel));
    }
    let nsteps = pending.len();
    for r in reqs.iter_mut() {
        r.end = r.end.min(nsteps);
    }
    for o in g.outputs() {
        if let Some(r) = req_of[o.index()] {
            reqs[r].end = nsteps;
        }
    }
    let plan = plan_memory(&reqs, 16);
    let limit = gpu
        .limits
        .max_storage_buffer_binding_size
        .min(gpu.limits.max_buffer_size);
    // An arena larger than one binding may be is split into buffers of ARENA_CHUNK bytes, as
    // many as the adapter lets a shader bind beside the meta and params buffers.
    let size = plan.arena_size as u64;
    let chunks = if size <= limit {
        1
    } else {
        size.div_ceil(ARENA_CHUNK) as usize
    };
    let memory = Memory {
        arena_chunks: chunks,
        half: form.contains(&Form::Half),
    };
    let bindable = gpu.limits.max_storage_buffers_per_shader_stage as usize;
    if memory.bindings().len() > bindable || (chunks > 1 && limit < ARENA_CHUNK) {
        return Err(Error::Invalid(format!(
            "graph \"{}\" needs {:.1} MiB of device memory, {} buffers of at most {:.1} MiB; the adapter binds {} storage buffers of at most {:.1} MiB to a shader{}",
            g.name(),
            size as f64 / 1048576.0,
            chunks,
            ARENA_CHUNK.min(limit) as f64 / 1048576.0,
            bindable,
            limit as f64 / 1048576.0,
            if memory.half { " (f16 storage binds each twice; RLX_WGPU_F16_STORAGE=0 does not)" } else { "" },
        )));
    }
    let word = |node: usize| -> usize {
        let byte = match pbuf_of[node] {
            Some(off) => off as usize,
            None => plan.offsets[req_of[node].expect("every value has words")],
        };
        let space = if pbuf_of[node].is_some() { SHARED } else { 0 };
        match form[node] {
            Form::Half => space | HALF | (byte / 2),
            _ => space | (byte / 4),
        }
    };
    // Byte address of a packed value: from SHARED on in the params buffer.
    let byte_addr = |node: usize| -> usize {
        match pbuf_of[node] {
            Some(off) => SHARED + off as usize,
            None => plan.offsets[req_of[node].expect("every value has words")],
        }
    };
    let arena: Vec<wgpu::Buffer> = (0..chunks as u64)
        .map(|c| {
            let size = if chunks == 1 {
                size.max(4).next_multiple_of(4)
            } else {
                size.saturating_sub(c * ARENA_CHUNK).clamp(16, ARENA_CHUNK)
            };
            storage(&gpu, "rlx arena", size)
        })
        .collect();
    let pbuf = match share {
        Some(o) => o.pbuf.clone(),
        None => {
            let cap = PARAMS_CHUNK * PARAMS_CHUNKS as u64;
            if pbuf_size > cap {
                return Err(Error::Invalid(format!(
                    "graph \"{}\" has {:.1} MiB of params; the GPU backend holds at most {:.1} MiB",
                    g.name(),
                    pbuf_size as f64 / 1048576.0,
                    cap as f64 / 1048576.0
                )));
            }
            Arc::new(
                (0..PARAMS_CHUNKS as u64)
                    .map(|c| {
                        let size = pbuf_size
                            .saturating_sub(c * PARAMS_CHUNK)
                            .clamp(16, PARAMS_CHUNK);
                        storage(&gpu, "rlx params", size)
                    })
                    .collect::<Vec<_>>(),
            )
        }
    };
    for (r, data, f) in &consts {
        let words = to_words(*f, data);
        for (buf, at, start, n) in pieces(&arena, plan.offsets[*r] as u64, words.len() as u64) {
            gpu.queue.write_buffer(buf, at, &words[start..start + n]);
        }
    }
    // Meta words and pipelines of every step.
    let mut meta: Vec<u32> = Vec::new();
    // Pipeline, meta words `at..end`, workgroups of each step.
    type Planned = (
        Arc<wgpu::ComputePipeline>,
        usize,
        usize,
        (u32, u32, u32),
        Memory,
    );
    let mut kinds: Vec<Planned> = Vec::new();
    let groups_1d = |count: usize| -> (u32, u32, u32) {
        let g = (count as u32).div_ceil(WG).max(1);
        (g.min(MAX_GROUPS), g.div_ceil(MAX_GROUPS), 1)
    };
    for (node, k) in &pending {
        let id = NodeId(*node as u32);
        let at = meta.len();
        let out_d = dims(g, id)?;
        let count = out_d.iter().product::<usize>();
        let (source, groups) = match k {
            Kernel::Native => {
                let (source, words, invocations) =
                    crate::nn::step(g, id, &|x: NodeId| word(x.index()) as u32)?;
                meta.extend(words);
                (source, groups_1d(invocations))
            }
            Kernel::Elementwise {
                body,
                operands,
                extra,
            } => {
                meta.extend([count as u32, out_d.len() as u32, word(*node) as u32]);
                meta.extend(pad(&out_d));
                for &x in operands {
                    let xd = dims(g, NodeId(x as u32))?;
                    meta.push(word(x) as u32);
                    meta.extend(pad(&broadcast_strides(&xd, &out_d)));
                }
                for &s in extra {
                    meta.push(word(s) as u32);
                }
                (
                    shaders::elementwise(body).expect("checked by unsupported()"),
                    groups_1d(count),
                )
            }
            Kernel::Copy {
                src,
                src_off,
                src_strides,
                dims,
                dst_off,
                dst_strides,
            } => {
                let c = dims.iter().product::<usize>();
                meta.extend([c as u32, dims.len() as u32, (word(*node) + dst_off) as u32]);
                meta.extend(pad(dims));
                meta.extend(pad(dst_strides));
                meta.push((word(*src) + src_off) as u32);
                meta.extend(pad(src_strides));
                (shaders::copy(), groups_1d(c))
            }
            Kernel::Reduce { kind, src, axes } => {
                let sd = dims(g, NodeId(*src as u32))?;
                let ss = dense_strides(&sd);
                let keep: Vec<usize> = (0..sd.len()).filter(|a| !axes.contains(a)).collect();
                let m: usize = axes.iter().map(|&a| sd[a]).product();
                meta.extend([
                    count as u32,
                    m as u32,
                    word(*src) as u32,
                    word(*node) as u32,
                    keep.len() as u32,
                ]);
                meta.extend(pad(&keep.iter().map(|&a| sd[a]).collect::<Vec<_>>()));
                meta.extend(pad(&keep.iter().map(|&a| ss[a]).collect::<Vec<_>>()));
                meta.push(axes.len() as u32);
                meta.extend(pad(&axes.iter().map(|&a| sd[a]).collect::<Vec<_>>()));
                meta.extend(pad(&axes.iter().map(|&a| ss[a]).collect::<Vec<_>>()));
                (
                    shaders::reduce(*kind, g.shape(id).dtype()),
                    groups_1d(count),
                )
            }
            Kernel::MultiplyReduce { body, operands } => {
                // The reduction walks the dense index space of the reduced value.
                let last = body.node(*body.outputs().first().expect("one output"));
                let Op::Reduce { axes, .. } = &last.op else {
                    return Err(Error::Unsupported {
                        backend: "wgpu".into(),
                        op: "fused".into(),
                        node: id,
                        msg: "a multiply-reduce region must end in a reduction".into(),
                    });
                };
                let pre = body.shape(last.inputs[0]).static_dims().expect("static");
                let ps = dense_strides(&pre);
                let keep: Vec<usize> = (0..pre.len()).filter(|a| !axes.contains(a)).collect();
                let m: usize = axes.iter().map(|&a| pre[a]).product();
                meta.extend([
                    count as u32,
                    m as u32,
                    0,
                    word(*node) as u32,
                    keep.len() as u32,
                ]);
                meta.extend(pad(&keep.iter().map(|&a| pre[a]).collect::<Vec<_>>()));
                meta.extend(pad(&keep.iter().map(|&a| ps[a]).collect::<Vec<_>>()));
                meta.push(axes.len() as u32);
                meta.extend(pad(&axes.iter().map(|&a| pre[a]).collect::<Vec<_>>()));
                meta.extend(pad(&axes.iter().map(|&a| ps[a]).collect::<Vec<_>>()));
                debug_assert_eq!(meta.len() - at, shaders::MR_EW);
                meta.push(pre.len() as u32);
                meta.extend(pad(&pre));
                for &x in operands {
                    let xd = dims(g, NodeId(x as u32))?;
                    meta.push(word(x) as u32);
                    meta.extend(pad(&broadcast_strides(&xd, &pre)));
                }
                (
                    shaders::multiply_reduce(body).expect("checked by unsupported()"),
                    groups_1d(count),
                )
            }
            Kernel::Softmax { src, axis } => {
                let ss = dense_strides(&out_d);
                meta.extend([
                    count as u32,
                    out_d[*axis] as u32,
                    ss[*axis] as u32,
                    word(*src) as u32,
                    word(*node) as u32,
                ]);
                (shaders::softmax(g.shape(id).dtype()), groups_1d(count))
            }
            Kernel::Cumsum { src, axis } => {
                let ss = dense_strides(&out_d);
                meta.extend([
                    count as u32,
                    out_d[*axis] as u32,
                    ss[*axis] as u32,
                    word(*src) as u32,
                    word(*node) as u32,
                ]);
                (shaders::cumsum(g.shape(id).dtype()), groups_1d(count))
            }
            Kernel::TopK { x, k, indices } => {
                let xd = dims(g, NodeId(*x as u32))?;
                meta.extend([
                    count as u32,
                    *k as u32,
                    *xd.last().unwrap_or(&1) as u32,
                    word(*x) as u32,
                    word(*node) as u32,
                ]);
                (
                    shaders::topk(g.shape(NodeId(*x as u32)).dtype(), *indices),
                    groups_1d(count),
                )
            }
            Kernel::QuantizeActs { x, to, blk } => {
                let elems: usize = dims(g, NodeId(*x as u32))?.iter().product();
                let blocks = elems / *blk as usize;
                meta.extend([
                    blocks as u32,
                    word(*x) as u32,
                    (plan.offsets[*to] / 4) as u32,
                ]);
                (shaders::quantize_acts(*blk), groups_1d(blocks))
            }
            Kernel::DequantMatMul { x, w, scheme, acts } => {
                let xd = dims(g, NodeId(*x as u32))?;
                let wd = dims(g, NodeId(*w as u32))?;
                let (k, nn) = (*xd.last().unwrap_or(&1), *out_d.last().unwrap_or(&1));
                let rows = count / nn.max(1);
                let x_at = match acts {
                    Some(r) => plan.offsets[*r] / 4,
                    None => word(*x),
                };
                meta.extend([
                    rows as u32,
                    k as u32,
                    nn as u32,
                    x_at as u32,
                    byte_addr(*w) as u32,
                    *wd.last().unwrap_or(&0) as u32,
                    word(*node) as u32,
                ]);
                let dec = shaders::gguf_decoder(*scheme).expect("checked by unsupported()");
                let invocations = rows.div_ceil(shaders::QROWS as usize) * nn;
                (
                    shaders::dequant_matmul(dec, g.shape(id).dtype()),
                    groups_1d(invocations),
                )
            }
            Kernel::DequantizeRows { w, scheme } => {
                let wd = dims(g, NodeId(*w as u32))?;
                let k = *out_d.last().unwrap_or(&1);
                meta.extend([
                    count as u32,
                    k as u32,
                    *wd.last().unwrap_or(&0) as u32,
                    byte_addr(*w) as u32,
                    word(*node) as u32,
                ]);
                let dec = shaders::gguf_decoder(*scheme).expect("checked by unsupported()");
                (
                    shaders::dequantize_rows(dec, g.shape(id).dtype()),
                    groups_1d(count),
                )
            }
            Kernel::CacheWrite { cache, upd, pos } => {
                let (cd, ud) = (
                    dims(g, NodeId(*cache as u32))?,
                    dims(g, NodeId(*upd as u32))?,
                );
                let row: usize = cd[1..].iter().product();
                let n_upd: usize = ud.iter().product();
                meta.extend([
                    n_upd as u32,
                    row.max(1) as u32,
                    cd[0] as u32,
                    word(*cache) as u32,
                    word(*upd) as u32,
                    word(*pos) as u32,
                ]);
                (
                    shaders::cache_write(g.shape(NodeId(*cache as u32)).dtype()),
                    groups_1d(n_upd),
                )
            }
            Kernel::CachedAttention {
                q,
                k,
                v,
                pos,
                scale,
                window,
                scores,
                step,
            } => {
                let (qd, kd, vd) = (
                    dims(g, NodeId(*q as u32))?,
                    dims(g, NodeId(*k as u32))?,
                    dims(g, NodeId(*v as u32))?,
                );
                let (rows, t) = (qd[0] * qd[1], kd[0]);
                let sc = (plan.offsets[*scores] / 4) as u32;
                let cache = g.shape(NodeId(*k as u32)).dtype();
                match step {
                    0 => {
                        meta.extend([
                            (rows * t) as u32,
                            qd[1] as u32,
                            qd[2] as u32,
                            t as u32,
                            kd[1] as u32,
                            word(*q) as u32,
                            word(*k) as u32,
                            word(*pos) as u32,
                            sc,
                            window.unwrap_or(0) as u32,
                            scale.to_bits(),
                        ]);
                        (shaders::attention_scores(cache), groups_1d(rows * t))
                    }
                    1 => {
                        meta.extend([rows as u32, t as u32, sc]);
                        (shaders::attention_weights(cache), groups_1d(rows))
                    }
                    _ => {
                        meta.extend([
                            count as u32,
                            qd[1] as u32,
                            vd[2] as u32,
                            t as u32,
                            kd[1] as u32,
                            word(*v) as u32,
                            sc,
                            word(*node) as u32,
                        ]);
                        (
                            shaders::attention_values(g.shape(id).dtype()),
                            groups_1d(count),
                        )
                    }
                }
            }
            Kernel::ScatterAdd { x, idx, u, axis } => {
                let (ud, id_d) = (dims(g, NodeId(*u as u32))?, dims(g, NodeId(*idx as u32))?);
                meta.extend([count as u32, out_d.len() as u32, word(*node) as u32]);
                meta.extend(pad(&out_d));
                meta.extend([word(*x) as u32, word(*u) as u32]);
                meta.extend(pad(&dense_strides(&ud)));
                meta.extend([word(*idx) as u32, id_d[0] as u32, *axis as u32]);
                (
                    shaders::scatter_add(
                        g.shape(NodeId(*idx as u32)).dtype() == DType::I32,
                        g.shape(id).dtype(),
                    ),
                    groups_1d(count),
                )
            }
            Kernel::Gather { x, idx, axis } => {
                let (mut xd, id_d) = (dims(g, NodeId(*x as u32))?, dims(g, NodeId(*idx as u32))?);
                let mut out_d = out_d.clone();
                if form[*node] == Form::Packed {
                    // Packed rows move as words (their byte length is a multiple of 4).
                    *xd.last_mut().expect("rank >= 2") /= 4;
                    *out_d.last_mut().expect("rank >= 2") /= 4;
                }
                let count: usize = out_d.iter().product();
                let (xs, is) = (dense_strides(&xd), dense_strides(&id_d));
                let ir = id_d.len();
                // Strides over the result's axes: [pre..., idx..., post...].
                let mut x_str = vec![0; out_d.len()];
                let mut i_str = vec![0; out_d.len()];
                x_str[..*axis].copy_from_slice(&xs[..*axis]);
                i_str[*axis..*axis + ir].copy_from_slice(&is[..ir]);
                for a in axis + 1..xd.len() {
                    x_str[a - 1 + ir] = xs[a];
                }
                meta.extend([count as u32, out_d.len() as u32, word(*node) as u32]);
                meta.extend(pad(&out_d));
                meta.push(word(*x) as u32);
                meta.extend(pad(&x_str));
                meta.push(word(*idx) as u32);
                meta.extend(pad(&i_str));
                meta.extend([xs[*axis] as u32, xd[*axis] as u32]);
                (
                    shaders::gather(g.shape(NodeId(*idx as u32)).dtype() == DType::I32),
                    groups_1d(count),
                )
            }
            Kernel::MatMul { a, b } => {
                let (ad, bd) = (dims(g, NodeId(*a as u32))?, dims(g, NodeId(*b as u32))?);
                let r = out_d.len();
                let (m, kk, nn) = (out_d[r - 2], ad[ad.len() - 1], out_d[r - 1]);
                let batch: Vec<usize> = out_d[..r - 2].to_vec();
                let stride_of = |xd: &[usize]| -> Vec<usize> {
                    let xb = &xd[..xd.len() - 2];
                    let mat = xd[xd.len() - 2] * xd[xd.len() - 1];
                    let mut s = broadcast_strides(xb, &batch);
                    s.iter_mut().for_each(|v| *v *= mat);
                    s
                };
                if batch.len() > 4 {
                    return Err(Error::Unsupported {
                        backend: "wgpu".into(),
                        op: "matmul".into(),
                        node: id,
                        msg: "more than 4 batch axes".into(),
                    });
                }
                let nb: usize = batch.iter().product();
                meta.extend([
                    m as u32,
                    kk as u32,
                    nn as u32,
                    word(*a) as u32,
                    word(*b) as u32,
                    word(*node) as u32,
                    batch.len() as u32,
                ]);
                let p4 = |v: &[usize]| {
                    let mut w: Vec<u32> = v.iter().map(|&x| x as u32).collect();
                    w.resize(4, 0);
                    w
                };
                meta.extend(p4(&batch));
                meta.extend(p4(&stride_of(&ad)));
                meta.extend(p4(&stride_of(&bd)));
                (
                    shaders::matmul(g.shape(id).dtype()),
                    (
                        (nn as u32).div_ceil(TILE).max(1),
                        (m as u32).div_ceil(TILE).max(1),
                        nb.max(1) as u32,
                    ),
                )
            }
        };
        meta.resize(meta.len().next_multiple_of(META_ALIGN), 0);
        // Only the kernels that touch an f16 value bind the halves (less code to compile).
        let extra: &[usize] = match k {
            Kernel::Elementwise { extra, .. } => extra,
            _ => &[],
        };
        let memory = Memory {
            half: memory.half
                && std::iter::once(*node)
                    .chain(g.node(id).inputs.iter().map(|x| x.index()))
                    .chain(extra.iter().copied())
                    .any(|v| form[v] == Form::Half),
            ..memory
        };
        let source = shaders::finish(&source, &memory);
        let pipeline = gpu.pipeline(&source).map_err(|e| Error::Unsupported {
            backend: "wgpu".into(),
            op: g.node(id).op.name().into(),
            node: id,
            msg: format!("shader rejected: {e}"),
        })?;
        kinds.push((pipeline, at, meta.len(), groups, memory));
    }
    let meta_buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("rlx meta"),
        size: (meta.len().max(META_ALIGN) * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bytes: Vec<u8> = meta.iter().flat_map(|w| w.to_le_bytes()).collect();
    gpu.queue.write_buffer(&meta_buf, 0, &bytes);
    let steps = kinds
        .into_iter()
        .enumerate()
        .map(|(s, (pipeline, at, end, groups, memory))| {
            let layout = pipeline.get_bind_group_layout(0);
            fn whole(binding: u32, b: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
                wgpu::BindGroupEntry {
                    binding,
                    resource: b.as_entire_binding(),
                }
            }
            let meta = wgpu::BindGroupEntry {
                binding: 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &meta_buf,
                    offset: (at * 4) as u64,
                    size: wgpu::BufferSize::new(((end - at) * 4) as u64),
                }),
            };
            let entries: Vec<wgpu::BindGroupEntry> = (0u32..)
                .zip(memory.bindings())
                .map(|(k, b)| match b {
                    Bound::Meta => meta.clone(),
                    Bound::Arena(c) | Bound::HalfArena(c) => whole(k, &arena[c]),
                    Bound::Params(c) | Bound::HalfParams(c) => whole(k, &pbuf[c]),
                })
                .collect();
            let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&format!("step {s}")),
                layout: &layout,
                entries: &entries,
            });
            Step {
                pipeline,
                bind,
                groups,
            }
        })
        .collect();
    let at = |rs: &[usize]| {
        rs.iter()
            .map(|&r| plan.offsets[r] as u64)
            .collect::<Vec<_>>()
    };
    let param_at = param_loc
        .iter()
        .zip(&param_req)
        .map(|(p, &r)| match p {
            Some(off) => Loc::Params(*off),
            None => Loc::Arena(plan.offsets[r] as u64),
        })
        .collect();
    let outputs = g
        .outputs()
        .iter()
        .enumerate()
        .map(|(i, o)| IoSlot {
            name: format!("out{i}"),
            shape: g.shape(*o).clone(),
        })
        .collect();
    let output_at = g
        .outputs()
        .iter()
        .map(|o| match pbuf_of[o.index()] {
            Some(off) => Loc::Params(off),
            None => Loc::Arena(plan.offsets[req_of[o.index()].expect("outputs have words")] as u64),
        })
        .collect();
    let leaf_forms = |leaf: fn(&Op) -> bool| -> Vec<Form> {
        g.ids()
            .filter(|&id| leaf(&g.node(id).op))
            .map(|id| form[id.index()])
            .collect()
    };
    Ok(GpuProgram {
        input_form: leaf_forms(|op| matches!(op, Op::Input { .. })),
        param_form: leaf_forms(|op| matches!(op, Op::Param { .. })),
        output_form: g.outputs().iter().map(|o| form[o.index()]).collect(),
        input_at: at(&input_req),
        param_at,
        output_at,
        gpu,
        arena,
        pbuf,
        steps,
        inputs,
        params,
        outputs,
    })
}

const _: () = assert!(ARENA_CHUNK == PARAMS_CHUNK, "pieces() splits both alike");

/// A storage buffer of `size` bytes that the host writes and reads back.
fn storage(gpu: &Gpu, label: &str, size: u64) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

/// The pieces of `len` bytes at byte `off` of memory held in `bufs` (one buffer, or buffers of
/// [`ARENA_CHUNK`] = [`PARAMS_CHUNK`] bytes each): `(buffer, offset, start in the bytes, length)`.
fn pieces(bufs: &[wgpu::Buffer], off: u64, len: u64) -> Vec<(&wgpu::Buffer, u64, usize, usize)> {
    if bufs.len() == 1 {
        return vec![(&bufs[0], off, 0, len as usize)];
    }
    let mut out = Vec::new();
    let mut done = 0;
    while done < len {
        let at = off + done;
        let (c, within) = ((at / ARENA_CHUNK) as usize, at % ARENA_CHUNK);
        let n = (len - done).min(ARENA_CHUNK - within);
        out.push((&bufs[c], within, done as usize, n as usize));
        done += n;
    }
    out
}

impl GpuProgram {
    /// The pieces of `len` bytes at `loc` (see [`pieces`]).
    fn pieces(&self, loc: Loc, len: u64) -> Vec<(&wgpu::Buffer, u64, usize, usize)> {
        match loc {
            Loc::Arena(off) => pieces(&self.arena, off, len),
            Loc::Params(off) => pieces(&self.pbuf, off, len),
        }
    }

    /// Read the words at `loc` as `out.len()` host bytes of `dt`.
    fn read_words(&self, loc: Loc, f: Form, out: &mut [u8]) -> Result<()> {
        let mut words = vec![0u8; device_bytes(f, out.len())];
        for (buf, at, start, n) in self.pieces(loc, words.len() as u64) {
            self.gpu.read(buf, at, &mut words[start..start + n])?;
        }
        from_words(f, &words, out);
        Ok(())
    }

    fn write_words(&self, loc: Loc, f: Form, bytes: &[u8]) -> Result<()> {
        self.gpu.check()?;
        let words = to_words(f, bytes);
        for (buf, at, start, n) in self.pieces(loc, words.len() as u64) {
            self.gpu
                .queue
                .write_buffer(buf, at, &words[start..start + n]);
        }
        Ok(())
    }

    /// The device this program runs on (shared by every program of its device kind).
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

impl Executable for GpuProgram {
    fn inputs(&self) -> &[IoSlot] {
        &self.inputs
    }

    fn params(&self) -> &[IoSlot] {
        &self.params
    }

    fn outputs(&self) -> &[IoSlot] {
        &self.outputs
    }

    fn write_input(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.inputs[idx];
        if Some(bytes.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("input", slot, bytes.len()));
        }
        self.write_words(Loc::Arena(self.input_at[idx]), self.input_form[idx], bytes)
    }

    fn write_param(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.params[idx];
        if Some(bytes.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("param", slot, bytes.len()));
        }
        self.write_words(self.param_at[idx], self.param_form[idx], bytes)
    }

    fn write_param_range(&mut self, idx: usize, offset: usize, bytes: &[u8]) -> Result<()> {
        let dt = self.params[idx].shape.dtype();
        let size = self.params[idx].shape.size_bytes().unwrap_or(0);
        if offset.checked_add(bytes.len()).is_none_or(|e| e > size) {
            return Err(Error::Invalid(format!(
                "bytes {offset}..+{} are outside param \"{}\" ({size} bytes)",
                bytes.len(),
                self.params[idx].name
            )));
        }
        let w = dt.size_bytes();
        if !offset.is_multiple_of(w) || !bytes.len().is_multiple_of(w) {
            // Not whole elements: go through the whole param.
            let mut all = vec![0u8; size];
            self.read_param(idx, &mut all)?;
            all[offset..offset + bytes.len()].copy_from_slice(bytes);
            return self.write_param(idx, &all);
        }
        let f = self.param_form[idx];
        let at = match self.param_at[idx] {
            Loc::Arena(o) => Loc::Arena(o + device_bytes(f, offset) as u64),
            Loc::Params(o) => Loc::Params(o + device_bytes(f, offset) as u64),
        };
        self.write_words(at, f, bytes)
    }

    fn read_param(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.params[idx];
        if Some(out.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("param", slot, out.len()));
        }
        self.read_words(self.param_at[idx], self.param_form[idx], out)
    }

    fn execute(&mut self) -> Result<()> {
        self.gpu.check()?;
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("rlx run"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("rlx steps"),
                timestamp_writes: None,
            });
            for s in &self.steps {
                pass.set_pipeline(&s.pipeline);
                pass.set_bind_group(0, &s.bind, &[]);
                pass.dispatch_workgroups(s.groups.0, s.groups.1, s.groups.2);
            }
        }
        self.gpu.queue.submit([enc.finish()]);
        self.gpu.check()
    }

    fn read_output(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.outputs[idx];
        if Some(out.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("output", slot, out.len()));
        }
        self.read_words(self.output_at[idx], self.output_form[idx], out)
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
