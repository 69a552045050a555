//! CPU kernels, one file per op family. Each family lowers a node to either a view (a new
//! [`Layout`] over an operand's buffer, no work at run time) or a compute step whose kernel is
//! built once the memory plan has fixed every buffer's address.

pub mod adam;
mod attention;
mod control;
mod elementwise;
mod fft;
pub mod fused;
pub mod gemm;
mod index;
mod kv;
mod linalg;
mod movement;
mod norm;
pub mod patterns;
mod qint;
pub mod quant;
mod reduce;
pub mod registered;
mod spatial;

use crate::layout::Layout;
use crate::layout::MAX_RANK;
use crate::pool::Pool;
use rlx_ir::{DType, Error, Graph, Node, NodeId, Op, Result};

/// A raw buffer address that kernels may share across threads. The compiled program owns the
/// buffers and never moves them while kernels exist; the memory plan keeps live values disjoint.
#[derive(Clone, Copy, Debug)]
pub struct Ptr(pub *mut u8);
// SAFETY: see the type's documentation: addresses are stable and writes never alias live reads.
unsafe impl Send for Ptr {}
unsafe impl Sync for Ptr {}

impl Ptr {
    /// The address (a method, so closures capture the whole `Ptr`, which is `Sync`).
    #[inline(always)]
    pub fn get(self) -> *mut u8 {
        self.0
    }
}

/// A value as a kernel sees it: buffer, layout (in elements) and dtype.
#[derive(Clone, Copy, Debug)]
pub struct TRef {
    /// Buffer base.
    pub ptr: Ptr,
    /// Strided layout over the buffer.
    pub layout: Layout,
    /// Element type.
    pub dtype: DType,
}

impl TRef {
    /// Typed base pointer.
    #[inline(always)]
    pub fn base<T>(&self) -> *mut T {
        self.ptr.0 as *mut T
    }
}

/// One step of a compiled program.
pub trait Kernel: Send + Sync {
    /// Execute, possibly in parallel on `pool`.
    fn run(&self, pool: &Pool);
}

/// A kernel made of a closure.
pub struct FnKernel<F: Fn(&Pool) + Send + Sync>(pub F);

impl<F: Fn(&Pool) + Send + Sync> Kernel for FnKernel<F> {
    fn run(&self, pool: &Pool) {
        (self.0)(pool)
    }
}

/// Box a closure as a kernel.
pub fn kernel(f: impl Fn(&Pool) + Send + Sync + 'static) -> Box<dyn Kernel> {
    Box::new(FnKernel(f))
}

/// Builds a kernel from the operands, the output and a scratch buffer.
pub type Build = Box<dyn FnOnce(&[TRef], TRef, Ptr) -> Box<dyn Kernel>>;

/// Builds an in-place kernel from the operands and the param it updates.
pub type BuildInPlace = Box<dyn FnOnce(&[TRef], TRef) -> Box<dyn Kernel>>;

/// How a node executes.
pub enum Lowered {
    /// The result is operand `src`'s buffer under `layout`.
    View {
        /// Operand index.
        src: usize,
        /// Layout over that operand's buffer.
        layout: Layout,
    },
    /// A kernel updates operand `src` (a param) in place; the result is that param.
    InPlace {
        /// Operand index.
        src: usize,
        /// Kernel constructor: operands, then the param being updated.
        build: BuildInPlace,
    },
    /// A kernel writes a fresh contiguous buffer.
    Compute {
        /// Scratch bytes the kernel needs during its step.
        scratch: usize,
        /// Kernel constructor.
        build: Build,
    },
}

/// What lowering knows about a node.
pub struct NodeInfo<'a> {
    /// The node.
    pub node: &'a Node,
    /// Its id (for errors).
    pub id: NodeId,
    /// Operand layouts.
    pub ins: Vec<Layout>,
    /// Operand dtypes.
    pub in_dtypes: Vec<DType>,
    /// Result dims.
    pub dims: Vec<usize>,
    /// Threads of the pool the program will run on.
    pub threads: usize,
    /// For a MatMul: where an operand is known to be zero (causal attention), so the GEMM may
    /// skip those depths; [`gemm::Tri::Full`] otherwise.
    pub zeros: gemm::Tri,
    /// For a MatMul: its right operand is a param stored in column panels
    /// ([`gemm::half::HMat::panels`], the plan's `panel_params`).
    pub b_panels: bool,
    /// Per operand, its bytes when it is a constant (dense), which a kernel may prepare at
    /// lowering (the int8 products pack their weights once).
    pub consts: Vec<Option<&'a [u8]>>,
    /// What the program's kernels share (one per program).
    pub shared: &'a Shared,
    /// The program's lowering plan (control flow finds its bodies' plans there).
    pub plan: &'a rlx_opt::LoweringPlan,
}

/// What several kernels of one program share: the rotary tables of `Rope` nodes rotating by the
/// same positions with the same base and width (every layer of an LLM rotates its queries and
/// keys by one table a step; it is computed by the first and read by the others).
#[derive(Default)]
pub struct Shared {
    rope: std::cell::RefCell<Vec<(attention::RopeKey, std::sync::Arc<attention::RopeTable>)>>,
}

