//! Fused elementwise groups: a DAG of f32 Binary / Activation nodes with the same dims, whose
//! intermediate results no step outside the group reads, runs as one loop over blocks of the
//! result. Intermediates live in per-thread scratch blocks (reused once their last reader has
//! run) instead of making a round trip through memory each; members that are graph outputs are
//! also stored, at the end of each block, as extra results. Operands that are already dense are
//! read in place, broadcast scalars stay in a register, operands contiguous over a multiple of
//! the block are read in place too, and ones repeating with a period that divides the block are
//! gathered once per task rather than per block.
//!
//! A group may also end in a sum (or mean) over trailing axes of its result: the blocks then
//! hold whole rows, and each row is summed as it is computed, so the elementwise result never
//! goes to memory (the `x * y` that a softmax or norm backward pass sums, say).
//!
//! Every element goes through the same f32 operations, in the same order, as the separate
//! kernels would apply (rows summed as the Reduce kernel sums them), so fused and unfused
//! programs give bit-identical results.

use super::adam::AdamGroup;
use super::{kernel, Kernel, Ptr, TRef};
use crate::elem::Elem;
use crate::layout::{for_each_run, Layout};
use crate::pool::Pool;
use rlx_ir::{Activation, BinaryOp, FusedRegion, FusionKind, Graph, NodeId, Op};

/// Elements computed per block (per gathered operand and temporary). At 512 the slots of a
/// long group (AdamW's 15 instructions) stay in L1; 1024 measured 5% slower on the training MLP.
const BLOCK: usize = 512;

/// Longest row a group ending in a row sum handles (a block holds at least one whole row).
pub const MAX_ROW: usize = 8192;

/// Elements per block of a group: `BLOCK` (512), or for a group ending in a sum over rows of `row`
/// elements, the most whole rows that fit in it (one row when rows are longer).
pub fn block_len(row: Option<usize>) -> usize {
    match row {
        Some(r) if r >= BLOCK => r,
        Some(r) => BLOCK / r.max(1) * r.max(1),
        None => BLOCK,
    }
}

/// A group's final row reduction: the result, seen as rows of `row` elements, is summed per
/// row in f64 (divided by `row` when `mean`) and each row's f32 value stored.
#[derive(Clone, Copy, Debug)]
pub struct RowSum {
    /// Elements per row (the product of the reduced trailing axes).
    pub row: usize,
    /// Mean instead of sum.
    pub mean: bool,
}

/// Where an instruction reads an operand.
#[derive(Clone, Copy, Debug)]
pub enum Src {
    /// External operand `k` of the group.
    Ext(usize),
    /// Result of instruction `j`.
    Tmp(usize),
}

/// One step of the group, in evaluation order; the last one is the result.
#[derive(Clone, Debug)]
pub enum Instr {
    /// Elementwise binary op.
    Binary(BinaryOp, Src, Src),
    /// Elementwise function.
    Unary(Activation, Src),
    /// A cast to bf16: the value rounded as the Cast kernel rounds it, kept (exactly) as f32.
    /// A cast back to f32 is the same value, so it needs no instruction.
    RoundBf16(Src),
}

/// Whether a node can join a fused group: an f32 Binary / Activation node, or a cast between
/// f32 and bf16 (a bf16 operand is widened as it is read, a bf16 result rounded and stored as
/// bf16: the casts around a bf16 product then cost no pass of their own).
pub fn fusible(g: &Graph, id: NodeId) -> bool {
    use rlx_ir::DType::{BF16, F32};
    let n = g.node(id);
    let ins: Vec<_> = n.inputs.iter().map(|i| g.shape(*i).dtype()).collect();
    match (&n.op, n.shape.dtype(), ins.as_slice()) {
        (Op::Binary(_) | Op::Activation(_), F32, ins) => ins.iter().all(|&d| d == F32),
        (Op::Cast { to: BF16 }, BF16, [F32]) | (Op::Cast { to: F32 }, F32, [BF16]) => true,
        _ => false,
    }
}

