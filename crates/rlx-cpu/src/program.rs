//! Compiling a graph into a CPU program: lower each node, plan one arena for every
//! intermediate, fix every buffer's address, then build the kernels.

use crate::buffer::Buffer;
use crate::kernels::{self, Kernel, Lowered, NodeInfo, Ptr, TRef};
use crate::layout::{Layout, MAX_RANK};
use crate::pool::Pool;
use rlx_driver::{Executable, IoSlot};
use rlx_ir::{DType, Error, Graph, Op, Result};
use rlx_opt::{plan_memory, BufferRequest};
use std::sync::Arc;

/// Where a value's bytes live.
#[derive(Clone, Copy, Debug)]
enum Buf {
    /// Arena buffer request `i`.
    Arena(usize),
    /// Param storage `i`.
    Param(usize),
    /// Constant storage `i`.
    Const(usize),
}

#[derive(Clone, Copy)]
struct Val {
    buf: Buf,
    layout: Layout,
    dtype: DType,
}

/// A compiled CPU program.
pub struct Program {
    steps: Vec<Box<dyn Kernel>>,
    /// Op name of each step (for the profile).
    step_ops: Vec<&'static str>,
    /// Per-step accumulated nanoseconds and call counts when `RLX_PROFILE` is set.
    profile: Option<Vec<(u64, u64)>>,
    pool: Arc<Pool>,
    inputs: Vec<IoSlot>,
    params: Vec<IoSlot>,
    outputs: Vec<IoSlot>,
    input_ptrs: Vec<Ptr>,
    param_bufs: Vec<Buffer>,
    output_refs: Vec<TRef>,
    // Owned storage the kernels point into; kept alive (and unmoved) for the program's lifetime.
    _arena: Buffer,
    _consts: Vec<Buffer>,
    arena_bytes: usize,
}

impl Program {
    /// Bytes of the single arena holding every input and intermediate.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// Number of kernel launches per run.
    pub fn steps(&self) -> usize {
        self.steps.len()
    }
}

fn check_node(g: &Graph, id: rlx_ir::NodeId) -> Result<Vec<usize>> {
    let n = g.node(id);
    let dims = n.shape.static_dims().ok_or_else(|| Error::Unsupported {
        backend: "cpu".into(),
        op: n.op.name().into(),
        node: id,
        msg: format!("shape {} has symbolic dimensions; bind them before compiling", n.shape),
    })?;
    if dims.len() > MAX_RANK || n.shape.dtype() == DType::C64 {
        return Err(Error::Unsupported {
            backend: "cpu".into(),
            op: n.op.name().into(),
            node: id,
            msg: format!("shape {} (the CPU backend handles rank <= {MAX_RANK} and no c64)", n.shape),
        });
    }
    Ok(dims)
}

