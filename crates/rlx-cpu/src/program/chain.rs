//! Nodes run as a step of the group loop ([`kernels::fused`]): fused elementwise regions (with
//! the further results they store) and lone f32 activations.

use super::lowering::{check_node, At, Lowering};
use super::{Buf, Val};
use crate::kernels;
use crate::layout::Layout;
use kernels::fused::RegionProgram;
use rlx_ir::{DType, Graph, NodeId, Op, Result};

/// How a node is run as a step of the group loop: its program, the nodes of its external
/// operands, and the nodes of the region's further results it stores, with the instruction
/// computing each.
pub(super) struct Chain {
    prog: kernels::fused::RegionProgram,
    ext: Vec<usize>,
    stored: Vec<(usize, usize)>,
    /// Body ops, for the profile.
    names: Vec<&'static str>,
}

/// The chain running node `id`: a fused region the group loop runs (with the results of the
/// nodes after it that belong to the same region), or a lone f32 activation (the loop is
/// compiled for the widest vector unit, which pays for the transcendental ones).
pub(super) fn chain_of(g: &Graph, id: NodeId) -> Option<Chain> {
    use kernels::fused::{Instr, RegionProgram, Src};
    let n = g.node(id);
    match &n.op {
        Op::Fused(r) => {
            let mut prog = kernels::fused::region_program(r)?;
            let ext = n.inputs.iter().map(|i| i.index()).collect();
            let names = r.op_names();
            if r.output != 0 {
                // A result whose region's first result is gone: compute up to it alone.
                let j = prog.outputs[r.output]?;
                prog.code.truncate(j + 1);
                prog.outputs = vec![Some(j)];
                return Some(Chain {
                    prog,
                    ext,
                    stored: Vec::new(),
                    names,
                });
            }
            let mut stored = Vec::new();
            for (k, s) in g.fused_results(id) {
                stored.push((s.index(), prog.outputs[k]?));
            }
            Some(Chain {
                prog,
                ext,
                stored,
                names,
            })
        }
        Op::Activation(a) if kernels::fused::fusible(g, id) => {
            let dims = n.shape.static_dims()?;
            let prog = RegionProgram {
                code: vec![Instr::Unary(*a, Src::Ext(0))],
                rows: None,
                outputs: vec![Some(0)],
                dims,
            };
            Some(Chain {
                prog,
                ext: vec![n.inputs[0].index()],
                stored: Vec::new(),
                names: vec![n.op.name()],
            })
        }
        _ => None,
    }
}

impl Lowering<'_> {
    /// A node run as a step of the group loop: its output, scratch and further results get
    /// arena requests of their own, and the step is pending.
    pub(super) fn chain(&mut self, chain: Chain, at: &At) -> Result<Val> {
        let (g, threads, step) = (self.g, self.threads, at.step);
        let Chain {
            prog,
            ext,
            stored,
            names,
        } = chain;
        let block = kernels::fused::block_len(prog.rows.map(|r| r.row));
        self.keep_live(ext.iter().copied(), step);
        let out_req = self.request(at.bytes, step);
        let scratch_req = Some(self.request(
            kernels::fused::scratch_bytes(ext.len(), prog.code.len(), threads, block),
            step,
        ));
        // Further results get buffers of their own, written by the step too; they follow
        // the external operands in the step's operand list.
        let mut operands = ext.clone();
        let mut extra = Vec::new();
        for &(s, j) in &stored {
            let sdims = check_node(g, NodeId(s as u32))?;
            let sbytes =
                sdims.iter().product::<usize>() * g.shape(NodeId(s as u32)).dtype().size_bytes();
            let r = self.request(sbytes, step);
            self.computed.insert(
                s,
                Val {
                    buf: Buf::Arena(r),
                    layout: Layout::contiguous(&sdims),
                    dtype: g.shape(NodeId(s as u32)).dtype(),
                },
            );
            extra.push(j);
            operands.push(s);
        }
        // Whether the group runs as the one-pass Adam update (`fused::build` decides the
        // same way), for the profile.
        let layouts: Vec<Layout> = ext.iter().map(|&e| self.vals[e].layout).collect();
        let adam = kernels::fused::as_adam(&prog.code, &layouts, &prog.dims, &extra, prog.rows)
            .is_some()
            && ext.iter().all(|&e| self.vals[e].dtype == DType::F32);
        let what = format!(
            "fused group of {} ({}){}",
            names.len(),
            names.join(" "),
            if adam { " as one Adam pass" } else { "" }
        );
        self.chain_steps
            .insert(at.id.index(), (if adam { "adam" } else { "fused" }, what));
        let n_ext = ext.len();
        let RegionProgram {
            code,
            rows,
            dims: group_dims,
            ..
        } = prog;
        let build: kernels::Build = Box::new(move |ins, out, s| {
            let (ext_refs, extra_refs) = ins.split_at(n_ext);
            let extra = extra.into_iter().zip(extra_refs.iter().copied()).collect();
            kernels::fused::build(
                code,
                ext_refs.to_vec(),
                group_dims,
                out,
                rows,
                extra,
                s,
                threads,
            )
        });
        self.pending
            .push((at.id.index(), operands, out_req, scratch_req, build));
        Ok(Val {
            buf: Buf::Arena(out_req),
            layout: at.dense,
            dtype: at.dtype,
        })
    }
}