/// The row reduction a group may end in: an f32 Sum or Mean over trailing axes (not all of
/// them, and rows of at most [`MAX_ROW`] elements), which the Reduce kernel computes row by
/// row, each a contiguous f64 sum — so a fused group can sum its rows the same way.
pub fn row_sum(g: &Graph, id: NodeId) -> Option<RowSum> {
    let n = g.node(id);
    let Op::Reduce { kind, axes, .. } = &n.op else {
        return None;
    };
    let mean = match kind {
        rlx_ir::ReduceKind::Sum => false,
        rlx_ir::ReduceKind::Mean => true,
        _ => return None,
    };
    let x = g.shape(*n.inputs.first()?);
    let dims = x.static_dims()?;
    let r = dims.len();
    let trailing = !axes.is_empty()
        && axes[0] > 0
        && axes
            .iter()
            .enumerate()
            .all(|(i, &a)| a == r - axes.len() + i);
    let row: usize = axes.iter().map(|&a| dims[a]).product();
    let ok = trailing
        && x.dtype() == rlx_ir::DType::F32
        && n.shape.dtype() == rlx_ir::DType::F32
        && !dims.contains(&0);
    (ok && row <= MAX_ROW).then_some(RowSum { row, mean })
}

/// A fused region as the group loop runs it.
#[derive(Clone, Debug)]
pub struct RegionProgram {
    /// The instructions; the last one is the elementwise root. External operand `k` is the
    /// region's operand `k`.
    pub code: Vec<Instr>,
    /// The row sum ending a multiply-reduce region.
    pub rows: Option<RowSum>,
    /// For each body output, the instruction computing it (`None`: the row sum).
    pub outputs: Vec<Option<usize>>,
    /// The dims the instructions compute over.
    pub dims: Vec<usize>,
}

/// The program of region `r` when the group loop runs it: an elementwise region of f32
/// Binary / Activation nodes (see [`fusible`]), or a multiply-reduce region of those ending in
/// a row sum (see [`row_sum`]). `None` for any other region (the compiler then inlines it).
pub fn region_program(r: &FusedRegion) -> Option<RegionProgram> {
    let b = &*r.body;
    let mut src: Vec<Option<Src>> = vec![None; b.len()];
    let mut code = Vec::new();
    let mut rows = None;
    let mut n_ext = 0;
    let ids: Vec<NodeId> = b.ids().collect();
    for (pos, &id) in ids.iter().enumerate() {
        let n = b.node(id);
        let arg = |k: usize| src[n.inputs[k].index()];
        src[id.index()] = match &n.op {
            Op::Input { .. } => {
                n_ext += 1;
                Some(Src::Ext(n_ext - 1))
            }
            Op::Reduce { .. }
                if r.kind == FusionKind::MultiplyReduce
                    && pos + 1 == ids.len()
                    && !code.is_empty() =>
            {
                rows = Some(row_sum(b, id)?);
                // The reduced value must be the last instruction's.
                matches!(arg(0)?, Src::Tmp(j) if j + 1 == code.len()).then_some(())?;
                None
            }
            Op::Binary(op) if fusible(b, id) => {
                code.push(Instr::Binary(*op, arg(0)?, arg(1)?));
                Some(Src::Tmp(code.len() - 1))
            }
            Op::Activation(a) if fusible(b, id) => {
                code.push(Instr::Unary(*a, arg(0)?));
                Some(Src::Tmp(code.len() - 1))
            }
            Op::Cast { to } if fusible(b, id) => {
                let x = arg(0)?;
                // A widened value is the value itself, unless the region stores it (then an
                // instruction computes it, so that every result is an instruction's and the
                // root the last one: rounding a bf16 value leaves it as it is).
                let stored = b.outputs().contains(&id);
                if *to == rlx_ir::DType::F32 && !stored {
                    Some(x)
                } else {
                    code.push(Instr::RoundBf16(x));
                    Some(Src::Tmp(code.len() - 1))
                }
            }
            _ => return None,
        };
    }
    let kind_ok = match r.kind {
        FusionKind::Elementwise | FusionKind::Optimizer => rows.is_none(),
        FusionKind::MultiplyReduce => rows.is_some() && b.outputs().len() == 1,
        _ => false,
    };
    if !kind_ok || code.is_empty() {
        return None;
    }
    let outputs: Vec<Option<usize>> = b
        .outputs()
        .iter()
        .map(|o| match src[o.index()] {
            Some(Src::Tmp(j)) => Some(Some(j)),
            None if rows.is_some() => Some(None),
            _ => None,
        })
        .collect::<Option<_>>()?;
    // Output 0 is the root: the last instruction (or the row sum of it).
    (outputs[0].is_none_or(|j| j + 1 == code.len())).then_some(())?;
    let root = if rows.is_some() {
        b.node(*ids.last()?).inputs[0]
    } else {
        b.outputs()[0]
    };
    let dims = b.shape(root).static_dims()?;
    Some(RegionProgram {
        code,
        rows,
        outputs,
        dims,
    })
}