/// Compile `g` (verified, decomposed to supported ops) for `threads` threads.
pub fn compile(g: &Graph, threads: usize) -> Result<Program> {
    let threads = threads.max(1);
    let mut vals: Vec<Val> = Vec::with_capacity(g.len());
    let mut reqs: Vec<BufferRequest> = Vec::new();
    let mut consts: Vec<Buffer> = Vec::new();
    let mut param_bufs: Vec<Buffer> = Vec::new();
    let (mut inputs, mut params) = (Vec::new(), Vec::new());
    let mut input_reqs = Vec::new();
    // (node, arena request of its output, scratch request, builder)
    let mut pending: Vec<(usize, usize, Option<usize>, kernels::Build)> = Vec::new();
    for id in g.ids() {
        let dims = check_node(g, id)?;
        let node = g.node(id);
        let dtype = node.shape.dtype();
        let bytes = dims.iter().product::<usize>() * dtype.size_bytes();
        let dense = Layout::contiguous(&dims);
        let step = pending.len();
        let val = match &node.op {
            Op::Input { name } => {
                reqs.push(BufferRequest { size: bytes, start: 0, end: 0 });
                inputs.push(IoSlot { name: name.clone(), shape: node.shape.clone() });
                input_reqs.push(reqs.len() - 1);
                Val { buf: Buf::Arena(reqs.len() - 1), layout: dense, dtype }
            }
            Op::Param { name } => {
                params.push(IoSlot { name: name.clone(), shape: node.shape.clone() });
                param_bufs.push(Buffer::zeroed(bytes));
                Val { buf: Buf::Param(param_bufs.len() - 1), layout: dense, dtype }
            }
            Op::Constant { data } => {
                consts.push(Buffer::from_bytes(data));
                Val { buf: Buf::Const(consts.len() - 1), layout: dense, dtype }
            }
            _ => {
                let info = NodeInfo {
                    node,
                    id,
                    ins: node.inputs.iter().map(|i| vals[i.index()].layout).collect(),
                    in_dtypes: node.inputs.iter().map(|i| vals[i.index()].dtype).collect(),
                    dims: dims.clone(),
                    threads,
                };
                match kernels::lower(&info)? {
                    Lowered::View { src, layout } => {
                        let s = vals[node.inputs[src].index()];
                        Val { buf: s.buf, layout, dtype }
                    }
                    Lowered::Compute { scratch, build } => {
                        // Operands stay live through this step.
                        for i in &node.inputs {
                            if let Buf::Arena(r) = vals[i.index()].buf {
                                reqs[r].end = reqs[r].end.max(step);
                            }
                        }
                        reqs.push(BufferRequest { size: bytes, start: step, end: step });
                        let out_req = reqs.len() - 1;
                        let scratch_req = (scratch > 0).then(|| {
                            reqs.push(BufferRequest { size: scratch, start: step, end: step });
                            reqs.len() - 1
                        });
                        pending.push((id.index(), out_req, scratch_req, build));
                        Val { buf: Buf::Arena(out_req), layout: dense, dtype }
                    }
                }
            }
        };
        vals.push(val);
    }
    let nsteps = pending.len();
    for o in g.outputs() {
        if let Buf::Arena(r) = vals[o.index()].buf {
            reqs[r].end = nsteps;
        }
    }
    let plan = plan_memory(&reqs, 64);
    let arena = Buffer::zeroed(plan.arena_size);
    let base = |b: Buf| -> Ptr {
        // SAFETY: offsets from the plan lie within the arena.
        Ptr(match b {
            Buf::Arena(r) => unsafe { arena.ptr().add(plan.offsets[r]) },
            Buf::Param(i) => param_bufs[i].ptr(),
            Buf::Const(i) => consts[i].ptr(),
        })
    };
    let tref = |v: &Val| TRef { ptr: base(v.buf), layout: v.layout, dtype: v.dtype };
    let mut steps = Vec::with_capacity(nsteps);
    let mut step_ops = Vec::with_capacity(nsteps);
    for (node, out_req, scratch_req, build) in pending {
        let n = g.node(rlx_ir::NodeId(node as u32));
        step_ops.push(n.op.name());
        let ins: Vec<TRef> = n.inputs.iter().map(|i| tref(&vals[i.index()])).collect();
        let out = tref(&vals[node]);
        debug_assert!(matches!(vals[node].buf, Buf::Arena(r) if r == out_req));
        let scratch = scratch_req.map_or(Ptr(std::ptr::null_mut()), |r| base(Buf::Arena(r)));
        steps.push(build(&ins, out, scratch));
    }
    let outputs = g
        .outputs()
        .iter()
        .enumerate()
        .map(|(i, o)| IoSlot { name: format!("out{i}"), shape: g.shape(*o).clone() })
        .collect();
    let output_refs = g.outputs().iter().map(|o| tref(&vals[o.index()])).collect();
    let input_ptrs = input_reqs.iter().map(|&r| base(Buf::Arena(r))).collect();
    let profile = std::env::var_os("RLX_PROFILE").map(|_| vec![(0, 0); steps.len()]);
    Ok(Program {
        steps,
        step_ops,
        profile,
        pool: Pool::shared(threads),
        inputs,
        params,
        outputs,
        input_ptrs,
        param_bufs,
        output_refs,
        arena_bytes: plan.arena_size,
        _arena: arena,
        _consts: consts,
    })
}

