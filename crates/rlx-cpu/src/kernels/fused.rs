//! Fused elementwise chains: a tree of f32 Binary / Activation nodes whose intermediate results
//! have no other use runs as one loop over blocks of the result, so intermediates stay in
//! per-thread scratch instead of making a round trip through memory each.

use super::{kernel, Kernel, Ptr, TRef};
use crate::layout::{for_each_run, Layout};
use crate::pool::Pool;
use rlx_ir::{Activation, BinaryOp, Graph, NodeId, Op};

/// Elements computed per block (per operand and temporary).
const BLOCK: usize = 512;

/// Where an instruction reads an operand.
#[derive(Clone, Copy, Debug)]
pub enum Src {
    /// External operand `k` of the group.
    Ext(usize),
    /// Result of instruction `j`.
    Tmp(usize),
}

/// One step of the chain.
#[derive(Clone, Debug)]
pub enum Instr {
    /// Elementwise binary op.
    Binary(BinaryOp, Src, Src),
    /// Elementwise function.
    Unary(Activation, Src),
}

/// Whether a node can join a fused chain.
pub fn fusible(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    let f32_ins = n.inputs.iter().all(|i| g.shape(*i).dtype() == rlx_ir::DType::F32);
    n.shape.dtype() == rlx_ir::DType::F32 && f32_ins && matches!(n.op, Op::Binary(_) | Op::Activation(_))
}

/// Scratch bytes the chain needs for `threads` threads.
pub fn scratch_bytes(n_ext: usize, n_instr: usize, threads: usize) -> usize {
    threads * (n_ext + n_instr) * BLOCK * 4
}

fn binary(op: BinaryOp, a: &[f32], b: &[f32], o: &mut [f32]) {
    let it = o.iter_mut().zip(a.iter().zip(b));
    match op {
        BinaryOp::Add => it.for_each(|(o, (x, y))| *o = x + y),
        BinaryOp::Sub => it.for_each(|(o, (x, y))| *o = x - y),
        BinaryOp::Mul => it.for_each(|(o, (x, y))| *o = x * y),
        BinaryOp::Div => it.for_each(|(o, (x, y))| *o = x / y),
        BinaryOp::Max => it.for_each(|(o, (x, y))| *o = if x >= y || x.is_nan() { *x } else { *y }),
        BinaryOp::Min => it.for_each(|(o, (x, y))| *o = if x <= y || x.is_nan() { *x } else { *y }),
        BinaryOp::Pow => it.for_each(|(o, (x, y))| *o = x.powf(*y)),
    }
}

fn unary(a: Activation, x: &[f32], o: &mut [f32]) {
    crate::with_float_fn!(a, f32, f => o.iter_mut().zip(x).for_each(|(o, x)| *o = f(*x)))
}

/// The kernel: `ins` are the group's external operands (broadcast to `out`'s dims), `code` the
/// instructions in order; the last one is the result.
pub fn build(code: Vec<Instr>, ins: Vec<TRef>, out: TRef, scratch: Ptr, threads: usize) -> Box<dyn Kernel> {
    let dims = out.layout.dims().to_vec();
    let dense = Layout::contiguous(&dims);
    let layouts: Vec<Layout> = ins.iter().map(|t| t.layout.broadcast_to(&dims)).collect();
    let per_thread = (ins.len() + code.len()) * BLOCK;
    let n = out.layout.numel();
    kernel(move |pool: &Pool| {
        let blocks = n.div_ceil(BLOCK);
        let tasks = blocks.min(threads * 4).max(1);
        let per_task = blocks.div_ceil(tasks);
        pool.run(tasks, &|t, th| {
            // SAFETY: each thread owns `per_thread` floats of scratch; offsets come from layouts.
            let buf = unsafe { std::slice::from_raw_parts_mut((scratch.get() as *mut f32).add(th * per_thread), per_thread) };
            let (ext, tmp) = buf.split_at_mut(ins.len() * BLOCK);
            for blk in t * per_task..((t + 1) * per_task).min(blocks) {
                let s = blk * BLOCK;
                let len = BLOCK.min(n - s);
                for (k, (x, l)) in ins.iter().zip(&layouts).enumerate() {
                    let dst = &mut ext[k * BLOCK..k * BLOCK + len];
                    let src = x.base::<f32>() as *const f32;
                    for_each_run(&dims, [&dense, l], s..s + len, |[o, i], m, [so, si]| {
                        let d = &mut dst[o - s..];
                        // SAFETY: offsets come from the operand's layout inside its buffer.
                        unsafe {
                            if so == 1 && si == 1 {
                                d[..m].copy_from_slice(std::slice::from_raw_parts(src.add(i), m));
                            } else if so == 1 && si == 0 {
                                d[..m].fill(*src.add(i));
                            } else {
                                for q in 0..m {
                                    d[q * so] = *src.add(i + q * si);
                                }
                            }
                        }
                    });
                }
                for (j, ins_j) in code.iter().enumerate() {
                    let (done, rest) = tmp.split_at_mut(j * BLOCK);
                    let o = &mut rest[..len];
                    let get = |s: Src| -> &[f32] {
                        match s {
                            Src::Ext(k) => &ext[k * BLOCK..k * BLOCK + len],
                            Src::Tmp(i) => &done[i * BLOCK..i * BLOCK + len],
                        }
                    };
                    match ins_j {
                        Instr::Binary(op, a, b) => binary(*op, get(*a), get(*b), o),
                        Instr::Unary(act, a) => unary(*act, get(*a), o),
                    }
                }
                let last = (code.len() - 1) * BLOCK;
                // SAFETY: the output is dense and `s + len <= n`.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.base::<f32>().add(out.layout.offset + s), len) };
                dst.copy_from_slice(&tmp[last..last + len]);
            }
        });
    })
}