/// How an external operand is read for a block.
#[derive(Clone, Copy, Debug)]
enum ExtKind {
    /// Dense in the result's order: read in place.
    Dense,
    /// One value broadcast to every element.
    Scalar,
    /// Contiguous over trailing axes spanning a multiple of the block (a `[64, 64]` mask
    /// broadcast over batch and heads, say): each block lies in one contiguous run, read in
    /// place at an offset found per block. Outer axes from `from` on are the contiguous run.
    Window { span: usize, from: usize },
    /// Broadcast over every outer axis, and contiguous over trailing axes whose span divides
    /// the block (a `[128]` norm weight broadcast over rows): every block sees the same values,
    /// copied into gather slot `g` once per task.
    Periodic(usize),
    /// Strided or partly broadcast: copied into gather slot `g` per block.
    Gather(usize),
}

/// Elements of the longest run of trailing axes of `l` (broadcast to `dims`) that is
/// contiguous, and the first axis of that run.
fn trailing_run(l: &Layout, dims: &[usize]) -> (usize, usize) {
    let (mut span, mut ax) = (1, dims.len());
    while ax > 0 && (l.strides()[ax - 1] == span || dims[ax - 1] == 1) {
        span *= dims[ax - 1];
        ax -= 1;
    }
    (span, ax)
}

/// A resolved operand location.
#[derive(Clone, Copy, Debug)]
enum Loc {
    Ext(usize),
    Slot(usize),
}

/// A resolved instruction: operands and the scratch slot written (`None`: the output).
#[derive(Clone, Copy, Debug)]
enum Step {
    Binary(BinaryOp, Loc, Loc, Option<usize>),
    Unary(Activation, Loc, Option<usize>),
    RoundBf16(Loc, Option<usize>),
}

/// How external operands are read and how instructions map to scratch slots.
struct Plan {
    kinds: Vec<ExtKind>,
    layouts: Vec<Layout>,
    steps: Vec<Step>,
    gathers: usize,
    slots: usize,
    /// When the output aliases an operand (a param updated in place): the slot the result is
    /// computed into before it is copied out, so no loop writes memory it is still reading.
    root_slot: Option<usize>,
    /// Extra results: (slot, index into the extra outputs), stored once the block is done.
    extra: Vec<(usize, usize)>,
    /// Elements per block.
    block: usize,
    /// The final row reduction, if the group ends in one (the result is then in `root_slot`).
    rows: Option<RowSum>,
    /// The result is stored as bf16 (it is then in `root_slot`).
    out_bf16: bool,
    /// Which extra results are stored as bf16.
    extra_bf16: Vec<bool>,
}