impl Program {
    /// Time per op kind accumulated over all runs (`RLX_PROFILE=1`): `(op, total ns, calls)`,
    /// slowest first. Empty when profiling is off.
    pub fn profile(&self) -> Vec<(&'static str, u64, u64)> {
        let Some(prof) = &self.profile else { return Vec::new() };
        let mut by: Vec<(&'static str, u64, u64)> = Vec::new();
        for (op, (ns, n)) in self.step_ops.iter().zip(prof) {
            match by.iter_mut().find(|e| e.0 == *op) {
                Some(e) => {
                    e.1 += ns;
                    e.2 += n;
                }
                None => by.push((op, *ns, *n)),
            }
        }
        by.sort_by(|a, b| b.1.cmp(&a.1));
        by
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let by = self.profile();
        let total: u64 = by.iter().map(|e| e.1).sum();
        if total == 0 {
            return;
        }
        eprintln!("rlx profile ({} steps per run, {:.3} ms in total):", self.steps.len(), total as f64 / 1e6);
        for (op, ns, n) in by {
            eprintln!("  {op:<14} {:>10.3} ms {:>5.1}%  {n} calls", ns as f64 / 1e6, 100.0 * ns as f64 / total as f64);
        }
    }
}

impl Executable for Program {
    fn inputs(&self) -> &[IoSlot] {
        &self.inputs
    }

    fn params(&self) -> &[IoSlot] {
        &self.params
    }

    fn outputs(&self) -> &[IoSlot] {
        &self.outputs
    }

    fn write_input(&mut self, idx: usize, bytes: &[u8]) {
        let want = self.inputs[idx].shape.size_bytes().unwrap_or(0);
        assert_eq!(bytes.len(), want, "input byte length checked by the runtime");
        // SAFETY: the arena slot has exactly `want` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.input_ptrs[idx].0, want) };
    }

    fn write_param(&mut self, idx: usize, bytes: &[u8]) {
        let b = &self.param_bufs[idx];
        assert_eq!(bytes.len(), b.len(), "param byte length checked by the runtime");
        // SAFETY: the param buffer has exactly `b.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.ptr(), b.len()) };
    }

    fn read_param(&self, idx: usize, out: &mut [u8]) {
        let b = &self.param_bufs[idx];
        // SAFETY: lengths checked by the caller; `out.len() == b.len()`.
        unsafe { std::ptr::copy_nonoverlapping(b.ptr(), out.as_mut_ptr(), b.len().min(out.len())) };
    }

    fn execute(&mut self) {
        match &mut self.profile {
            None => {
                for s in &self.steps {
                    s.run(&self.pool);
                }
            }
            Some(prof) => {
                for (s, p) in self.steps.iter().zip(prof.iter_mut()) {
                    let t = std::time::Instant::now();
                    s.run(&self.pool);
                    p.0 += t.elapsed().as_nanos() as u64;
                    p.1 += 1;
                }
            }
        }
    }

    fn read_output(&self, idx: usize, out: &mut [u8]) {
        kernels::materialize(&self.output_refs[idx], out);
    }

    fn assign_param(&mut self, param: usize, output: usize) {
        let src = self.output_refs[output];
        let dst = &self.param_bufs[param];
        if src.ptr.0 == dst.ptr() {
            if src.layout.is_contiguous() && src.layout.offset == 0 {
                return; // the output is the param itself
            }
            let mut tmp = vec![0u8; dst.len()];
            kernels::materialize(&src, &mut tmp);
            self.write_param(param, &tmp);
            return;
        }
        // SAFETY: the param buffer has exactly the output's byte size (checked by the runtime)
        // and does not overlap the output's buffer.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.ptr(), dst.len()) };
        kernels::materialize(&src, out);
    }
}
