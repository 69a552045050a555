//! Pattern regions the CPU runs as one step (see `rlx_opt::patterns`):
//!
//! - [`FusionKind::MatMulEpilogue`]: an f32 product whose bias (along its rows) and activation
//!   are applied by the GEMM to each block of C as the block becomes final, while it is still in
//!   cache ([`super::gemm::sgemm_epilogue`]), instead of by a pass of their own over the whole result;
//! - [`FusionKind::ResidualNorm`]: `rms_norm(x + r)` / `layer_norm(x + r)` in f32, each band of
//!   rows summed and then normalized while it is in cache, the sum stored when the graph reads
//!   it.
//!
//! Both compute what the separate kernels compute, in the same order with the same functions,
//! so results are bit-identical to the unfused program (`RLX_FUSE_PATTERNS=0`).

use super::{kernel, par_ranges, Build, Kernel, NodeInfo, Ptr, TRef};
use crate::layout::{for_each_run, Layout};
use rlx_ir::{Activation, BinaryOp, DType, FusedRegion, FusionKind, Graph, NodeId, Op, Result};

/// A product and its epilogue, operands by position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Epilogue<T> {
    /// Left operand of the product.
    pub a: T,
    /// Right operand.
    pub b: T,
    /// A bias added along the rows (`[..., 1, n]` or `[n]`).
    pub bias: Option<T>,
    /// The activation applied last.
    pub act: Option<Activation>,
}

/// A residual add and the norm of its sum, operands by position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResidualNorm<T> {
    /// The two addends, of the sum's shape.
    pub x: T,
    /// The second addend.
    pub r: T,
    /// The norm's gain (`[n]`).
    pub gain: T,
    /// LayerNorm's shift (`[n]`); `None` for RMSNorm.
    pub shift: Option<T>,
    /// The norm's epsilon.
    pub eps: f32,
}

/// A pattern region the CPU has a kernel for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pattern<T> {
    /// See [`Epilogue`].
    Epilogue(Epilogue<T>),
    /// See [`ResidualNorm`].
    ResidualNorm(ResidualNorm<T>),
}

fn all_f32(g: &Graph, ids: &[NodeId]) -> bool {
    ids.iter().all(|&i| g.shape(i).dtype() == DType::F32)
}

/// `bias` is added along the rows of the product `p`: its last axis is `p`'s, the others 1.
fn row_bias(g: &Graph, bias: NodeId, p: NodeId) -> bool {
    let (b, c) = (g.shape(bias).dims(), g.shape(p).dims());
    let one = rlx_ir::Dim::Static(1);
    !b.is_empty() && b.last() == c.last() && b[..b.len() - 1].iter().all(|d| *d == one)
}

/// The product with its epilogue ending at `root` of `g`, operands as nodes of `g`.
fn find_epilogue(g: &Graph, root: NodeId) -> Option<Epilogue<NodeId>> {
    let mut cur = root;
    let mut act = None;
    let mut members = vec![root];
    if let Op::Activation(a) = g.node(cur).op {
        act = Some(a);
        cur = g.node(cur).inputs[0];
        members.push(cur);
    }
    let mut bias = None;
    if let Op::Binary(BinaryOp::Add) = g.node(cur).op {
        let ins = &g.node(cur).inputs;
        let (p, b) = [(ins[0], ins[1]), (ins[1], ins[0])]
            .into_iter()
            .find(|&(p, b)| p != b && matches!(g.node(p).op, Op::MatMul) && row_bias(g, b, p))?;
        bias = Some(b);
        cur = p;
        members.push(cur);
    }
    if !matches!(g.node(cur).op, Op::MatMul) || (act.is_none() && bias.is_none()) {
        return None;
    }
    let (a, b) = (g.node(cur).inputs[0], g.node(cur).inputs[1]);
    let ranks = g.shape(a).rank() >= 2 && g.shape(b).rank() >= 2;
    members.extend([a, b]);
    members.extend(bias);
    (ranks && all_f32(g, &members)).then_some(Epilogue { a, b, bias, act })
}