fn plan(
    code: &[Instr],
    ins: &[TRef],
    dims: &[usize],
    out: &TRef,
    extra: &[usize],
    rows: Option<RowSum>,
) -> Plan {
    let dense = Layout::contiguous(dims);
    let layouts: Vec<Layout> = ins.iter().map(|t| t.layout.broadcast_to(dims)).collect();
    let block = block_len(rows.map(|r| r.row));
    let mut gathers = 0;
    let kinds = layouts
        .iter()
        .zip(ins)
        .map(|(l, t)| {
            let (span, from) = trailing_run(l, dims);
            if t.dtype == rlx_ir::DType::BF16 {
                // Widened into a gather slot as it is read.
                gathers += 1;
                ExtKind::Gather(gathers - 1)
            } else if l.strides().iter().all(|&s| s == 0) {
                ExtKind::Scalar
            } else if l.strides() == dense.strides() {
                ExtKind::Dense
            } else if span.is_multiple_of(block) {
                ExtKind::Window { span, from }
            } else if block.is_multiple_of(span) && l.strides()[..from].iter().all(|&s| s == 0) {
                gathers += 1;
                ExtKind::Periodic(gathers - 1)
            } else {
                gathers += 1;
                ExtKind::Gather(gathers - 1)
            }
        })
        .collect();
    // Last reader of each instruction's result.
    let mut last = vec![0usize; code.len()];
    for (j, ins_j) in code.iter().enumerate() {
        let srcs = match ins_j {
            Instr::Binary(_, a, b) => vec![*a, *b],
            Instr::Unary(_, a) | Instr::RoundBf16(a) => vec![*a],
        };
        for s in srcs {
            if let Src::Tmp(i) = s {
                last[i] = j;
            }
        }
    }
    // Extra results stay in their slots until the end of the block.
    for &j in extra {
        last[j] = code.len();
    }
    let mut slot_of = vec![usize::MAX; code.len()];
    let mut free: Vec<usize> = Vec::new();
    let mut slots = 0;
    let mut steps = Vec::with_capacity(code.len());
    for (j, ins_j) in code.iter().enumerate() {
        let loc = |s: Src| match s {
            Src::Ext(k) => Loc::Ext(k),
            Src::Tmp(i) => Loc::Slot(slot_of[i]),
        };
        let ops = match ins_j {
            Instr::Binary(_, a, b) => [loc(*a), loc(*b)],
            Instr::Unary(_, a) | Instr::RoundBf16(a) => [loc(*a), loc(*a)],
        };
        // A result that is summed into rows, stored as bf16, or whose output aliases an
        // operand, goes to a slot.
        let aliased = j + 1 == code.len()
            && (rows.is_some()
                || out.dtype == rlx_ir::DType::BF16
                || ins.iter().any(|t| std::ptr::eq(t.ptr.0, out.ptr.0)));
        let dst = if j + 1 == code.len() && !aliased {
            None
        } else {
            let s = free.pop().unwrap_or_else(|| {
                slots += 1;
                slots - 1
            });
            slot_of[j] = s;
            Some(s)
        };
        steps.push(match ins_j {
            Instr::Binary(op, _, _) => Step::Binary(*op, ops[0], ops[1], dst),
            Instr::Unary(act, _) => Step::Unary(*act, ops[0], dst),
            Instr::RoundBf16(_) => Step::RoundBf16(ops[0], dst),
        });
        // Results whose last reader was this instruction free their slots (after `dst` was
        // taken, so an instruction never writes a slot it reads).
        for (i, &l) in last.iter().enumerate().take(j) {
            if l == j && slot_of[i] != usize::MAX {
                free.push(slot_of[i]);
            }
        }
    }
    let root_slot = match steps.last() {
        Some(Step::Binary(.., d) | Step::Unary(.., d) | Step::RoundBf16(.., d)) => *d,
        None => None,
    };
    let extra = extra
        .iter()
        .enumerate()
        .map(|(k, &j)| (slot_of[j], k))
        .collect();
    Plan {
        kinds,
        layouts,
        steps,
        gathers,
        slots,
        root_slot,
        extra,
        block,
        rows,
        out_bf16: out.dtype == rlx_ir::DType::BF16,
        extra_bf16: Vec::new(),
    }
}

/// Scratch bytes a group needs for `threads` threads (an upper bound: one block of `block`
/// elements, see [`block_len`], per external operand and per instruction).
pub fn scratch_bytes(n_ext: usize, n_instr: usize, threads: usize, block: usize) -> usize {
    threads * (n_ext + n_instr) * block * 4
}

/// An operand of one block: a run of values or one broadcast value.
#[derive(Clone, Copy)]
enum V<'a> {
    A(&'a [f32]),
    S(f32),
}

// Plain `for` loops, not `for_each`: an iterator's `fold` may stay out of line, and then it is
// compiled without the caller's vector features (and `mul_add` becomes a library call).
#[inline(always)]
fn zip2(a: V, b: V, o: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    match (a, b) {
        (V::A(x), V::A(y)) => {
            for (o, (x, y)) in o.iter_mut().zip(x.iter().zip(y)) {
                *o = f(*x, *y);
            }
        }
        (V::A(x), V::S(y)) => {
            for (o, x) in o.iter_mut().zip(x) {
                *o = f(*x, y);
            }
        }
        (V::S(x), V::A(y)) => {
            for (o, y) in o.iter_mut().zip(y) {
                *o = f(x, *y);
            }
        }
        (V::S(x), V::S(y)) => o.fill(f(x, y)),
    }
}