impl Shared {
    /// The table of rotations keyed `key`, made on first ask.
    pub(crate) fn rope(&self, key: attention::RopeKey) -> std::sync::Arc<attention::RopeTable> {
        let mut all = self.rope.borrow_mut();
        if let Some((_, t)) = all.iter().find(|(k, _)| *k == key) {
            return t.clone();
        }
        let t = std::sync::Arc::new(attention::RopeTable::default());
        all.push((key, t.clone()));
        t
    }
}

impl NodeInfo<'_> {
    /// A "not supported" error for this node.
    pub fn unsupported(&self, msg: impl Into<String>) -> Error {
        Error::Unsupported {
            backend: "cpu".into(),
            op: self.node.op.name().into(),
            node: self.id,
            msg: msg.into(),
        }
    }

    /// Result dtype.
    pub fn dtype(&self) -> DType {
        self.node.shape.dtype()
    }
}

/// A compute step with no scratch.
pub fn compute(build: impl FnOnce(&[TRef], TRef) -> Box<dyn Kernel> + 'static) -> Lowered {
    Lowered::Compute {
        scratch: 0,
        build: Box::new(move |ins, out, _| build(ins, out)),
    }
}

/// Whether the CPU runs `op` on complex (c64) operands or results itself: the complex
/// primitives and the Fourier transforms (every other op reaches it as its complex form).
pub fn takes_complex(op: &Op) -> bool {
    fft::takes_complex(op)
}

/// Whether the CPU backend runs node `id` of `g` natively: its op kind has a kernel here and
/// its dtypes and shapes are ones the kernel takes (see [`refusal`]).
pub fn supports(g: &Graph, id: NodeId) -> bool {
    refusal(g, id).is_none()
}

