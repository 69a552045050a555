//! Lowering a graph to kernel launches over one device arena, with no device at hand: the
//! [`Program`] lists each distinct kernel source once and each launch with its grid, block and
//! words (values as arena or params offsets, fixed to device addresses when the program is
//! loaded). The CI compiles every kernel of a program with NVRTC ([`Program::kernels`]) on a
//! machine without a GPU.
//!
//! Every value is dense in its dtype's storage (f16/bf16 as 16 bits, Bool as a byte); a reshape
//! is the same bytes under other dims; a transpose, narrow, expand or concat a strided copy;
//! intermediates share the arena as the memory planner lays them out; params live in a buffer
//! of their own (shared by programs compiled with `CudaBackend`'s `Backend::compile_sharing`).

use crate::gemm::Gemm;

use crate::source::{self, Access, BLOCK};
use rlx_driver::IoSlot;
use rlx_ir::ops::complex::{primitive_of, Primitive};
use rlx_ir::{DType, Error, FusionKind, Graph, Node, NodeId, Op, Result, TopKOutput};
use rlx_opt::{plan_memory, BufferRequest};
use std::collections::HashMap;

/// The highest rank a value may have here.
pub const RANK: usize = 8;

/// Where a value's bytes are: an offset in the graph's arena or in the params buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// Bytes into the arena.
    Arena(u64),
    /// Bytes into the params buffer.
    Params(u64),
}

/// One 64-bit word of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    /// A number.
    Imm(i64),
    /// The device address of a place.
    Addr(Loc),
}

/// One kernel launch.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Index into [`Program::kernels`].
    pub kernel: usize,
    /// Blocks.
    pub grid: [u32; 3],
    /// Threads per block.
    pub block: u32,
    /// The kernel's words (its one by-value argument).
    pub words: Vec<Word>,
    /// The node it computes, and its op, for profiles and errors.
    pub node: usize,
    /// The op's name.
    pub op: &'static str,
    /// The cuBLAS call that computes the same values, where the device has cuBLAS (the kernel
    /// above runs where it has not).
    pub gemm: Option<Gemm>,
}

/// A graph lowered for the CUDA backend.
#[derive(Clone, Debug, Default)]
pub struct Program {
    /// Distinct kernel sources.
    pub kernels: Vec<String>,
    /// Launches, in order.
    pub launches: Vec<Launch>,
    /// Bytes of the arena.
    pub arena_bytes: u64,
    /// Bytes of this graph's own params buffer.
    pub params_bytes: u64,
    /// Inputs, params and outputs, in definition order.
    pub inputs: Vec<IoSlot>,
    /// Params.
    pub params: Vec<IoSlot>,
    /// Outputs.
    pub outputs: Vec<IoSlot>,
    /// Where each input, param and output lives.
    pub input_at: Vec<Loc>,
    /// Where each param lives.
    pub param_at: Vec<Loc>,
    /// Where each output lives.
    pub output_at: Vec<Loc>,
    /// Constants: place and bytes (uploaded once).
    pub consts: Vec<(Loc, Vec<u8>)>,
}

impl Program {
    /// The kernel sources (each compiled once per device).
    pub fn kernels(&self) -> &[String] {
        &self.kernels
    }

    /// Its params with their places, for a program compiled to share them
    /// ([`lower`]'s `shared`).
    pub fn shared_params(&self) -> Vec<(IoSlot, Loc)> {
        self.params
            .iter()
            .cloned()
            .zip(self.param_at.iter().copied())
            .collect()
    }
}

/// Params another program holds, which this one reads from there: name, shape and offset.
pub type SharedParams<'a> = &'a [(IoSlot, Loc)];