#[inline(always)]
fn binary(op: BinaryOp, a: V, b: V, o: &mut [f32]) {
    // The same scalar operations as the separate kernels (`Elem` / `FloatElem` on f32).
    match op {
        BinaryOp::Add => zip2(a, b, o, |x, y| x + y),
        BinaryOp::Sub => zip2(a, b, o, |x, y| x - y),
        BinaryOp::Mul => zip2(a, b, o, |x, y| x * y),
        BinaryOp::Div => zip2(a, b, o, |x, y| x / y),
        BinaryOp::Max => zip2(a, b, o, |x, y| x.max_of(y)),
        BinaryOp::Min => zip2(a, b, o, |x, y| x.min_of(y)),
        BinaryOp::Pow => zip2(a, b, o, |x, y| x.powf(y)),
    }
}

#[inline(always)]
fn unary(act: Activation, x: V, o: &mut [f32]) {
    crate::with_float_fn!(act, f32, f => match x {
        V::A(x) => {
            for (o, x) in o.iter_mut().zip(x) {
                *o = f(*x);
            }
        }
        V::S(x) => o.fill(f(x)),
    })
}

/// Round each value to bf16 as the Cast kernel does (nearest even, NaN kept quiet), keeping it
/// as f32 (exactly).
#[inline(always)]
fn round_bf16(x: V, o: &mut [f32]) {
    let r = |v: f32| f32::from_bits((super::elementwise::bf16_bits(v) as u32) << 16);
    match x {
        V::A(x) => {
            for (o, x) in o.iter_mut().zip(x) {
                *o = r(*x);
            }
        }
        V::S(x) => o.fill(r(x)),
    }
}

/// Store `len` values already rounded to bf16 (see [`round_bf16`]) at element `s` of `dst`.
///
/// # Safety
/// `src` holds `len` floats; `dst` has room for elements `s..s + len`.
#[inline(always)]
unsafe fn store_bf16(src: *const f32, dst: *mut u16, s: usize, len: usize) {
    let (src, dst) = (
        std::slice::from_raw_parts(src, len),
        std::slice::from_raw_parts_mut(dst.add(s), len),
    );
    for (d, v) in dst.iter_mut().zip(src) {
        *d = (v.to_bits() >> 16) as u16;
    }
}

/// The address of a dense result's first element (its element type's size times its offset).
///
/// # Safety
/// The offset lies inside the result's buffer.
unsafe fn dense_from_offset(t: &TRef) -> Ptr {
    let p = if t.dtype == rlx_ir::DType::BF16 {
        t.base::<u16>().add(t.layout.offset) as *mut u8
    } else {
        t.base::<f32>().add(t.layout.offset) as *mut u8
    };
    Ptr(p)
}

/// Everything one task needs to evaluate its blocks.
struct Ctx<'a> {
    plan: &'a Plan,
    ins: &'a [TRef],
    dims: &'a [usize],
    out: *mut f32,
    /// Extra results (dense, from their offsets).
    extra: &'a [Ptr],
    /// This thread's scratch: gather slots, then temporaries.
    scratch: *mut f32,
    n: usize,
}

