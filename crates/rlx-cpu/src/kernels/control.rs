//! Control flow. Each graph an op carries (branch, loop condition, loop body) is compiled at
//! lowering as a program of its own (its own arena, the same thread count). `if` copies its
//! args into the taken branch only and runs it; `while` runs its condition and body programs
//! in a loop over carries kept in host buffers, for as many iterations as the predicate asks
//! (no unrolling); `scan` runs its body once per step, feeding each step's slice of the
//! sequences and writing each new carry into its row of the result.

use super::{materialize, Kernel, Lowered, NodeInfo, TRef};
use crate::pool::Pool;
use crate::program::Program;
use rlx_ir::ops::{DefinedOp, If, Scan, While};
use rlx_ir::{Op, Result};
use std::sync::Mutex;

/// Both branches, compiled, and staging for the args (allocated once).
struct IfKernel {
    state: Mutex<([Program; 2], Vec<Vec<u8>>)>,
    ins: Vec<TRef>,
    out: TRef,
}

impl Kernel for IfKernel {
    fn run(&self, _pool: &Pool) {
        let mut pred = [0u8; 1];
        materialize(&self.ins[0], &mut pred);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (branches, staging) = &mut *st;
        let p = &mut branches[if pred[0] != 0 { 0 } else { 1 }];
        for (i, (a, bytes)) in self.ins[1..].iter().zip(staging.iter_mut()).enumerate() {
            materialize(a, bytes);
            p.write_input(i, bytes);
        }
        p.execute();
        let n = self.out.layout.numel() * self.out.dtype.size_bytes();
        // SAFETY: the output is a fresh contiguous buffer of the result's size.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.out.ptr.0, n) };
        p.read_output(0, dst);
    }
}

/// The control-flow ops the CPU runs natively, recognised by type.
#[derive(Clone, Copy)]
pub(super) enum Flow<'a> {
    If,
    While(&'a While),
    Scan(&'a Scan),
}

impl<'a> Flow<'a> {
    /// The control-flow op `d` is, if it is one.
    pub(super) fn of(d: &'a DefinedOp) -> Option<Flow<'a>> {
        if d.downcast::<If>().is_some() {
            Some(Flow::If)
        } else if let Some(op) = d.downcast::<While>() {
            Some(Flow::While(op))
        } else {
            d.downcast::<Scan>().map(Flow::Scan)
        }
    }
}

/// Lower a control-flow node.
pub(super) fn lower(info: &NodeInfo<'_>, flow: Flow<'_>) -> Result<Lowered> {
    match flow {
        Flow::If => lower_if(info),
        Flow::While(op) => lower_while(info, op),
        Flow::Scan(op) => lower_scan(info, op),
    }
}

/// Graph `index` (in `OpDef::graphs` order) of the node, compiled for `info.threads` threads:
/// with the plan the session made for it (the graph then went through the session's pipeline,
/// decomposed for this backend and fused), else prepared here as `crate::compile` does.
fn program(info: &NodeInfo<'_>, index: usize) -> Result<Program> {
    let Op::Defined(d) = &info.node.op else {
        return Err(info.unsupported("not control flow"));
    };
    let graphs = d.def().graphs();
    let (_, g) = graphs
        .get(index)
        .ok_or_else(|| info.unsupported(format!("{} has no graph {index}", d.name())))?;
    let compiled = match info.plan.nested(info.id, index) {
        Some(plan) => crate::lower(g, plan, info.threads, None),
        None => crate::compile(g, info.threads),
    };
    compiled.map_err(|e| {
        info.unsupported(format!(
            "its {} graph \"{}\" does not compile: {e}",
            graphs[index].0,
            g.name()
        ))
    })
}

/// Staging buffers of the operands' sizes.
fn staging(ins: &[TRef]) -> Vec<Vec<u8>> {
    ins.iter()
        .map(|a| vec![0u8; a.layout.numel() * a.dtype.size_bytes()])
        .collect()
}

/// Lower an `if` node: compile both branches for `info.threads` threads.
fn lower_if(info: &NodeInfo<'_>) -> Result<Lowered> {
    let then_p = program(info, 0)?;
    let else_p = program(info, 1)?;
    Ok(Lowered::Compute {
        scratch: 0,
        build: Box::new(move |ins, out, _| {
            Box::new(IfKernel {
                state: Mutex::new(([then_p, else_p], staging(&ins[1..]))),
                ins: ins.to_vec(),
                out,
            }) as Box<dyn Kernel>
        }),
    })
}

/// A `while` loop: condition and body programs and the carries.
struct WhileKernel {
    state: Mutex<(Program, Program, Vec<Vec<u8>>)>,
    ins: Vec<TRef>,
    out: TRef,
    max: Option<usize>,
    output: usize,
}

impl Kernel for WhileKernel {
    fn run(&self, _pool: &Pool) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (cond, body, carries) = &mut *st;
        for (a, c) in self.ins.iter().zip(carries.iter_mut()) {
            materialize(a, c);
        }
        let mut done = 0;
        while self.max.is_none_or(|m| done < m) {
            for (i, c) in carries.iter().enumerate() {
                cond.write_input(i, c);
            }
            cond.execute();
            let mut p = [0u8; 1];
            cond.read_output(0, &mut p);
            if p[0] == 0 {
                break;
            }
            for (i, c) in carries.iter().enumerate() {
                body.write_input(i, c);
            }
            body.execute();
            for (i, c) in carries.iter_mut().enumerate() {
                body.read_output(i, c);
            }
            done += 1;
        }
        let r = &carries[self.output];
        // SAFETY: the output is a fresh contiguous buffer of the carry's size.
        unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), self.out.ptr.0, r.len()) };
    }
}

