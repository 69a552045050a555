//! Control flow: `if` runs only its taken branch. Each branch is compiled at lowering as a
//! program of its own (its own arena, the same thread count); at run time the predicate is read,
//! the args are copied into the taken branch's inputs, it runs, and its result is copied out.

use super::{materialize, Kernel, Lowered, NodeInfo, TRef};
use crate::pool::Pool;
use crate::program::Program;
use rlx_driver::Executable;
use rlx_ir::text::Attr;
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

/// Lower an `if` node: compile both branches for `info.threads` threads.
pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let Op::Defined(d) = &info.node.op else {
        return Err(info.unsupported("not control flow"));
    };
    // The branches are the op's graph attributes.
    let branch = |key: &str| {
        d.def()
            .attrs()
            .into_iter()
            .find_map(|(k, a)| match a {
                Attr::Graph(g) if k == key => Some(*g),
                _ => None,
            })
            .ok_or_else(|| info.unsupported(format!("{} has no {key} branch", d.name())))
    };
    let threads = info.threads;
    let then_p = crate::compile(&branch("then")?, threads)?;
    let else_p = crate::compile(&branch("else")?, threads)?;
    Ok(Lowered::Compute {
        scratch: 0,
        build: Box::new(move |ins, out, _| {
            let staging = ins[1..]
                .iter()
                .map(|a| vec![0u8; a.layout.numel() * a.dtype.size_bytes()])
                .collect();
            Box::new(IfKernel {
                state: Mutex::new(([then_p, else_p], staging)),
                ins: ins.to_vec(),
                out,
            }) as Box<dyn Kernel>
        }),
    })
}