/// Evaluate blocks `blocks` of the group.
///
/// # Safety
/// The context's pointers are valid: operands inside their buffers, `out` dense with `n`
/// elements (one per row when the group sums rows), `scratch` holding `(gathers + slots) *
/// block` floats owned by this thread.
#[inline(always)]
unsafe fn eval(c: &Ctx, blocks: std::ops::Range<usize>) {
    let p = c.plan;
    let block = p.block;
    let dense = Layout::contiguous(c.dims);
    let tmp = c.scratch.add(p.gathers * block);
    let first = blocks.start;
    // Offsets of the window operands' current blocks: on the stack for up to 16 operands (no
    // allocation per run), on the heap beyond.
    let mut on_stack = [0usize; 16];
    let mut on_heap = Vec::new();
    let window: &mut [usize] = if p.kinds.len() <= on_stack.len() {
        &mut on_stack[..p.kinds.len()]
    } else {
        on_heap.resize(p.kinds.len(), 0);
        &mut on_heap
    };
    for blk in blocks {
        let s = blk * block;
        let len = block.min(c.n - s);
        for (k, kind) in p.kinds.iter().enumerate() {
            // A periodic operand's slot holds the same values for every block (the first block
            // of a task is its longest).
            let gi = match *kind {
                ExtKind::Gather(gi) => gi,
                ExtKind::Periodic(gi) if blk == first => gi,
                ExtKind::Window { span, from } => {
                    // The offset of element `s`: its run's outer index, then `s % span`.
                    let l = &p.layouts[k];
                    let mut q = s / span;
                    let mut off = l.offset + s % span;
                    for ax in (0..from).rev() {
                        off += q % c.dims[ax] * l.strides()[ax];
                        q /= c.dims[ax];
                    }
                    window[k] = off;
                    continue;
                }
                _ => continue,
            };
            let dst = std::slice::from_raw_parts_mut(c.scratch.add(gi * block), len);
            if c.ins[k].dtype == rlx_ir::DType::BF16 {
                let src = c.ins[k].base::<u16>() as *const u16;
                let widen = |b: u16| f32::from_bits((b as u32) << 16);
                for_each_run(
                    c.dims,
                    [&dense, &p.layouts[k]],
                    s..s + len,
                    |[o, i], m, [so, si]| {
                        let d = &mut dst[o - s..];
                        if so == 1 && si == 1 {
                            let from = std::slice::from_raw_parts(src.add(i), m);
                            for (x, &b) in d[..m].iter_mut().zip(from) {
                                *x = widen(b);
                            }
                        } else {
                            for q in 0..m {
                                d[q * so] = widen(*src.add(i + q * si));
                            }
                        }
                    },
                );
                continue;
            }
            let src = c.ins[k].base::<f32>() as *const f32;
            for_each_run(
                c.dims,
                [&dense, &p.layouts[k]],
                s..s + len,
                |[o, i], m, [so, si]| {
                    let d = &mut dst[o - s..];
                    if so == 1 && si == 1 {
                        d[..m].copy_from_slice(std::slice::from_raw_parts(src.add(i), m));
                    } else if so == 1 && si == 0 {
                        d[..m].fill(*src.add(i));
                    } else {
                        for q in 0..m {
                            d[q * so] = *src.add(i + q * si);
                        }
                    }
                },
            );
        }
        let view = |l: Loc| -> V {
            match l {
                Loc::Slot(t) => V::A(std::slice::from_raw_parts(tmp.add(t * block), len)),
                Loc::Ext(k) => match p.kinds[k] {
                    // Read when the step runs: the operand's buffer changes between runs.
                    ExtKind::Scalar => {
                        V::S(*(c.ins[k].base::<f32>() as *const f32).add(p.layouts[k].offset))
                    }
                    ExtKind::Dense => V::A(std::slice::from_raw_parts(
                        (c.ins[k].base::<f32>() as *const f32).add(p.layouts[k].offset + s),
                        len,
                    )),
                    ExtKind::Gather(gi) | ExtKind::Periodic(gi) => {
                        V::A(std::slice::from_raw_parts(c.scratch.add(gi * block), len))
                    }
                    ExtKind::Window { .. } => V::A(std::slice::from_raw_parts(
                        (c.ins[k].base::<f32>() as *const f32).add(window[k]),
                        len,
                    )),
                },
            }
        };
        let target = |d: Option<usize>| -> &mut [f32] {
            match d {
                Some(t) => std::slice::from_raw_parts_mut(tmp.add(t * block), len),
                None => std::slice::from_raw_parts_mut(c.out.add(s), len),
            }
        };
        for st in &p.steps {
            match *st {
                Step::Binary(op, a, b, d) => binary(op, view(a), view(b), target(d)),
                Step::Unary(act, a, d) => unary(act, view(a), target(d)),
                Step::RoundBf16(a, d) => round_bf16(view(a), target(d)),
            }
        }
        // Every operand of this block has been read: results may overwrite operands now.
        match (p.root_slot, p.rows) {
            (Some(t), Some(RowSum { row, mean })) => {
                // As the Reduce kernel sums a contiguous row: f64 lanes from 0, then rounded.
                let res = std::slice::from_raw_parts(tmp.add(t * block), len);
                for (r, x) in res.chunks_exact(row).enumerate() {
                    let mut sum = 0f64;
                    sum += crate::math::sum_f64(x);
                    if mean {
                        sum /= row as f64;
                    }
                    *c.out.add(s / row + r) = sum as f32;
                }
            }
            (Some(t), None) if p.out_bf16 => {
                store_bf16(tmp.add(t * block), c.out as *mut u16, s, len)
            }
            (Some(t), None) => std::ptr::copy_nonoverlapping(tmp.add(t * block), c.out.add(s), len),
            (None, _) => {}
        }
        for &(t, k) in &p.extra {
            if p.extra_bf16[k] {
                store_bf16(tmp.add(t * block), c.extra[k].0 as *mut u16, s, len);
            } else {
                std::ptr::copy_nonoverlapping(
                    tmp.add(t * block),
                    (c.extra[k].0 as *mut f32).add(s),
                    len,
                );
            }
        }
    }
}

