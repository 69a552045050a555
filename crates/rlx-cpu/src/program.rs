//! Compiling a graph into a CPU program: lower each node, plan one arena for every
//! intermediate, fix every buffer's address, then build the kernels.
//!
//! The phases: `lowering.rs` turns each node into a view, a leaf buffer or a pending step with
//! the arena requests it needs (fused regions in `chain.rs`, pattern regions in `pattern.rs`);
//! `placement.rs` fixes lifetimes and donations, packs one arena with `rlx_opt::plan_memory`
//! and builds the kernels with their operands' addresses.
//!
//! The params a program owns (not shared through `compile_sharing`) are parts of one buffer,
//! in huge pages, when they add up to 2 MiB or more (`RLX_PARAM_SLAB=0` gives each its own).
//! Params the lowering plan stores in column panels are permuted when written and back when
//! read (`stored_runs`), so users see row-major weights.

mod chain;
mod lowering;
mod pattern;
mod placement;

use crate::buffer::Buffer;
use crate::kernels::{self, Kernel, Ptr, TRef};
use crate::layout::Layout;
use crate::pool::Pool;
use kernels::gemm::half::PANEL;
use lowering::Lowering;
use rlx_driver::{Executable, IoSlot};
use rlx_ir::{DType, Error, FusionKind, Graph, NodeId, Op, Result};
use rlx_opt::{LoweringOptions, LoweringPlan};
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
    /// Node, operand dims and result dims of each step (`RLX_PROFILE=nodes` only).
    step_desc: Option<Vec<String>>,
    /// Per-step accumulated nanoseconds and call counts when `RLX_PROFILE` is set.
    profile: Option<Vec<(u64, u64)>>,
    pool: Arc<Pool>,
    inputs: Vec<IoSlot>,
    params: Vec<IoSlot>,
    outputs: Vec<IoSlot>,
    input_ptrs: Vec<Ptr>,
    param_bufs: Vec<Arc<Buffer>>,
    /// `[k, n]` of each param stored in column panels (the plan's `panel_params`), else `None`.
    param_panels: Vec<Option<[usize; 2]>>,
    output_refs: Vec<TRef>,
    // Owned storage the kernels point into; kept alive (and unmoved) for the program's lifetime.
    _arena: Buffer,
    _consts: Vec<Buffer>,
    arena_bytes: usize,
    in_place_updates: usize,
}

impl Program {
    /// Bytes of the single arena holding every input and intermediate.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// How many of the updates given to [`compile_with_updates`] are computed in place.
    pub fn in_place_updates(&self) -> usize {
        self.in_place_updates
    }

    /// Number of kernel launches per run.
    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// The kind of each step, in run order, as `RLX_PROFILE` names them: the op (`matmul`,
    /// `softmax`, …), `fused` for an elementwise group, `adam` for a group run as the one-pass
    /// Adam update.
    pub fn step_kinds(&self) -> &[&'static str] {
        &self.step_ops
    }
}

/// Whether the CPU's region kernels take node `id` into a region of `kind` (what
/// `CpuBackend::fuses` answers): f32 Binary / Activation nodes into elementwise regions, a row
/// sum or mean as the end of a multiply-reduce region, an elementwise region updating a param
/// as an optimizer region, and the f32 pattern regions of [`kernels::patterns`].
pub fn fuses(g: &Graph, id: NodeId, kind: FusionKind) -> bool {
    match kind {
        FusionKind::Elementwise => kernels::fused::fusible(g, id),
        FusionKind::MultiplyReduce => kernels::fused::row_sum(g, id).is_some(),
        // An elementwise region updating a param: the group loop runs it (as the one-pass
        // Adam update when it is one).
        FusionKind::Optimizer => {
            matches!(&g.node(id).op, Op::Fused(r) if kernels::fused::region_program(r).is_some())
        }
        // A product with its bias and activation, a residual add with its norm (f32).
        FusionKind::MatMulEpilogue | FusionKind::ResidualNorm => {
            kernels::patterns::accepts(g, id, kind)
        }
        // No kernels for these shapes: the products, norms and attention run on their own.
        FusionKind::GatedMlp | FusionKind::Attention | FusionKind::NormMatMul => false,
    }
}

/// The compiler's lowering plan for `g` with the CPU's region kernels: fusion (unless
/// `fuse` is false), causal skips, permuted stores and donations of `updates`, each switched by
/// `LoweringOptions::with_env`.
pub fn prepare(
    g: &Graph,
    fuse: bool,
    updates: &[(String, usize)],
) -> Result<(Graph, LoweringPlan)> {
    let mut options = LoweringOptions {
        param_panels: kernels::gemm::half::PANEL,
        ..LoweringOptions::default()
    }
    .with_env();
    options.fusion.elementwise &= fuse;
    rlx_opt::prepare(g, &options, &fuses, updates)
}