/// Why the CUDA backend cannot run node `id`, or `None` when it can.
pub fn unsupported(g: &Graph, id: NodeId) -> Option<String> {
    let n = g.node(id);
    let out = n.shape.dtype();
    let ins: Vec<DType> = n.inputs.iter().map(|i| g.shape(*i).dtype()).collect();
    // c64 values are pairs of f32: leaves hold them and the three complex primitives move parts
    // in and out (every other complex op decomposes into real ops on the parts).
    let leaf = matches!(
        n.op,
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. }
    );
    if let Some(p) = primitive_of(&n.op) {
        let fits = match p {
            Primitive::Complex => ins.iter().all(|&d| d == DType::F32) && out == DType::C64,
            Primitive::Real | Primitive::Imag => ins == [DType::C64] && out == DType::F32,
        };
        let dims_ok = n.shape.rank() <= RANK
            && n.shape.static_dims().is_some()
            && n.inputs.iter().all(|i| g.shape(*i).static_dims().is_some());
        if fits && dims_ok {
            return None;
        }
    }
    if let Some(d) = std::iter::once(out)
        .chain(ins.iter().copied())
        .find(|&d| source::storage(d).is_none() && !(leaf && d == DType::C64))
    {
        return Some(format!(
            "{d} values do not run on CUDA (f32, f64, f16, bf16, the integers and bool do; c64 through complex, real and imag)"
        ));
    }
    if n.shape.rank() > RANK || n.inputs.iter().any(|i| g.shape(*i).rank() > RANK) {
        return Some(format!("rank above {RANK}"));
    }
    if n.shape.static_dims().is_none()
        || n.inputs.iter().any(|i| g.shape(*i).static_dims().is_none())
    {
        return Some("symbolic dimensions (bind them before compiling)".into());
    }
    let real = |d: DType| matches!(source::compute(d), Some("float") | Some("double"));
    let int = |d: DType| !d.is_float() && d != DType::Bool;
    let why = match &n.op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => return None,
        Op::Binary(_) | Op::Activation(_) | Op::Compare(_) | Op::Where | Op::Cast { .. } => {
            if source::elementwise_op(&n.op, out, &ins) {
                return None;
            }
            format!("no CUDA C form for {} on {ins:?} -> {out}", n.op.name())
        }
        Op::Fused(r) if r.kind == FusionKind::Elementwise => {
            let access = vec![Access::Strided; ins.len()];
            if source::elementwise(&r.body, n.shape.rank(), &access).is_some() {
                return None;
            }
            "an op of the region has no CUDA C form".into()
        }
        // The product launch takes the norm (and add) of the region, and writes its sum.
        Op::Fused(r) if r.kind == FusionKind::NormMatMul => {
            match fuse::norm_product(g, id) {
                Some(np) if fuse::takes_norm_of(g, &np) => return None,
                _ => "a norm_matmul region this backend's decode product does not take (f32 RMSNorm of a few rows read by a GGUF product whose activations round to 32-blocks)".into(),
            }
        }
        Op::Fused(r) => format!("no CUDA kernel for {} regions", r.kind.name()),
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Expand { .. }
        | Op::Concat { .. } => return None,
        Op::Gather { .. } if int(ins[1]) => return None,
        Op::Gather { .. } => format!("{} indices", ins[1]),
        Op::ScatterAdd { .. } if out != DType::Bool && int(ins[1]) && g.shape(n.inputs[1]).rank() == 1 => {
            return None
        }
        Op::ScatterAdd { .. } => format!(
            "scatter-add of {out} with {} indices of rank {} (numeric values, 1-d integer indices run)",
            ins[1],
            g.shape(n.inputs[1]).rank()
        ),
        Op::Reduce { .. } | Op::Cumsum { .. } if out != DType::Bool && ins[0] != DType::Bool => {
            return None
        }
        Op::Reduce { .. } | Op::Cumsum { .. } => "bool values".into(),
        Op::Softmax { .. } if real(out) => return None,
        Op::Softmax { .. } => format!("softmax of {out}"),
        Op::TopK { output, .. }
            if ins[0] != DType::Bool
                && (*output == TopKOutput::Values || out == DType::I32) =>
        {
            return None
        }
        Op::TopK { .. } => format!("top-k of {} giving {out}", ins[0]),
        Op::MatMul
            if real(out)
                && ins.iter().all(|&d| d == out)
                && n.inputs.iter().all(|i| g.shape(*i).rank() >= 2) =>
        {
            return None
        }
        Op::MatMul => format!("matmul of {ins:?} -> {out} (float operands of rank 2 or more run)"),
        Op::DequantMatMul { scheme }
            if ins[0] == DType::F32
                && source::dequant_matmul(*scheme, out, false).is_some()
                && g.shape(n.inputs[1]).static_dims().and_then(|d| d.last().copied())
                    == g.shape(n.inputs[0]).static_dims().and_then(|d| d.last().copied()).and_then(|k| scheme.row_bytes(k)) =>
        {
            return None
        }
        Op::DequantMatMul { scheme } => format!(
            "{scheme:?} products of {} activations giving {out} (GGUF weights, f32 activations run)",
            ins[0]
        ),
        Op::DequantizeRows { scheme } if source::dequantize_rows(*scheme, out).is_some() => return None,
        Op::DequantizeRows { scheme } => format!("{scheme:?} rows as {out}"),
        Op::CacheWrite if source::cache_write(ins[0], ins[1], ins[2]).is_some() => return None,
        Op::CacheWrite => format!("a cache write of {} into {}", ins[1], ins[0]),
        Op::CachedAttention { .. }
            if source::attention_scores(ins[0], ins[1], ins[3], false).is_some()
                && ins[2] == ins[1]
                && source::attention_values(ins[2], out, 256).is_some() =>
        {
            return None
        }
        Op::CachedAttention { .. } => format!("cached attention over {ins:?} giving {out}"),
        Op::PagedAttention { .. }
            if source::paged_scores(ins[0], ins[1]).is_some()
                && ins[2] == ins[1]
                && ins[3] == DType::I32
                && ins[4] == DType::I32
                && source::paged_values(ins[2], out).is_some() =>
        {
            return None
        }
        Op::PagedAttention { .. } => format!("paged attention over {ins:?} giving {out}"),
        Op::Rope { .. }
            if source::rope(out, ins[1], None).is_some()
                && n.shape.static_dims().is_some_and(|d| d.len() >= 2 && d[d.len() - 1] % 2 == 0) =>
        {
            return None
        }
        Op::Rope { .. } => format!("rope of {out} at {} positions (odd head width or dtype)", ins[1]),
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
            let rms = matches!(n.op, Op::RmsNorm { .. });
            if source::norm(ins[0], ins[1], ins.get(2).copied().filter(|_| !rms), out, rms, 32)
                .is_some()
                && n.inputs.len() == if rms { 2 } else { 3 }
            {
                return None;
            }
            format!("{} of {ins:?} giving {out}", n.op.name())
        }
        // f32, head dims the kernel's lanes hold: one launch (`source::attention`); else the
        // compiler's decomposition.
        Op::Attention { mask, .. } => {
            let (qd, vd) = (g.shape(n.inputs[0]).dims(), g.shape(n.inputs[2]).dims());
            let small = |d: &[rlx_ir::Dim]| {
                d.len() == 4 && d[3].as_static().is_some_and(|x| x <= source::ATTENTION_MAX_D)
            };
            let custom = *mask == rlx_ir::MaskKind::Custom;
            if out == DType::F32
                && ins.iter().all(|&t| t == DType::F32)
                && small(qd)
                && small(vd)
                && n.inputs.len() == 3 + custom as usize
            {
                return None;
            }
            format!(
                "attention of {ins:?} giving {out} (f32 with head dims up to {} runs as one kernel)",
                source::ATTENTION_MAX_D
            )
        }
        Op::DotGeneral(_)
        | Op::Conv(_)
        | Op::Pool(_)
        | Op::Custom(_) => format!("no CUDA kernel for {} yet", n.op.name()),
        Op::Defined(_) if crate::registered::kernel_for(g, id).is_some() => return None,
        Op::Defined(_) => format!("no CUDA kernel for {} yet", n.op.name()),
    };
    Some(why)
}

/// The dims of value `id` (static: [`unsupported`] checked).
fn dims(g: &Graph, id: NodeId) -> Result<Vec<usize>> {
    g.shape(id).static_dims().ok_or_else(|| Error::Unsupported {
        backend: "cuda".into(),
        op: g.node(id).op.name().into(),
        node: id,
        msg: format!(
            "shape {} has symbolic dimensions; bind them before compiling",
            g.shape(id)
        ),
    })
}