/// The residual norm ending at `root` of `g`: the norm and the sum it reads.
fn find_residual_norm(g: &Graph, root: NodeId) -> Option<(ResidualNorm<NodeId>, NodeId)> {
    let n = g.node(root);
    let (eps, shift) = match n.op {
        Op::RmsNorm { eps } => (eps, None),
        Op::LayerNorm { eps } => (eps, Some(*n.inputs.get(2)?)),
        _ => return None,
    };
    let (s, gain) = (n.inputs[0], n.inputs[1]);
    let Op::Binary(BinaryOp::Add) = g.node(s).op else {
        return None;
    };
    let (x, r) = (g.node(s).inputs[0], g.node(s).inputs[1]);
    let dims = g.shape(s).dims();
    let width = dims.last()?;
    let same = [x, r].iter().all(|&v| g.shape(v).dims() == dims);
    let vec = |v: NodeId| g.shape(v).dims() == std::slice::from_ref(width);
    let mut ids = vec![root, s, x, r, gain];
    ids.extend(shift);
    let ok = same && vec(gain) && shift.is_none_or(vec) && all_f32(g, &ids);
    ok.then_some((
        ResidualNorm {
            x,
            r,
            gain,
            shift,
            eps,
        },
        s,
    ))
}

/// Whether the CPU runs a region of `kind` ending at node `root` of `g` (before fusion) as one
/// step: what `CpuBackend::fuses` answers for pattern kinds.
pub fn accepts(g: &Graph, root: NodeId, kind: FusionKind) -> bool {
    match kind {
        FusionKind::MatMulEpilogue => find_epilogue(g, root).is_some(),
        FusionKind::ResidualNorm => find_residual_norm(g, root).is_some(),
        FusionKind::Elementwise
        | FusionKind::GatedMlp
        | FusionKind::Attention
        | FusionKind::NormMatMul
        | FusionKind::Optimizer
        | FusionKind::MultiplyReduce => false,
    }
}

/// The pattern of a region, operands as positions among the region's operands, when the CPU
/// has a kernel for it.
pub fn of(r: &FusedRegion) -> Option<Pattern<usize>> {
    let body = &r.body;
    let outs = body.outputs();
    let root = *outs.first()?;
    // Inputs come first in a region's body, in operand order.
    let pos = |v: NodeId| matches!(body.node(v).op, Op::Input { .. }).then_some(v.index());
    match r.kind {
        FusionKind::MatMulEpilogue if outs.len() == 1 => {
            let e = find_epilogue(body, root)?;
            Some(Pattern::Epilogue(Epilogue {
                a: pos(e.a)?,
                b: pos(e.b)?,
                bias: match e.bias {
                    Some(b) => Some(pos(b)?),
                    None => None,
                },
                act: e.act,
            }))
        }
        FusionKind::ResidualNorm if outs.len() <= 2 => {
            let (p, sum) = find_residual_norm(body, root)?;
            if outs.len() == 2 && outs[1] != sum {
                return None;
            }
            Some(Pattern::ResidualNorm(ResidualNorm {
                x: pos(p.x)?,
                r: pos(p.r)?,
                gain: pos(p.gain)?,
                shift: match p.shift {
                    Some(b) => Some(pos(b)?),
                    None => None,
                },
                eps: p.eps,
            }))
        }
        _ => None,
    }
}

/// Lower a pattern region node: result `output` of the region is the step's output, and the
/// step also stores the results `further` (their buffers follow the operands in the kernel's
/// operand list). Results stored nowhere are computed into scratch.
pub fn lower(
    info: &NodeInfo<'_>,
    p: Pattern<usize>,
    output: usize,
    further: &[usize],
) -> Result<(usize, Build)> {
    match p {
        Pattern::Epilogue(e) if output == 0 && further.is_empty() => {
            super::linalg::lower_epilogue(info, e)
        }
        Pattern::Epilogue(_) => Err(info.unsupported("a product's epilogue has one result")),
        Pattern::ResidualNorm(rn) => residual_norm(info, rn, output, further),
    }
}

/// Bytes rounded up to whole cache lines.
fn lines(bytes: usize) -> usize {
    bytes.next_multiple_of(64)
}