/// Run the compiler's lowering plan (see [`prepare`]) over `g` and lower it, with elementwise
/// fusion unless `RLX_FUSION=0` (fused and unfused programs give bit-identical results). A
/// convenience for graphs that did not go through a session; sessions plan and then call
/// [`lower`].
pub fn compile(g: &Graph, threads: usize) -> Result<Program> {
    compile_with_fusion(g, threads, true)
}

/// [`compile`] with elementwise fusion switched explicitly (`RLX_FUSION` still overrides).
pub fn compile_with_fusion(g: &Graph, threads: usize, fuse: bool) -> Result<Program> {
    let (g, plan) = prepare(g, fuse, &[])?;
    lower(&g, &plan, threads, None)
}

/// [`compile`] for a graph whose outputs will overwrite params after each run (`(param name,
/// output index)`, see `CompileOptions::updates`): the updates the plan donates are written
/// straight into the param's storage, so `assign_param` has nothing to copy for them.
pub fn compile_with_updates(
    g: &Graph,
    threads: usize,
    updates: &[(String, usize)],
) -> Result<Program> {
    let (g, plan) = prepare(g, true, updates)?;
    lower(&g, &plan, threads, None)
}

/// The runs of bytes `range` of a param (row-major, as users see it) as it is stored: calls
/// `f(logical, stored, len)` for each run contiguous in both. A plain param is one run; one
/// stored in column panels (`[k, n]` of 2-byte elements, see [`HMat::panels`]) a run per
/// panel row.
///
/// [`HMat::panels`]: kernels::gemm::half::HMat::panels
fn stored_runs(
    panels: Option<[usize; 2]>,
    range: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize, usize),
) {
    let Some([k, n]) = panels else {
        if !range.is_empty() {
            f(range.start, range.start, range.len());
        }
        return;
    };
    const E: usize = 2;
    let mut at = range.start;
    while at < range.end {
        let (r, c) = (at / E / n, at / E % n);
        let end = ((r * n + (c / PANEL + 1) * PANEL) * E).min(range.end);
        f(
            at,
            kernels::gemm::half::panel_offset(k, r, c) * E + at % E,
            end - at,
        );
        at = end;
    }
}

/// Lower `g` (verified, decomposed to what [`kernels::supports`] runs) with the decisions of
/// `plan` for `threads` threads; params with the same name and shape as a param of `share` use
/// that param's storage (see `Backend::compile_sharing`).
pub fn lower(
    g: &Graph,
    plan: &LoweringPlan,
    threads: usize,
    share: Option<&Program>,
) -> Result<Program> {
    let threads = threads.max(1);
    let mut lowering = Lowering::new(g, plan, threads, share)?;
    for id in g.ids() {
        lowering.node(id)?;
    }
    lowering.finish()
}

impl Program {
    /// Time per op kind accumulated over all runs (`RLX_PROFILE=1`): `(op, total ns, calls)`,
    /// slowest first. Empty when profiling is off.
    pub fn profile(&self) -> Vec<(&'static str, u64, u64)> {
        let Some(prof) = &self.profile else {
            return Vec::new();
        };
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
        by.sort_by_key(|e| std::cmp::Reverse(e.1));
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
        eprintln!(
            "rlx profile ({} steps per run, {:.3} ms in total):",
            self.steps.len(),
            total as f64 / 1e6
        );
        for (op, ns, n) in by {
            eprintln!(
                "  {op:<14} {:>10.3} ms {:>5.1}%  {n} calls",
                ns as f64 / 1e6,
                100.0 * ns as f64 / total as f64
            );
        }
        if let (Some(desc), Some(prof)) = (&self.step_desc, &self.profile) {
            let mut order: Vec<usize> = (0..desc.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(prof[i].0));
            eprintln!("  slowest steps (of {}):", desc.len());
            let top = rlx_ir::env::count(rlx_ir::env::PROFILE_TOP).unwrap_or(30);
            for &i in order.iter().take(top) {
                let (ns, n) = prof[i];
                eprintln!(
                    "  {:>9.3} ms/call {:>5.1}%  {}",
                    ns as f64 / 1e6 / n.max(1) as f64,
                    100.0 * ns as f64 / total as f64,
                    desc[i]
                );
            }
        }
    }
}