/// Lower a `while` node.
fn lower_while(info: &NodeInfo<'_>, op: &While) -> Result<Lowered> {
    let cond = program(info, 0)?;
    let body = program(info, 1)?;
    let (max, output) = (op.max_iterations, op.output);
    Ok(Lowered::Compute {
        scratch: 0,
        build: Box::new(move |ins, out, _| {
            Box::new(WhileKernel {
                state: Mutex::new((cond, body, staging(ins))),
                ins: ins.to_vec(),
                out,
                max,
                output,
            }) as Box<dyn Kernel>
        }),
    })
}

/// A `scan`: the body program, the carry and the sequences.
struct ScanKernel {
    state: Mutex<(Program, Vec<Vec<u8>>)>,
    ins: Vec<TRef>,
    out: TRef,
    steps: usize,
    consts: usize,
}

impl Kernel for ScanKernel {
    fn run(&self, _pool: &Pool) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (body, bufs) = &mut *st;
        for (a, b) in self.ins.iter().zip(bufs.iter_mut()) {
            materialize(a, b);
        }
        let (carry, rest) = bufs.split_at_mut(1);
        let carry = &mut carry[0];
        let (consts, xs) = rest.split_at(self.consts);
        for t in 0..self.steps {
            body.write_input(0, carry);
            for (j, c) in consts.iter().enumerate() {
                body.write_input(1 + j, c);
            }
            for (j, x) in xs.iter().enumerate() {
                let n = x.len() / self.steps;
                body.write_input(1 + self.consts + j, &x[t * n..(t + 1) * n]);
            }
            body.execute();
            body.read_output(0, carry);
            // SAFETY: row `t` of the output holds one carry.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    carry.as_ptr(),
                    self.out.ptr.0.add(t * carry.len()),
                    carry.len(),
                )
            };
        }
    }
}

/// Lower a `scan` node.
fn lower_scan(info: &NodeInfo<'_>, op: &Scan) -> Result<Lowered> {
    let body = program(info, 0)?;
    let steps = info.dims.first().copied().unwrap_or(0);
    let consts = op.consts;
    Ok(Lowered::Compute {
        scratch: 0,
        build: Box::new(move |ins, out, _| {
            Box::new(ScanKernel {
                state: Mutex::new((body, staging(ins))),
                ins: ins.to_vec(),
                out,
                steps,
                consts,
            }) as Box<dyn Kernel>
        }),
    })
}