/// Row-major strides of dims `d`, in elements.
pub(crate) fn dense_strides(d: &[usize]) -> Vec<usize> {
    let mut s = vec![1; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * d[i + 1];
    }
    s
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

/// Bytes of one element of `dt` here.
fn elem_bytes(dt: DType) -> usize {
    match dt {
        DType::Bool => 1,
        d => d.size_bytes(),
    }
}

/// A word before addresses are fixed.
#[derive(Clone, Copy, Debug)]
enum Pending {
    Imm(i64),
    /// A value's bytes (by node), plus a byte offset.
    Value(usize, u64),
    /// Scratch bytes (an arena request of their own).
    Scratch(usize),
}

fn imm(v: usize) -> Pending {
    Pending::Imm(v as i64)
}

struct Step {
    kernel: usize,
    grid: [u32; 3],
    block: u32,
    words: Vec<Pending>,
    node: usize,
    op: &'static str,
    gemm: Option<Gemm<Pending>>,
}

struct Lowering<'g> {
    g: &'g Graph,
    sources: Vec<String>,
    by_source: HashMap<String, usize>,
    steps: Vec<Step>,
    reqs: Vec<BufferRequest>,
    /// The arena request of each node's bytes (aliases share one).
    req_of: Vec<Option<usize>>,
    /// The params-buffer offset of each node that is (an alias of) a param there.
    param_of: Vec<Option<u64>>,
    /// Bytes into its request (or param) at which each node's value begins: non-zero for a
    /// view of part of another value ([`rlx_driver::views::narrow_view`]).
    off_of: Vec<u64>,
    params_bytes: u64,
    /// Further results of a fused region: computed by the step of that node.
    extra_of: Vec<Option<usize>>,
    /// Rotations whose only reader (through reshapes) is a cache write, which writes them
    /// rotated ([`ropes_into_caches`]): by the cache write's node, the rotation.
    rope_of: Vec<Option<NodeId>>,
    consts: Vec<(usize, Vec<u8>)>,
    p: Program,
    input_req: Vec<usize>,
    param_place: Vec<Result<u64, usize>>,
}

mod attention;
mod fuse;
pub(crate) use fuse::takes_norm;
use fuse::{ropes_into_caches, taken_in, NormProduct};

/// Blocks for `n` items of `per` each, at most 65535·16.
fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per.max(1)).clamp(1, 65535 * 16) as u32
}

/// Lower `g` (verified, optimized, decomposed for [`crate::CudaBackend`]); params named in
/// `shared` are read from there.
pub fn lower(g: &Graph, shared: SharedParams<'_>) -> Result<Program> {
    let n = g.len();
    let mut l = Lowering {
        g,
        sources: Vec::new(),
        by_source: HashMap::new(),
        steps: Vec::new(),
        reqs: Vec::new(),
        req_of: vec![None; n],
        param_of: vec![None; n],
        off_of: vec![0; n],
        params_bytes: 0,
        extra_of: vec![None; n],
        rope_of: Vec::new(),
        consts: Vec::new(),
        p: Program::default(),
        input_req: Vec::new(),
        param_place: Vec::new(),
    };
    l.rope_of = ropes_into_caches(g);
    let into_cache: Vec<bool> = {
        let mut v = vec![false; n];
        for r in l.rope_of.iter().flatten() {
            v[r.index()] = true;
        }
        v
    };
    for id in g.ids() {
        if let Some(why) = unsupported(g, id) {
            return Err(Error::Unsupported {
                backend: "cuda".into(),
                op: g.node(id).op.name().into(),
                node: id,
                msg: why,
            });
        }
        let node = g.node(id);
        let i = id.index();
        let step = l.steps.len();
        l.keep_operands(node, step);
        if l.extra_of[i].is_some() || into_cache[i] {
            continue;
        }
        let d = dims(g, id)?;
        let bytes = d.iter().product::<usize>().max(1) * elem_bytes(node.shape.dtype());
        match &node.op {
            Op::Input { name } => {
                l.p.inputs.push(IoSlot {
                    name: name.clone(),
                    shape: node.shape.clone(),
                });
                let r = l.request(bytes, 0, usize::MAX);
                l.req_of[i] = Some(r);
                l.input_req.push(r);
            }
            Op::Param { name } => {
                l.p.params.push(IoSlot {
                    name: name.clone(),
                    shape: node.shape.clone(),
                });
                let other = shared
                    .iter()
                    .find(|(s, _)| s.name == *name && s.shape == node.shape)
                    .map(|(_, at)| *at);
                match (shared.is_empty(), other) {
                    (_, Some(Loc::Params(off))) => {
                        l.param_of[i] = Some(off);
                        l.param_place.push(Ok(off));
                    }
                    (true, _) => {
                        let off = l.params_bytes;
                        l.params_bytes += (bytes as u64).next_multiple_of(256);
                        l.param_of[i] = Some(off);
                        l.param_place.push(Ok(off));
                    }
                    // Sharing, but the other program has no such param: bytes of its own.
                    (false, _) => {
                        let r = l.request(bytes, 0, usize::MAX);
                        l.req_of[i] = Some(r);
                        l.param_place.push(Err(r));
                    }
                }
            }
            Op::Constant { data } => {
                let r = l.request(bytes, 0, usize::MAX);
                l.req_of[i] = Some(r);
                l.consts.push((r, data.clone()));
            }
            Op::Reshape { .. } => {
                let x = node.inputs[0].index();
                l.req_of[i] = l.req_of[x];
                l.param_of[i] = l.param_of[x];
                l.off_of[i] = l.off_of[x];
            }
            // A narrow whose result is a contiguous range of its operand: a view from an
            // offset on a 16-byte boundary (as the wgpu backend keeps them; every element type
            // divides it), no launch.
            Op::Narrow { .. }
                if rlx_driver::views::narrow_view(g, id)
                    .is_some_and(|e| (e * elem_bytes(node.shape.dtype())).is_multiple_of(16)) =>
            {
                let x = node.inputs[0].index();
                let e = rlx_driver::views::narrow_view(g, id).expect("checked by the guard");
                l.req_of[i] = l.req_of[x];
                l.param_of[i] = l.param_of[x];
                l.off_of[i] = l.off_of[x] + (e * elem_bytes(node.shape.dtype())) as u64;
            }
            Op::Concat { axis } => l.concat(id, &d, *axis, bytes)?,
            Op::CacheWrite => {
                // In place: the result is the cache's own bytes.
                let c = node.inputs[0].index();
                l.req_of[i] = l.req_of[c];
                l.param_of[i] = l.param_of[c];
                l.off_of[i] = l.off_of[c];
                l.cache_write(id)?;
                l.keep_operands(node, step);
            }
            _ => {
                let r = l.request(bytes, step, step);
                l.req_of[i] = Some(r);
                l.compute(id, &d)?;
                let end = l.steps.len().saturating_sub(1).max(step);
                l.reqs[r].start = step;
                l.reqs[r].end = l.reqs[r].end.max(end);
                l.keep_operands(node, end);
            }
        }
    }
    l.finish()
}