fn residual_norm(
    info: &NodeInfo<'_>,
    p: ResidualNorm<usize>,
    output: usize,
    further: &[usize],
) -> Result<(usize, Build)> {
    if output > 1 || further.iter().any(|&k| k != 1) {
        return Err(info.unsupported("a residual norm has two results (the norm, the sum)"));
    }
    let dims = info.dims.clone();
    let bytes = dims.iter().product::<usize>() * 4;
    let width = *dims.last().unwrap_or(&1);
    // Scratch: the norm when this node is the sum alone, the sum when no node reads it, and
    // dense copies of a gain and shift that are not.
    let norm_scratch = output == 1;
    let sum_scratch = output == 0 && further.is_empty();
    let (gs, ss) = (
        info.ins[p.gain].strides()[0],
        p.shift.map(|b| info.ins[b].strides()[0]),
    );
    let copy_gain = gs != 1 && width > 1;
    let copy_shift = ss.is_some_and(|s| s != 1) && width > 1;
    let mut off = 0;
    let mut take = |on: bool, len: usize| {
        let at = on.then_some(off);
        off += if on { lines(len) } else { 0 };
        at
    };
    let norm_at = take(norm_scratch, bytes);
    let sum_at = take(sum_scratch, bytes);
    let gain_at = take(copy_gain, width * 4);
    let shift_at = take(copy_shift, width * 4);
    let n_ops = info.ins.len();
    Ok((
        off,
        Box::new(move |ins, out, s| {
            let dense = Layout::contiguous(&dims);
            let at = |o: usize| TRef {
                // SAFETY: the scratch holds `off` bytes.
                ptr: Ptr(unsafe { s.0.add(o) }),
                layout: dense,
                dtype: DType::F32,
            };
            let norm = norm_at.map_or(out, at);
            let sum = match (output, sum_at) {
                (1, _) => out,
                (_, Some(o)) => at(o),
                _ => ins[n_ops],
            };
            let vec = |o: usize| TRef {
                layout: Layout::contiguous(&[width]),
                ..at(o)
            };
            let gain = (ins[p.gain], gain_at.map(vec));
            let shift = p.shift.map(|b| (ins[b], shift_at.map(vec)));
            residual_norm_kernel(ins[p.x], ins[p.r], gain, shift, sum, norm, p.eps)
        }),
    ))
}

/// A dense f32 vector: the value itself, or `copy` filled from it first when it is strided.
type Vector = (TRef, Option<TRef>);

/// # Safety
/// `v` (and `copy`) are f32 vectors of `n` elements inside their buffers.
unsafe fn dense_vector<'a>(v: Vector, n: usize) -> &'a [f32] {
    let (src, copy) = v;
    let p = src.base::<f32>().add(src.layout.offset);
    match copy {
        None => std::slice::from_raw_parts(p, n),
        Some(c) => {
            let s = src.layout.strides()[0];
            let d = c.base::<f32>().add(c.layout.offset);
            for t in 0..n {
                *d.add(t) = *p.add(t * s);
            }
            std::slice::from_raw_parts(d, n)
        }
    }
}

fn residual_norm_kernel(
    x: TRef,
    r: TRef,
    gain: Vector,
    shift: Option<Vector>,
    sum: TRef,
    norm: TRef,
    eps: f32,
) -> Box<dyn Kernel> {
    kernel(move |pool| {
        let dims = x.layout.dims().to_vec();
        let n = *dims.last().unwrap_or(&1);
        let count = x.layout.numel() / n.max(1);
        if n == 0 || count == 0 {
            return;
        }
        // SAFETY: the vectors have `n` values; copies go to this step's scratch.
        let (gs, bs) = unsafe { (dense_vector(gain, n), shift.map(|b| dense_vector(b, n))) };
        let dense = Layout::contiguous(&dims);
        let both_dense = x.layout.is_contiguous() && r.layout.is_contiguous();
        par_ranges(pool, count, (1 << 14) / n + 1, |rows| {
            let (e0, len) = (rows.start * n, rows.len() * n);
            // SAFETY: the sum and the norm are dense f32 buffers of `count * n` values from
            // their offsets; the addends lie inside theirs (their layouts).
            unsafe {
                let ps = sum.base::<f32>().add(sum.layout.offset);
                let (px, pr) = (x.base::<f32>(), r.base::<f32>());
                if both_dense {
                    let xs = std::slice::from_raw_parts(px.add(x.layout.offset + e0), len);
                    let rs = std::slice::from_raw_parts(pr.add(r.layout.offset + e0), len);
                    let ss = std::slice::from_raw_parts_mut(ps.add(e0), len);
                    // The Binary kernel's f32 addition.
                    for (s, (a, b)) in ss.iter_mut().zip(xs.iter().zip(rs)) {
                        *s = *a + *b;
                    }
                } else {
                    for_each_run(
                        &dims,
                        [&dense, &x.layout, &r.layout],
                        e0..e0 + len,
                        |[o, i, j], k, [so, si, sj]| {
                            for t in 0..k {
                                *ps.add(o + t * so) = *px.add(i + t * si) + *pr.add(j + t * sj);
                            }
                        },
                    );
                }
                let ss = std::slice::from_raw_parts(ps.add(e0), len);
                let ys = std::slice::from_raw_parts_mut(
                    norm.base::<f32>().add(norm.layout.offset + e0),
                    len,
                );
                // The norm kernel's dense-row functions.
                match bs {
                    None => crate::math::rms_norm_rows(ss, gs, ys, n, eps),
                    Some(bs) => crate::math::layer_norm_rows(ss, gs, bs, ys, n, eps),
                }
            }
        })
    })
}