/// [`eval`] compiled for the widest vector unit the CPU has.
///
/// # Safety
/// As [`eval`].
unsafe fn eval_best(c: &Ctx, blocks: std::ops::Range<usize>) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v512(c: &Ctx, blocks: std::ops::Range<usize>) {
            eval(c, blocks)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v256(c: &Ctx, blocks: std::ops::Range<usize>) {
            eval(c, blocks)
        }
        if crate::isa::avx512() {
            return v512(c, blocks);
        }
        if crate::isa::avx2() {
            return v256(c, blocks);
        }
    }
    eval(c, blocks)
}

/// The group as a single-pass Adam(W) update, when it is one (see [`super::adam`]): `layouts`
/// are the external operands' (before broadcasting to `dims`), `extra` the instructions the
/// group also stores.
pub fn as_adam(
    code: &[Instr],
    layouts: &[Layout],
    dims: &[usize],
    extra: &[usize],
    rows: Option<RowSum>,
) -> Option<AdamGroup> {
    if rows.is_some() || dims.contains(&0) || rlx_ir::env::is_off(rlx_ir::env::FUSED_ADAM) {
        return None;
    }
    let dense = Layout::contiguous(dims);
    let l = |k: usize| layouts[k].broadcast_to(dims);
    AdamGroup::find(
        code,
        &|k| l(k).strides().iter().all(|&s| s == 0),
        &|k| l(k).strides() == dense.strides(),
        extra,
    )
}

/// The kernel: `ins` are the group's external operands (broadcast to `dims`), `code` the
/// instructions in order; the last one is the result, of dims `dims`, written to the dense
/// `out` — or, with `rows`, summed per row into the dense `out` (one value per row) — and each
/// `(instruction, buffer)` of `extra` is stored too (dense, of dims `dims`).
#[allow(clippy::too_many_arguments)]
pub fn build(
    code: Vec<Instr>,
    ins: Vec<TRef>,
    dims: Vec<usize>,
    out: TRef,
    rows: Option<RowSum>,
    extra: Vec<(usize, TRef)>,
    scratch: Ptr,
    threads: usize,
) -> Box<dyn Kernel> {
    let extra_instrs: Vec<usize> = extra.iter().map(|e| e.0).collect();
    let layouts: Vec<Layout> = ins.iter().map(|t| t.layout).collect();
    // The one-pass Adam kernel reads f32 operands only.
    let all_f32 = ins.iter().all(|t| t.dtype == rlx_ir::DType::F32);
    if let Some(a) = as_adam(&code, &layouts, &dims, &extra_instrs, rows).filter(|_| all_f32) {
        let n = dims.iter().product();
        return super::adam::build(a, ins, n, out, &extra, threads);
    }
    let mut plan = plan(&code, &ins, &dims, &out, &extra_instrs, rows);
    plan.extra_bf16 = extra
        .iter()
        .map(|(_, t)| t.dtype == rlx_ir::DType::BF16)
        .collect();
    // SAFETY: each extra result is a dense buffer of `dims` from its offset.
    let extra_ptrs: Vec<Ptr> = extra
        .iter()
        .map(|(_, t)| unsafe { dense_from_offset(t) })
        .collect();
    let out_ptr = unsafe { dense_from_offset(&out) };
    let block = plan.block;
    let per_thread = (plan.gathers + plan.slots) * block;
    let n: usize = dims.iter().product();
    kernel(move |pool: &Pool| {
        let blocks = n.div_ceil(block);
        let tasks = blocks.min(threads * 4).max(1);
        let per_task = blocks.div_ceil(tasks);
        pool.run(tasks, &|t, th| {
            let c = Ctx {
                extra: &extra_ptrs,
                plan: &plan,
                ins: &ins,
                dims: &dims,
                // The output is dense (`n` elements, or one per row) from its offset.
                out: out_ptr.get() as *mut f32,
                // SAFETY: each thread owns `per_thread` floats of scratch.
                scratch: unsafe { (scratch.get() as *mut f32).add(th * per_thread) },
                n,
            };
            // SAFETY: see `Ctx`; block ranges of different tasks are disjoint.
            unsafe { eval_best(&c, t * per_task..((t + 1) * per_task).min(blocks)) };
        });
    })
}