impl Lowering<'_> {
    fn request(&mut self, size: usize, start: usize, end: usize) -> usize {
        self.reqs.push(BufferRequest { size, start, end });
        self.reqs.len() - 1
    }

    fn keep_operands(&mut self, node: &Node, end: usize) {
        for x in &node.inputs {
            if let Some(r) = self.req_of[x.index()] {
                self.reqs[r].end = self.reqs[r].end.max(end);
            }
        }
    }

    fn kernel(&mut self, src: String) -> usize {
        if let Some(&k) = self.by_source.get(&src) {
            return k;
        }
        self.sources.push(src.clone());
        self.by_source.insert(src, self.sources.len() - 1);
        self.sources.len() - 1
    }

    fn launch(
        &mut self,
        id: NodeId,
        src: Option<String>,
        grid: [u32; 3],
        block: u32,
        words: Vec<Pending>,
    ) -> Result<()> {
        let node = self.g.node(id);
        let src = src.ok_or_else(|| Error::Unsupported {
            backend: "cuda".into(),
            op: node.op.name().into(),
            node: id,
            msg: "no CUDA C kernel for these dtypes".into(),
        })?;
        // The kernel takes its words by value as one struct of `w[N]`: the launch must give
        // exactly N (the driver would read past a shorter list).
        let n = src
            .split_once("struct M { i64 w[")
            .and_then(|(_, r)| r.split_once(']'))
            .and_then(|(n, _)| n.parse::<usize>().ok());
        if n != Some(words.len().max(1)) {
            return Err(Error::Unsupported {
                backend: "cuda".into(),
                op: node.op.name().into(),
                node: id,
                msg: format!(
                    "a launch gives {} words to a kernel that takes {n:?} (a lowering bug)",
                    words.len()
                ),
            });
        }
        let kernel = self.kernel(src);
        self.steps.push(Step {
            kernel,
            grid,
            block,
            words,
            node: id.index(),
            op: node.op.step_name(),
            gemm: None,
        });
        Ok(())
    }

    fn val(&self, x: NodeId) -> Pending {
        Pending::Value(x.index(), 0)
    }

    /// The one step (or steps) computing node `id` of dims `d`.
    fn compute(&mut self, id: NodeId, d: &[usize]) -> Result<()> {
        let g = self.g;
        let node = g.node(id);
        let nel: usize = d.iter().product::<usize>();
        let x = node.inputs.first().copied();
        let dt = node.shape.dtype();
        match &node.op {
            Op::Binary(_) | Op::Activation(_) | Op::Compare(_) | Op::Where | Op::Cast { .. } => {
                self.elementwise(id, d)
            }
            Op::Fused(r) if r.kind == FusionKind::NormMatMul => {
                let np = fuse::norm_product(g, id).ok_or_else(|| {
                    taken_in(id, node, "the first result of a norm_matmul region")
                })?;
                self.dequant_matmul(id, d, &np)
            }
            Op::Fused(_) => self.elementwise(id, d),
            Op::Transpose { perm } => {
                let x = x.expect("an operand");
                let ss = dense_strides(&dims(g, x)?);
                self.copy(
                    id,
                    x,
                    0,
                    perm.iter().map(|&p| ss[p]).collect(),
                    d.to_vec(),
                    id,
                    0,
                )
            }
            Op::Narrow { axis, start, .. } => {
                let x = x.expect("an operand");
                let ss = dense_strides(&dims(g, x)?);
                self.copy(id, x, start * ss[*axis], ss, d.to_vec(), id, 0)
            }
            Op::Expand { .. } => {
                let x = x.expect("an operand");
                let s = broadcast_strides(&dims(g, x)?, d);
                self.copy(id, x, 0, s, d.to_vec(), id, 0)
            }
            Op::Gather { axis } => {
                let (x, idx) = (node.inputs[0], node.inputs[1]);
                let (xd, idd) = (dims(g, x)?, dims(g, idx)?);
                let (xs, is) = (dense_strides(&xd), dense_strides(&idd));
                let ir = idd.len();
                let rank = d.len();
                let mut words = vec![
                    imm(nel),
                    self.val(x),
                    self.val(idx),
                    self.val(id),
                    imm(xd[*axis]),
                    imm(xs[*axis]),
                ];
                words.extend(d.iter().map(|&v| imm(v)));
                words.extend((0..rank).map(|p| {
                    imm(if p < *axis {
                        xs[p]
                    } else if p < axis + ir {
                        0
                    } else {
                        xs[p - ir + 1]
                    })
                }));
                words.extend((0..rank).map(|p| {
                    imm(if p >= *axis && p < axis + ir {
                        is[p - axis]
                    } else {
                        0
                    })
                }));
                let src = source::gather(elem_bytes(dt), g.shape(idx).dtype(), rank);
                self.launch(id, src, [blocks(nel, BLOCK as usize), 1, 1], BLOCK, words)
            }
            Op::ScatterAdd { axis } => {
                let (x, idx, u) = (node.inputs[0], node.inputs[1], node.inputs[2]);
                let ud = dims(g, u)?;
                let m = dims(g, idx)?[0];
                let mut words = vec![
                    imm(nel),
                    self.val(x),
                    self.val(u),
                    self.val(idx),
                    self.val(id),
                    imm(m),
                    imm(*axis),
                ];
                words.extend(d.iter().map(|&v| imm(v)));
                words.extend(dense_strides(&ud).into_iter().map(imm));
                let src = source::scatter_add(dt, g.shape(idx).dtype(), d.len());
                self.launch(id, src, [blocks(nel, BLOCK as usize), 1, 1], BLOCK, words)
            }
            Op::Reduce { kind, axes, .. } => {
                let x = x.expect("an operand");
                let xd = dims(g, x)?;
                let xs = dense_strides(&xd);
                let (mut od, mut os, mut id_, mut is) = (vec![], vec![], vec![], vec![]);
                for a in 0..xd.len() {
                    if axes.contains(&a) {
                        id_.push(xd[a]);
                        is.push(xs[a]);
                    } else {
                        od.push(xd[a]);
                        os.push(xs[a]);
                    }
                }
                let (n_out, count) = (od.iter().product::<usize>(), id_.iter().product::<usize>());
                let t = source::row_threads(count, n_out);
                let mut words = vec![imm(n_out), imm(count), self.val(x), self.val(id)];
                for v in [&od, &os, &id_, &is] {
                    words.extend(v.iter().map(|&v| imm(v)));
                }
                let src = source::reduce(*kind, g.shape(x).dtype(), dt, od.len(), id_.len(), t);
                self.launch(id, src, row_grid(n_out, t), BLOCK, words)
            }
            Op::Softmax { axis } | Op::Cumsum { axis } => {
                let x = x.expect("an operand");
                let len = d[*axis];
                let inner: usize = d[axis + 1..].iter().product();
                let rows = nel.checked_div(len).unwrap_or(0);
                let words = vec![imm(rows), imm(len), self.val(x), self.val(id), imm(inner)];
                if matches!(node.op, Op::Softmax { .. }) {
                    let t = source::row_threads(len, rows);
                    self.launch(id, source::softmax(dt, t), row_grid(rows, t), BLOCK, words)
                } else {
                    self.launch(
                        id,
                        source::cumsum(dt),
                        [blocks(rows, BLOCK as usize), 1, 1],
                        BLOCK,
                        words,
                    )
                }
            }
            Op::TopK { k, output } => {
                let x = x.expect("an operand");
                let xd = dims(g, x)?;
                let len = *xd.last().unwrap_or(&1);
                let rows: usize = xd[..xd.len().saturating_sub(1)].iter().product();
                let words = vec![imm(rows), imm(*k), imm(len), self.val(x), self.val(id)];
                let src = source::topk(g.shape(x).dtype(), *output == TopKOutput::Indices);
                let grid = [blocks(rows, 1), 1, 1];
                self.launch(id, src, grid, source::TOPK_THREADS, words)
            }
            Op::MatMul => {
                let (a, b) = (node.inputs[0], node.inputs[1]);
                let (ad, bd) = (dims(g, a)?, dims(g, b)?);
                let r = d.len();
                let (m, k, n) = (d[r - 2], ad[ad.len() - 1], d[r - 1]);
                let cb = &d[..r - 2];
                let batches: usize = cb.iter().product();
                let strides = |xd: &[usize]| broadcast_strides(&xd[..xd.len() - 2], cb);
                let mut words = vec![
                    imm(m),
                    imm(k),
                    imm(n),
                    self.val(a),
                    self.val(b),
                    self.val(id),
                    imm(batches),
                ];
                words.extend(cb.iter().map(|&v| imm(v)));
                words.extend(strides(&ad).into_iter().map(imm));
                words.extend(strides(&bd).into_iter().map(imm));
                let grid = [
                    n.div_ceil(16).max(1) as u32,
                    m.div_ceil(16).max(1) as u32,
                    batches.clamp(1, 65535) as u32,
                ];
                if grid[1] > 65535 {
                    return Err(Error::Unsupported {
                        backend: "cuda".into(),
                        op: "matmul".into(),
                        node: id,
                        msg: format!("{m} rows (at most {} per product)", 65535 * 16),
                    });
                }
                self.launch(id, source::matmul(dt, cb.len()), grid, 256, words)?;
                let at = [self.val(a), self.val(b), self.val(id)];
                let gemm = Gemm::for_matmul(dt, [m, k, n], cb, &strides(&ad), &strides(&bd), at);
                if let Some(step) = self.steps.last_mut() {
                    step.gemm = gemm;
                }
                Ok(())
            }
            Op::DequantMatMul { scheme } => {
                let plain = NormProduct::plain(*scheme, node.inputs[0], node.inputs[1]);
                self.dequant_matmul(id, d, &plain)
            }
            Op::DequantizeRows { scheme } => {
                let w = node.inputs[0];
                let wd = dims(g, w)?;
                let k = *d.last().unwrap_or(&1);
                let words = vec![
                    imm(nel),
                    imm(k),
                    imm(*wd.last().unwrap_or(&0)),
                    self.val(w),
                    self.val(id),
                ];
                let src = source::dequantize_rows(*scheme, dt);
                self.launch(id, src, [blocks(nel, BLOCK as usize), 1, 1], BLOCK, words)
            }
            Op::LayerNorm { eps } | Op::RmsNorm { eps } => {
                let rms = matches!(node.op, Op::RmsNorm { .. });
                let width = *d.last().unwrap_or(&1);
                let rows = nel.checked_div(width).unwrap_or(0);
                let beta = (!rms).then(|| node.inputs[2]);
                let words = vec![
                    imm(rows),
                    imm(width),
                    self.val(node.inputs[0]),
                    self.val(node.inputs[1]),
                    beta.map_or(imm(0), |b| self.val(b)),
                    self.val(id),
                    Pending::Imm(eps.to_bits() as i32 as i64),
                ];
                // Few rows (decode): a block per row, so the row's loads are all in flight.
                let t = if rows < 64 {
                    256
                } else {
                    source::row_threads(width, rows)
                };
                let src = source::norm(
                    g.shape(node.inputs[0]).dtype(),
                    g.shape(node.inputs[1]).dtype(),
                    beta.map(|b| g.shape(b).dtype()),
                    dt,
                    rms,
                    t,
                );
                self.launch(id, src, row_grid(rows, t), BLOCK, words)
            }
            Op::Rope { theta, interleaved } => {
                let (x, pos) = (node.inputs[0], node.inputs[1]);
                let (s, half) = (d[d.len() - 2], d[d.len() - 1] / 2);
                let pairs = nel / 2;
                let words = vec![
                    imm(pairs),
                    imm(s.max(1)),
                    imm(half.max(1)),
                    self.val(x),
                    self.val(pos),
                    self.val(id),
                    Pending::Imm(theta.to_bits() as i32 as i64),
                    imm(*interleaved as usize),
                    imm(0),
                    imm(0),
                    imm(0),
                ];
                let src = source::rope(dt, g.shape(pos).dtype(), None);
                self.launch(id, src, [blocks(pairs, BLOCK as usize), 1, 1], BLOCK, words)
            }
            Op::CachedAttention { scale, window } => self.cached_attention(id, *scale, *window),
            Op::Attention { mask, scale } => self.attention(id, *mask, *scale),
            Op::PagedAttention {
                scale,
                window,
                block,
            } => self.paged_attention(id, *scale, *window, *block),
            Op::Defined(_) => {
                match (primitive_of(&node.op), crate::registered::kernel_for(g, id)) {
                    (Some(p), _) => self.complex(id, d, p),
                    (None, Some(k)) => {
                        let mut words = vec![imm(k.items), self.val(id)];
                        words.extend(node.inputs.iter().map(|&x| self.val(x)));
                        words.extend(k.words.iter().map(|&w| Pending::Imm(w)));
                        let src = source::grid_kernel(words.len(), &k.body);
                        self.launch(
                            id,
                            Some(src),
                            [blocks(k.items, BLOCK as usize), 1, 1],
                            BLOCK,
                            words,
                        )
                    }
                    (None, None) => Err(Error::Unsupported {
                        backend: "cuda".into(),
                        op: node.op.name().into(),
                        node: id,
                        msg: "no CUDA kernel".into(),
                    }),
                }
            }
            other => Err(Error::Unsupported {
                backend: "cuda".into(),
                op: other.name().into(),
                node: id,
                msg: "no CUDA kernel".into(),
            }),
        }
    }

    /// The complex primitives as copies of f32 words: c64 values are pairs of them, so `real`
    /// and `imag` read every other word (from the first or the second) and `complex` writes its
    /// operands (broadcast) into every other word, one copy each.
    fn complex(&mut self, id: NodeId, d: &[usize], p: Primitive) -> Result<()> {
        let node = self.g.node(id);
        let dense = dense_strides(d);
        let pairs: Vec<usize> = dense.iter().map(|s| 2 * s).collect();
        match p {
            Primitive::Real | Primitive::Imag => {
                let off = usize::from(p == Primitive::Imag);
                self.copy_to(4, id, node.inputs[0], off, pairs, d.to_vec(), id, 0, dense)
            }
            Primitive::Complex => {
                for (k, &x) in node.inputs.iter().enumerate() {
                    let s = broadcast_strides(&dims(self.g, x)?, d);
                    self.copy_to(4, id, x, 0, s, d.to_vec(), id, k, pairs.clone())?;
                }
                Ok(())
            }
        }
    }

    /// Elementwise ops (as a body of one op) and fused elementwise regions.
    fn elementwise(&mut self, id: NodeId, d: &[usize]) -> Result<()> {
        let g = self.g;
        let node = g.node(id);
        let i = id.index();
        let (body, extra) = match &node.op {
            Op::Fused(r) => {
                let mut extra: Vec<usize> = g
                    .fused_results(id)
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
                (body, extra)
            }
            op => {
                let mut body = Graph::new("op");
                let args: Vec<NodeId> = node
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(k, x)| body.try_input(&format!("in{k}"), g.shape(*x).clone()))
                    .collect::<Result<_>>()?;
                let y = body.try_op(op.clone(), &args)?;
                body.set_outputs(vec![y]);
                (body, Vec::new())
            }
        };
        let nel: usize = d.iter().product();
        let mut words = vec![imm(nel), self.val(id)];
        words.extend(d.iter().map(|&v| imm(v)));
        let mut access = Vec::new();
        for x in &node.inputs {
            let xd = dims(g, *x)?;
            let a = if xd.iter().product::<usize>() == 1 {
                Access::Scalar
            } else if xd == d {
                Access::Dense
            } else {
                Access::Strided
            };
            access.push(a);
            words.push(self.val(*x));
            let s = if a == Access::Strided {
                broadcast_strides(&xd, d)
            } else {
                vec![0; d.len()]
            };
            words.extend(s.into_iter().map(imm));
        }
        for &s in &extra {
            let sd = dims(g, NodeId(s as u32))?;
            let bytes = sd.iter().product::<usize>().max(1)
                * elem_bytes(g.node(NodeId(s as u32)).shape.dtype());
            let step = self.steps.len();
            let r = self.request(bytes, step, step);
            self.req_of[s] = Some(r);
            self.extra_of[s] = Some(i);
            words.push(Pending::Value(s, 0));
        }
        let src = source::elementwise(&body, d.len(), &access);
        self.launch(id, src, [blocks(nel, BLOCK as usize), 1, 1], BLOCK, words)
    }

    /// A strided copy of `src` (from element `src_off`, `src_strides`) over `dims` into `dst`
    /// (from element `dst_off`, dense).
    #[allow(clippy::too_many_arguments)]
    fn copy(
        &mut self,
        id: NodeId,
        src: NodeId,
        src_off: usize,
        src_strides: Vec<usize>,
        dims_: Vec<usize>,
        dst: NodeId,
        dst_off: usize,
    ) -> Result<()> {
        let dst_strides =
            dense_strides(self.g.shape(dst).static_dims().as_deref().unwrap_or(&dims_));
        self.copy_to(
            elem_bytes(self.g.shape(src).dtype()),
            id,
            src,
            src_off,
            src_strides,
            dims_,
            dst,
            dst_off,
            dst_strides,
        )
    }

    /// A strided copy of elements of `eb` bytes (offsets and strides count them).
    #[allow(clippy::too_many_arguments)]
    fn copy_to(
        &mut self,
        eb: usize,
        id: NodeId,
        src: NodeId,
        src_off: usize,
        src_strides: Vec<usize>,
        dims_: Vec<usize>,
        dst: NodeId,
        dst_off: usize,
        dst_strides: Vec<usize>,
    ) -> Result<()> {
        let nel: usize = dims_.iter().product();
        let rank = dims_.len();
        let mut words = vec![
            imm(nel),
            Pending::Value(src.index(), (src_off * eb) as u64),
            Pending::Value(dst.index(), (dst_off * eb) as u64),
        ];
        words.extend(dims_.iter().map(|&v| imm(v)));
        words.extend(src_strides.into_iter().map(imm));
        words.extend(dst_strides.into_iter().map(imm));
        self.launch(
            id,
            source::copy(eb, rank),
            [blocks(nel, BLOCK as usize), 1, 1],
            BLOCK,
            words,
        )
    }

    /// A scratch request live from the next step on (its end set by [`Lowering::until_now`]).
    fn scratch(&mut self, bytes: usize) -> usize {
        let step = self.steps.len();
        self.request(bytes, step, usize::MAX)
    }

    /// Scratch request `r` lives through the last step pushed.
    fn until_now(&mut self, r: usize) {
        self.reqs[r].end = self.steps.len().saturating_sub(1);
    }

    /// A GGUF product (`np`, at node `id`): up to 8 rows the matrix-vector kernel, which
    /// rounds the activations to int8 blocks itself (where the scheme and the row count ask for
    /// it) when they fit in its shared memory, normalizing them first for a `norm_matmul`
    /// region (and adding the residual, whose sum it writes); else they are rounded first
    /// (into scratch) and the matrix-vector kernel or, for more rows, a warp per result column
    /// and tile of rows takes them.
    fn dequant_matmul(&mut self, id: NodeId, d: &[usize], np: &NormProduct) -> Result<()> {
        let g = self.g;
        let node = g.node(id);
        let (x, w, scheme) = (np.x, np.w, np.scheme);
        let (xd, wd) = (dims(g, x)?, dims(g, w)?);
        let k = *xd.last().unwrap_or(&1);
        let n = *d.last().unwrap_or(&1);
        let xe: usize = xd.iter().product();
        let rows = xe.checked_div(k).unwrap_or(0);
        // A decode product whose activations fit in shared memory rounds them itself (and
        // applies the region's RMSNorm first).
        let staged = rows <= source::QROWS && xe <= source::MATVEC_STAGE;
        if np.norm.is_some() && !staged {
            return Err(taken_in(id, node, "a norm_matmul region of a few rows"));
        }
        // Rounding goes by the rows of the last matrix, as on the CPU (`x [B, 1, K]` is B
        // one-row products, rounded as one-token steps are), the kernel by all rows.
        let mrows = if xd.len() >= 2 { xd[xd.len() - 2] } else { 1 };
        let round = scheme.act_block(mrows);
        let mut x_at = self.val(x);
        let (mut scratch, mut sums) = (None, None);
        if let Some(blk) = round.filter(|_| !staged) {
            let r = self.scratch(xe.max(1) * 4);
            let blocks_ = xe / blk;
            // The block sums of Q4_1 / Q5_1's offsets (Q8_1's, f16).
            let s = matches!(
                scheme,
                rlx_ir::QuantScheme::GgufQ4_1 | rlx_ir::QuantScheme::GgufQ5_1
            )
            .then(|| self.scratch(blocks_.max(1) * 4));
            let words = vec![
                imm(blocks_),
                self.val(x),
                Pending::Scratch(r),
                s.map_or(imm(0), Pending::Scratch),
            ];
            sums = s;
            self.launch(
                id,
                source::quantize_acts(blk),
                [blocks(blocks_, BLOCK as usize), 1, 1],
                BLOCK,
                words,
            )?;
            x_at = Pending::Scratch(r);
            scratch = Some(r);
        }
        let mut words = vec![
            imm(rows),
            imm(k),
            imm(n),
            x_at,
            self.val(w),
            imm(*wd.last().unwrap_or(&0)),
            self.val(id),
        ];
        if rows <= source::QROWS {
            // A few rows (decode): the matrix-vector kernel.
            let split = source::matvec_split(scheme, k, n);
            let src = source::dequant_matvec(
                scheme,
                node.shape.dtype(),
                split,
                staged,
                np.norm.is_some(),
                np.add.is_some(),
            );
            let threads = 32 * source::MATVEC_WARPS as u32;
            let cols = source::MATVEC_WARPS / split;
            words.push(imm(if staged { round.unwrap_or(0) } else { 0 }));
            words.push(sums.map_or(imm(0), Pending::Scratch));
            match np.norm {
                Some((gamma, eps)) => {
                    words.push(self.val(gamma));
                    words.push(Pending::Imm(eps.to_bits() as i32 as i64));
                }
                None => words.extend([imm(0), imm(0)]),
            }
            match np.add {
                Some((x2, sum)) => {
                    words.push(self.val(x2));
                    // The sum, the region's second result, comes from this launch (block 0
                    // writes it); where nothing outside reads it, into scratch.
                    let bytes = xe.max(1) * 4;
                    match sum {
                        Some(s) => {
                            let step = self.steps.len();
                            self.req_of[s.index()] = Some(self.request(bytes, step, step));
                            self.extra_of[s.index()] = Some(id.index());
                            words.push(Pending::Value(s.index(), 0));
                        }
                        // (Staged: no rounding scratch was taken above.)
                        None => {
                            let r = self.scratch(bytes);
                            scratch = Some(r);
                            words.push(Pending::Scratch(r));
                        }
                    }
                }
                None => words.extend([imm(0), imm(0)]),
            }
            // Staged, a block stages once for every column it takes: at most
            // `MATVEC_GRID` blocks, striding over the columns (the output head).
            let mut grid = blocks(n, cols);
            if staged {
                grid = grid.min(source::MATVEC_GRID);
            }
            self.launch(id, src, [grid, 1, 1], threads, words)?;
        } else if round.is_none() && g.shape(x).dtype() == DType::F32 {
            // A prompt's rows, taken as they are: tensor cores (3xTF32), a block per 64 x 32
            // tile of the result.
            let [bm, bn] = source::MMA_TILE;
            let grid = [blocks(n, bn), blocks(rows, bm), 1];
            if grid[1] > 65535 {
                return Err(Error::Unsupported {
                    backend: "cuda".into(),
                    op: node.op.name().into(),
                    node: id,
                    msg: format!("{rows} rows (at most {} per product)", 65535 * bm),
                });
            }
            let src = source::dequant_mma(scheme, node.shape.dtype());
            self.launch(id, src, grid, source::MMA_THREADS, words)?;
        } else {
            let tiles = rows.div_ceil(source::QROWS);
            words.push(imm(tiles));
            // Q4_1 / Q5_1 offsets times the rounding launch's block sums, as in the
            // matrix-vector kernel (`x [B, 1, K]` of B > 8: B one-row products).
            words.push(sums.map_or(imm(0), Pending::Scratch));
            let src = source::dequant_matmul(scheme, node.shape.dtype(), sums.is_some());
            self.launch(
                id,
                src,
                [blocks(tiles * n, (BLOCK / 32) as usize), 1, 1],
                BLOCK,
                words,
            )?;
        }
        for r in scratch.into_iter().chain(sums) {
            self.until_now(r);
        }
        Ok(())
    }

    /// Rows of the update into the cache, in place; an update that is a rotation read by
    /// nothing else ([`ropes_into_caches`]) is rotated on its way in.
    fn cache_write(&mut self, id: NodeId) -> Result<()> {
        let g = self.g;
        let node = g.node(id);
        if let Some(r) = self.rope_of[id.index()] {
            let rn = g.node(r);
            let Op::Rope { theta, interleaved } = rn.op else {
                return Err(taken_in(id, rn, "a rotation"));
            };
            let (d, cd) = (dims(g, r)?, dims(g, node.inputs[0])?);
            let (s, half) = (d[d.len() - 2], d[d.len() - 1] / 2);
            let pairs = d.iter().product::<usize>() / 2;
            let words = vec![
                imm(pairs),
                imm(s.max(1)),
                imm(half.max(1)),
                self.val(rn.inputs[0]),
                self.val(rn.inputs[1]),
                self.val(node.inputs[0]),
                Pending::Imm(theta.to_bits() as i32 as i64),
                imm(interleaved as usize),
                self.val(node.inputs[2]),
                imm(cd[1..].iter().product::<usize>().max(1)),
                imm(cd[0]),
            ];
            let src = source::rope(
                DType::F32,
                g.shape(rn.inputs[1]).dtype(),
                Some(g.shape(node.inputs[0]).dtype()),
            );
            self.launch(id, src, [blocks(pairs, BLOCK as usize), 1, 1], BLOCK, words)?;
            // The rotation's operands are read by this launch.
            self.keep_operands(rn, self.steps.len().saturating_sub(1));
            return Ok(());
        }
        let (cache, upd, pos) = (node.inputs[0], node.inputs[1], node.inputs[2]);
        let (cd, ud, pd) = (dims(g, cache)?, dims(g, upd)?, dims(g, pos)?);
        let row: usize = cd[1..].iter().product();
        let n_upd: usize = ud.iter().product();
        let slots = pd.iter().product::<usize>() != 1;
        let words = vec![
            imm(n_upd),
            imm(row.max(1)),
            imm(cd[0]),
            self.val(cache),
            self.val(upd),
            self.val(pos),
            imm(slots as usize),
        ];
        let src = source::cache_write(
            g.shape(cache).dtype(),
            g.shape(upd).dtype(),
            g.shape(pos).dtype(),
        );
        self.launch(id, src, [blocks(n_upd, BLOCK as usize), 1, 1], BLOCK, words)
    }

    /// One copy per part into its slice of the result.
    fn concat(&mut self, id: NodeId, d: &[usize], axis: usize, bytes: usize) -> Result<()> {
        let g = self.g;
        let node = g.node(id);
        let step = self.steps.len();
        let r = self.request(bytes, step, step);
        self.req_of[id.index()] = Some(r);
        let ds = dense_strides(d);
        let mut from = 0;
        for &x in &node.inputs {
            let pd = dims(g, x)?;
            let len = pd[axis];
            if pd.iter().product::<usize>() > 0 {
                self.copy_to(
                    elem_bytes(g.shape(x).dtype()),
                    id,
                    x,
                    0,
                    dense_strides(&pd),
                    pd.clone(),
                    id,
                    from * ds[axis],
                    ds.clone(),
                )?;
            }
            from += len;
        }
        let end = self.steps.len().saturating_sub(1).max(step);
        self.reqs[r].end = end;
        self.keep_operands(node, end);
        Ok(())
    }

    fn finish(mut self) -> Result<Program> {
        let nsteps = self.steps.len();
        for o in self.g.outputs() {
            if let Some(r) = self.req_of[o.index()] {
                self.reqs[r].end = usize::MAX;
            }
        }
        for r in self.reqs.iter_mut() {
            r.end = r.end.min(nsteps.max(1));
            r.start = r.start.min(r.end);
            r.size = r.size.next_multiple_of(16);
        }
        let plan = plan_memory(&self.reqs, 256);
        let g = self.g;
        let locs: Vec<Option<Loc>> = (0..g.len())
            .map(|node| {
                let view = self.off_of[node];
                match (self.param_of[node], self.req_of[node]) {
                    (Some(off), _) => Some(Loc::Params(off + view)),
                    (None, Some(r)) => Some(Loc::Arena(plan.offsets[r] as u64 + view)),
                    (None, None) => None,
                }
            })
            .collect();
        let loc = |node: usize| -> Result<Loc> {
            locs[node].ok_or_else(|| Error::Unsupported {
                backend: "cuda".into(),
                op: g.node(NodeId(node as u32)).op.name().into(),
                node: NodeId(node as u32),
                msg: "the value has no place in device memory (a lowering bug)".into(),
            })
        };
        let mut p = std::mem::take(&mut self.p);
        p.kernels = std::mem::take(&mut self.sources);
        p.arena_bytes = plan.arena_size as u64;
        p.params_bytes = self.params_bytes;
        p.input_at = self
            .input_req
            .iter()
            .map(|&r| Loc::Arena(plan.offsets[r] as u64))
            .collect();
        p.param_at = self
            .param_place
            .iter()
            .map(|pl| match pl {
                Ok(off) => Loc::Params(*off),
                Err(r) => Loc::Arena(plan.offsets[*r] as u64),
            })
            .collect();
        p.outputs = self
            .g
            .outputs()
            .iter()
            .enumerate()
            .map(|(k, o)| IoSlot {
                name: format!("out{k}"),
                shape: self.g.shape(*o).clone(),
            })
            .collect();
        p.output_at = g
            .outputs()
            .iter()
            .map(|o| loc(o.index()))
            .collect::<Result<_>>()?;
        p.consts = self
            .consts
            .iter()
            .map(|(r, b)| (Loc::Arena(plan.offsets[*r] as u64), b.clone()))
            .collect();
        let fix = |w: Pending| -> Result<Word> {
            Ok(match w {
                Pending::Imm(v) => Word::Imm(v),
                Pending::Value(node, extra) => Word::Addr(match loc(node)? {
                    Loc::Arena(o) => Loc::Arena(o + extra),
                    Loc::Params(o) => Loc::Params(o + extra),
                }),
                Pending::Scratch(r) => Word::Addr(Loc::Arena(plan.offsets[r] as u64)),
            })
        };
        let mut launches = Vec::with_capacity(self.steps.len());
        for s in &self.steps {
            let words = s.words.iter().map(|w| fix(*w)).collect::<Result<_>>()?;
            let gemm = s.gemm.map(|g| g.place(fix)).transpose()?;
            launches.push(Launch {
                kernel: s.kernel,
                grid: s.grid,
                block: s.block,
                node: s.node,
                op: s.op,
                words,
                gemm,
            });
        }
        p.launches = launches;
        Ok(p)
    }
}

/// Blocks of a row kernel: a block a row (256 threads), or eight rows a block (a warp each).
fn row_grid(rows: usize, t: u32) -> [u32; 3] {
    let per = if t == 256 { 1 } else { (BLOCK / 32) as usize };
    [blocks(rows, per), 1, 1]
}
