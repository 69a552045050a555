//! The second phase of [`super::lower`]: outputs' lifetimes and donations, one arena for every
//! request, and the kernels built with their operands' addresses into the [`Program`].

use super::lowering::Lowering;
use super::{Buf, Program, Val};
use crate::buffer::Buffer;
use crate::kernels::{self, Ptr, TRef};
use crate::pool::Pool;
use rlx_driver::IoSlot;
use rlx_ir::{NodeId, Op, Result};
use rlx_opt::plan_memory;

impl Lowering<'_> {
    /// Outputs live to the end; donated updates are computed straight into their param's
    /// storage. Returns how many are.
    fn donate(&mut self) -> usize {
        let g = self.g;
        let nsteps = self.pending.len();
        for o in g.outputs() {
            if let Buf::Arena(r) = self.vals[o.index()].buf {
                self.reqs[r].end = nsteps;
            }
        }
        // Donations: the output's buffer is the param's storage (the plan checked that nothing
        // reads the param's old value after the step writing it).
        let mut donated = 0;
        for d in &self.plan.donations {
            let Some(v) = g.outputs().get(d.output).map(|v| v.index()) else {
                continue;
            };
            let Some(p) = self.params.iter().position(|s| s.name == d.param) else {
                continue;
            };
            let head = g.fused_head(NodeId(v as u32));
            if self.params[p].shape == *g.shape(NodeId(v as u32))
                && matches!(self.vals[v].buf, Buf::Arena(_))
                && head.is_some_and(|h| self.chain_steps.contains_key(&h.index()))
            {
                self.vals[v].buf = Buf::Param(p);
                donated += 1;
            }
        }
        donated
    }

    /// `RLX_PROFILE=nodes`' description of the step of `node` reading `operands`.
    fn describe(&self, node: usize, operands: &[usize]) -> String {
        let (g, vals) = (self.g, &self.vals);
        let n = g.node(rlx_ir::NodeId(node as u32));
        let dims = |i: usize| {
            format!(
                "{:?}{}",
                vals[i].layout.dims(),
                if vals[i].layout.is_contiguous() {
                    ""
                } else {
                    "(strided)"
                }
            )
        };
        let ins: Vec<String> = operands.iter().map(|&i| dims(i)).collect();
        let what = match (
            self.chain_steps.get(&node),
            self.plan.skip(NodeId(node as u32)),
        ) {
            (Some((_, what)), _) => what.clone(),
            (None, None) => match &n.op {
                // A pattern region run as one step.
                Op::Fused(r) => format!("{} ({})", r.kind.name(), r.op_names().join(" ")),
                op => op.name().to_string(),
            },
            (None, Some(skip)) => format!("{} (skipping zeros: {skip:?})", n.op.name()),
        };
        format!(
            "{} {what} ({}) -> {}",
            NodeId(node as u32),
            ins.join(", "),
            g.shape(NodeId(node as u32))
        )
    }

    /// Place every value (donations, then one arena planned for every request), build the
    /// pending kernels with their operands' addresses, and assemble the program.
    pub(super) fn finish(mut self) -> Result<Program> {
        let g = self.g;
        let donated = self.donate();
        let nsteps = self.pending.len();
        let mem = plan_memory(&self.reqs, 64);
        let arena = Buffer::for_compile(mem.arena_size, || {
            format!("the arena of graph \"{}\"", g.name())
        })?;
        let pending = std::mem::take(&mut self.pending);
        let this = &self;
        let base = |b: Buf| -> Ptr {
            // SAFETY: offsets from the plan lie within the arena.
            Ptr(match b {
                Buf::Arena(r) => unsafe { arena.ptr().add(mem.offsets[r]) },
                Buf::Param(i) => this.param_bufs[i].ptr(),
                Buf::Const(i) => this.consts[i].ptr(),
            })
        };
        let tref = |v: &Val| TRef {
            ptr: base(v.buf),
            layout: v.layout,
            dtype: v.dtype,
        };
        let vals = &this.vals;
        let mut steps = Vec::with_capacity(nsteps);
        let mut step_ops = Vec::with_capacity(nsteps);
        let by_node = rlx_ir::env::get(rlx_ir::env::PROFILE).is_some_and(|v| v == "nodes");
        let mut step_desc = by_node.then(Vec::new);
        for (node, operands, out_req, scratch_req, build) in pending {
            let n = g.node(rlx_ir::NodeId(node as u32));
            let chain = this.chain_steps.get(&node);
            if let Some(d) = &mut step_desc {
                d.push(this.describe(node, &operands));
            }
            step_ops.push(match &n.op {
                _ if chain.is_some() => chain.expect("checked").0,
                // Quantized products are told apart by weight format in the profile.
                Op::DequantMatMul { scheme } => kernels::quant::profile_name(*scheme),
                // Pattern regions by kind (`matmul_epilogue`, `residual_norm`).
                Op::Fused(r) => r.kind.name(),
                op => op.name(),
            });
            let ins: Vec<TRef> = operands.iter().map(|&i| tref(&vals[i])).collect();
            let out = tref(&vals[node]);
            debug_assert!(
                out_req == usize::MAX
                    || matches!(vals[node].buf, Buf::Param(_))
                    || matches!(vals[node].buf, Buf::Arena(r) if r == out_req)
            );
            let scratch = scratch_req.map_or(Ptr(std::ptr::null_mut()), |r| base(Buf::Arena(r)));
            steps.push(build(&ins, out, scratch));
        }
        let outputs = g
            .outputs()
            .iter()
            .enumerate()
            .map(|(i, o)| IoSlot {
                name: format!("out{i}"),
                shape: g.shape(*o).clone(),
            })
            .collect();
        let output_refs = g.outputs().iter().map(|o| tref(&vals[o.index()])).collect();
        let input_ptrs = this
            .input_reqs
            .iter()
            .map(|&r| base(Buf::Arena(r)))
            .collect();
        let profile = rlx_ir::env::is_set(rlx_ir::env::PROFILE).then(|| vec![(0, 0); steps.len()]);
        Ok(Program {
            steps,
            step_ops,
            step_desc,
            profile,
            pool: Pool::shared(self.threads),
            inputs: self.inputs,
            params: self.params,
            outputs,
            input_ptrs,
            param_bufs: self.param_bufs,
            param_panels: self.param_panels,
            output_refs,
            arena_bytes: mem.arena_size,
            in_place_updates: donated,
            _arena: arena,
            _consts: self.consts,
        })
    }
}