/// Add `bias` (a pointer to element 0 and a stride) along the rows of the block `r0..r1` ×
/// `c0..c1` of C (rows `ldc` apart), then apply `act`: the Binary and Activation kernels'
/// f32 operations, element by element.
///
/// # Safety
/// The block lies inside C; the bias has `c1` elements.
#[inline(always)]
unsafe fn epilogue_block(
    c: *mut f32,
    ldc: usize,
    [r0, r1, c0, c1]: [usize; 4],
    bias: Option<(*const f32, usize)>,
    act: Option<Activation>,
) {
    let len = c1 - c0;
    // Plain loops, every helper inlined: a closure left out of line would be compiled without
    // the caller's vector features (and `mul_add` would become a library call).
    for i in r0..r1 {
        let row = std::slice::from_raw_parts_mut(c.add(i * ldc + c0), len);
        add(row, bias, c0);
        if let Some(a) = act {
            activate(a, row);
        }
    }
}

/// `act` on every value of `row` (the Activation kernel's f32 function).
#[inline(always)]
fn activate(act: Activation, row: &mut [f32]) {
    crate::with_float_fn!(act, f32, f => {
        for x in row.iter_mut() {
            *x = f(*x);
        }
    })
}

/// Add the bias's columns `c0..` to `row`.
///
/// # Safety
/// The bias has `c0 + row.len()` elements.
#[inline(always)]
unsafe fn add(row: &mut [f32], bias: Option<(*const f32, usize)>, c0: usize) {
    match bias {
        Some((b, 1)) => {
            let bs = std::slice::from_raw_parts(b.add(c0), row.len());
            for (x, y) in row.iter_mut().zip(bs) {
                *x += *y;
            }
        }
        Some((b, s)) => {
            for (t, x) in row.iter_mut().enumerate() {
                *x += *b.add((c0 + t) * s);
            }
        }
        None => {}
    }
}

/// [`epilogue_block`] compiled for the widest vector unit the CPU has (as the fused loop is).
///
/// # Safety
/// As [`epilogue_block`].
pub(super) unsafe fn epilogue_best(
    c: *mut f32,
    ldc: usize,
    block: [usize; 4],
    bias: Option<(*const f32, usize)>,
    act: Option<Activation>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v512(
            c: *mut f32,
            ldc: usize,
            block: [usize; 4],
            bias: Option<(*const f32, usize)>,
            act: Option<Activation>,
        ) {
            epilogue_block(c, ldc, block, bias, act)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v256(
            c: *mut f32,
            ldc: usize,
            block: [usize; 4],
            bias: Option<(*const f32, usize)>,
            act: Option<Activation>,
        ) {
            epilogue_block(c, ldc, block, bias, act)
        }
        if crate::isa::avx512() {
            return v512(c, ldc, block, bias, act);
        }
        if crate::isa::avx2() {
            return v256(c, ldc, block, bias, act);
        }
    }
    epilogue_block(c, ldc, block, bias, act)
}

/// The epilogue of one product, as the GEMM's hook wants it.
#[derive(Clone, Copy)]
pub(super) struct EpilogueOps {
    /// The bias operand.
    pub bias: Option<TRef>,
    /// The activation.
    pub act: Option<Activation>,
}

impl EpilogueOps {
    /// The bias as a pointer to element 0 and a stride.
    pub(super) fn bias(&self) -> Option<(*const f32, usize)> {
        self.bias.map(|b| {
            let l = &b.layout;
            // SAFETY: the offset lies inside the bias's buffer.
            let p = unsafe { b.base::<f32>().add(l.offset) } as *const f32;
            (p, l.strides()[l.rank() - 1])
        })
    }
}

/// The hook [`super::gemm::sgemm_epilogue`] calls for a product writing C at `c`, rows `ldc` apart.
pub(super) fn hook(
    c: *mut f32,
    ldc: usize,
    ops: EpilogueOps,
) -> impl Fn(usize, usize, usize, usize) + Sync {
    let (c, bias) = (
        Ptr(c as *mut u8),
        ops.bias().map(|(p, s)| (Ptr(p as *mut u8), s)),
    );
    move |r0, r1, c0, c1| {
        let bias = bias.map(|(p, s)| (p.get() as *const f32, s));
        // SAFETY: the GEMM gives blocks of its C; the bias has a value per column.
        unsafe { epilogue_best(c.get() as *mut f32, ldc, [r0, r1, c0, c1], bias, ops.act) }
    }
}