/// Why the CPU backend does not run node `id` of `g` natively (`None`: it does), asked before
/// lowering, so the compiler decomposes the node or refuses it with this reason instead of the
/// lowering failing later: an op kind without a kernel, a symbolic or complex shape, a rank over
/// [`MAX_RANK`], or a dtype the op's kernel does not take.
pub fn refusal(g: &Graph, id: NodeId) -> Option<String> {
    let n = g.node(id);
    if !supports_op(&n.op) {
        return Some(format!("{} has no CPU kernel", n.op.name()));
    }
    for s in n.inputs.iter().map(|&i| g.shape(i)).chain([&n.shape]) {
        if !s.is_static() {
            return Some(format!(
                "shape {s} has symbolic dimensions; bind them before compiling"
            ));
        }
        if s.rank() > MAX_RANK {
            return Some(format!("shape {s}: the CPU handles rank <= {MAX_RANK}"));
        }
        if s.dtype() == DType::C64 && !n.op.is_leaf() && !takes_complex(&n.op) {
            return Some(format!(
                "shape {s}: the CPU runs complex values through complex, real, imag and fft only"
            ));
        }
    }
    let dt = n.shape.dtype();
    let operand = |i: usize| n.inputs.get(i).map(|&x| g.shape(x).dtype());
    let float = |d: DType| d.is_float();
    let why = match &n.op {
        Op::MatMul if dt == DType::Bool => "a product of bools",
        Op::TopK { .. } if operand(0) == Some(DType::Bool) => "top-k of bools",
        Op::Activation(a) if !float(dt) && !a.allows_int() => "this activation on integers",
        Op::Softmax { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Attention { .. }
        | Op::Rope { .. }
        | Op::Conv(_)
        | Op::Pool(_)
            if !float(dt) =>
        {
            "a result that is not a float"
        }
        Op::DequantMatMul { .. } if operand(0) != Some(DType::F32) => {
            "activations that are not f32"
        }
        Op::DequantMatMul { scheme } if !quant::runs(*scheme) => "these weights",
        Op::CachedAttention { .. } | Op::PagedAttention { .. }
            if !matches!(operand(1), Some(DType::F16 | DType::F32))
                || !matches!(operand(2), Some(DType::F16 | DType::F32)) =>
        {
            "caches that are not f16 or f32"
        }
        Op::CacheWrite | Op::CachedAttention { .. } | Op::PagedAttention { .. } if !float(dt) => {
            "a cache that is not a float"
        }
        _ => return None,
    };
    Some(format!(
        "{} of {} ({}) on the CPU: {why}",
        n.op.name(),
        n.shape,
        n.inputs
            .iter()
            .map(|&i| g.shape(i).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Whether the CPU backend has a native kernel for `op`'s kind: a positive list, so a new op is
/// decomposed (or reported) until it gets a kernel here.
fn supports_op(op: &Op) -> bool {
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => true,
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Cast { .. } => true,
        Op::MatMul | Op::Reduce { .. } | Op::Cumsum { .. } | Op::TopK { .. } => true,
        Op::Softmax { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Attention { .. }
        | Op::Rope { .. } => true,
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. } => true,
        Op::Gather { .. } | Op::ScatterAdd { .. } | Op::Conv(_) | Op::Pool(_) => true,
        Op::DequantizeRows { .. } | Op::CacheWrite | Op::CachedAttention { .. } => true,
        Op::PagedAttention { .. } => true,
        Op::DequantMatMul { scheme } => scheme.is_gguf(),
        // Elementwise and multiply-reduce regions the group loop runs, products with their
        // epilogue and residual norms (`patterns`); the rest are inlined.
        Op::Fused(r) => fused::region_program(r).is_some() || patterns::of(r).is_some(),
        // Control flow loops and branches for real: `if` runs only its taken branch, `while`
        // and `scan` without unrolling; a registered op with a kernel given by its crate
        // (`registered::register_kernel`). Other ops defined by an `OpDef` are decomposed (one
        // of the IR's that needs a native kernel gets a case in `control::Flow::of`'s style:
        // by its type).
        Op::Defined(d) => control::Flow::of(d).is_some() || registered::of(d).is_some(),
        // Decomposed into primitives before lowering.
        Op::DotGeneral(_) | Op::Custom(_) => false,
    }
}

/// Lower one non-leaf node.
pub fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    match &info.node.op {
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Cast { .. } => {
            elementwise::lower(info)
        }
        Op::MatMul => linalg::lower(info),
        Op::Reduce { .. } | Op::Cumsum { .. } | Op::TopK { .. } => reduce::lower(info),
        Op::Softmax { .. } | Op::LayerNorm { .. } | Op::RmsNorm { .. } => norm::lower(info),
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. } => movement::lower(info),
        Op::Gather { .. } | Op::ScatterAdd { .. } => index::lower(info),
        Op::Attention { .. } | Op::Rope { .. } => attention::lower(info),
        Op::Conv(_) | Op::Pool(_) => spatial::lower(info),
        Op::DequantMatMul { .. } | Op::DequantizeRows { .. } => quant::lower(info),
        Op::CacheWrite | Op::CachedAttention { .. } | Op::PagedAttention { .. } => kv::lower(info),
        Op::Defined(d) => match (control::Flow::of(d), registered::of(d)) {
            (Some(flow), _) => control::lower(info, flow),
            (None, Some(f)) => {
                let f = qint::prepared(info, d).unwrap_or(f);
                registered::lower(info, d, f)
            }
            (None, None) => Err(info.unsupported(format!("{} has no CPU kernel", d.name()))),
        },
        // Leaves and fused regions are lowered by the program itself; the rest are decomposed
        // before lowering (see `supports`).
        op @ (Op::Input { .. }
        | Op::Param { .. }
        | Op::Constant { .. }
        | Op::Fused(_)
        | Op::DotGeneral(_)
        | Op::Custom(_)) => Err(info.unsupported(format!("{} has no CPU kernel", op.name()))),
    }
}

/// Split `0..n` into contiguous ranges of at least `min_chunk` elements, one task each, and run
/// them on the pool (inline when there is only one).
pub fn par_ranges(
    pool: &Pool,
    n: usize,
    min_chunk: usize,
    f: impl Fn(std::ops::Range<usize>) + Sync,
) {
    let tasks = (n / min_chunk.max(1)).clamp(1, pool.threads() * 4);
    if tasks <= 1 {
        f(0..n);
        return;
    }
    let per = n.div_ceil(tasks);
    pool.run(tasks, &|t, _| {
        let s = (t * per).min(n);
        let e = ((t + 1) * per).min(n);
        if s < e {
            f(s..e);
        }
    });
}

/// Copy a strided value into a dense row-major byte buffer (`dst` holds exactly its bytes).
pub fn materialize(src: &TRef, dst: &mut [u8]) {
    let w = src.dtype.size_bytes();
    let s = src.ptr.0 as *const u8;
    if src.layout.is_contiguous() {
        // SAFETY: a contiguous layout covers `dst.len()` bytes from its offset.
        unsafe {
            std::ptr::copy_nonoverlapping(s.add(src.layout.offset * w), dst.as_mut_ptr(), dst.len())
        };
        return;
    }
    let dense = Layout::contiguous(src.layout.dims());
    let n = src.layout.numel();
    crate::layout::for_each_run(
        src.layout.dims(),
        [&dense, &src.layout],
        0..n,
        |[o, i], len, [so, si]| {
            // SAFETY: the layout lies within the value's buffer; `dst` has numel * w bytes.
            unsafe {
                if so == 1 && si == 1 {
                    std::ptr::copy_nonoverlapping(
                        s.add(i * w),
                        dst.as_mut_ptr().add(o * w),
                        len * w,
                    );
                } else {
                    for k in 0..len {
                        std::ptr::copy_nonoverlapping(
                            s.add((i + k * si) * w),
                            dst.as_mut_ptr().add((o + k * so) * w),
                            w,
                        );
                    }
                }
            }
        },
    );
}