/// The executable's operations, infallible on the CPU (every buffer was allocated at compile
/// time): tests and benchmarks that compile with [`crate::compile`] call them directly. They
/// panic on a buffer of the wrong length; the [`Executable`] methods answer an error instead.
impl Program {
    /// Copy the bytes of input `idx` (exactly its byte size).
    pub fn write_input(&mut self, idx: usize, bytes: &[u8]) {
        let want = self.inputs[idx].shape.size_bytes().unwrap_or(0);
        assert_eq!(
            bytes.len(),
            want,
            "input byte length checked by the runtime"
        );
        // SAFETY: the arena slot has exactly `want` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.input_ptrs[idx].0, want) };
    }

    /// Copy the bytes of param `idx` (exactly its byte size).
    pub fn write_param(&mut self, idx: usize, bytes: &[u8]) {
        let b = &self.param_bufs[idx];
        assert_eq!(
            bytes.len(),
            b.len(),
            "param byte length checked by the runtime"
        );
        self.write_param_range(idx, 0, bytes);
    }

    /// Overwrite bytes `offset..offset + bytes.len()` of param `idx`.
    pub fn write_param_range(&mut self, idx: usize, offset: usize, bytes: &[u8]) {
        let b = &self.param_bufs[idx];
        assert!(
            offset + bytes.len() <= b.len(),
            "param range checked by the runtime"
        );
        // SAFETY: every run lies inside the param buffer (the range is checked above and a
        // panel layout is a permutation of the buffer's elements).
        stored_runs(
            self.param_panels[idx],
            offset..offset + bytes.len(),
            |at, to, len| unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr().add(at - offset), b.ptr().add(to), len)
            },
        );
    }

    /// Read param `idx` back into `out`.
    pub fn read_param(&self, idx: usize, out: &mut [u8]) {
        let b = &self.param_bufs[idx];
        let len = b.len().min(out.len());
        // SAFETY: as in `write_param_range`; `out` holds `len` bytes.
        stored_runs(self.param_panels[idx], 0..len, |at, from, n| unsafe {
            std::ptr::copy_nonoverlapping(b.ptr().add(from), out.as_mut_ptr().add(at), n)
        });
    }

    /// Run the program on the current inputs and params.
    pub fn execute(&mut self) {
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

    /// Copy output `idx` (dense, row-major) into `out` (exactly its byte size).
    pub fn read_output(&self, idx: usize, out: &mut [u8]) {
        kernels::materialize(&self.output_refs[idx], out);
    }

    /// Overwrite param `param` with output `output` (same shape and dtype).
    pub fn assign_param(&mut self, param: usize, output: usize) {
        let src = self.output_refs[output];
        let dst = &self.param_bufs[param];
        if src.ptr.0 == dst.ptr() || self.param_panels[param].is_some() {
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

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn write_input(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.inputs[idx];
        if Some(bytes.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("input", slot, bytes.len()));
        }
        Program::write_input(self, idx, bytes);
        Ok(())
    }

    fn write_param(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.params[idx];
        if Some(bytes.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("param", slot, bytes.len()));
        }
        Program::write_param(self, idx, bytes);
        Ok(())
    }

    fn write_param_range(&mut self, idx: usize, offset: usize, bytes: &[u8]) -> Result<()> {
        let len = self.param_bufs[idx].len();
        if offset.checked_add(bytes.len()).is_none_or(|e| e > len) {
            return Err(Error::Invalid(format!(
                "bytes {offset}..+{} are outside param \"{}\" ({len} bytes)",
                bytes.len(),
                self.params[idx].name
            )));
        }
        Program::write_param_range(self, idx, offset, bytes);
        Ok(())
    }

    fn read_param(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.params[idx];
        if Some(out.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("param", slot, out.len()));
        }
        Program::read_param(self, idx, out);
        Ok(())
    }

    fn execute(&mut self) -> Result<()> {
        crate::kernels::registered::clear_faults();
        Program::execute(self);
        match crate::kernels::registered::take_fault() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn read_output(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.outputs[idx];
        if Some(out.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("output", slot, out.len()));
        }
        Program::read_output(self, idx, out);
        Ok(())
    }

    fn assign_param(&mut self, param: usize, output: usize) -> Result<()> {
        let (p, o) = (&self.params[param], &self.outputs[output]);
        if p.shape != o.shape {
            return Err(Error::Invalid(format!(
                "output {output} ({}) cannot overwrite param \"{}\" ({})",
                o.shape, p.name, p.shape
            )));
        }
        Program::assign_param(self, param, output);
        Ok(())
    }
}
