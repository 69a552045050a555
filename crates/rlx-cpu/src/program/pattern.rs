//! Pattern regions run as one step ([`kernels::patterns`]): a product with its epilogue, a
//! residual add with its norm (and the further results the step stores).

use super::lowering::{check_node, At, Lowering};
use super::{Buf, Val};
use crate::kernels::{self, patterns::Pattern};
use crate::layout::Layout;
use rlx_ir::Result;

impl Lowering<'_> {
    /// A pattern region's node: result `output` of its region. The first result's step also
    /// stores the further results the graph has (they get arena requests of their own and
    /// follow the operands in the step's operand list); a further result whose first result is
    /// gone is computed alone, the rest of the region in scratch.
    pub(super) fn pattern(&mut self, p: Pattern<usize>, output: usize, at: &At) -> Result<Val> {
        let (g, id, step) = (self.g, at.id, at.step);
        let further = if output == 0 {
            g.fused_results(id)
        } else {
            Vec::new()
        };
        let ks: Vec<usize> = further.iter().map(|&(k, _)| k).collect();
        let (scratch, build) = kernels::patterns::lower(&self.info(at), p, output, &ks)?;
        let mut operands: Vec<usize> = at.node.inputs.iter().map(|i| i.index()).collect();
        self.keep_live(operands.iter().copied(), step);
        let out_req = self.request(at.bytes, step);
        let scratch_req = (scratch > 0).then(|| self.request(scratch, step));
        for (_, s) in further {
            let dims = check_node(g, s)?;
            let dtype = g.shape(s).dtype();
            let r = self.request(dims.iter().product::<usize>() * dtype.size_bytes(), step);
            self.computed.insert(
                s.index(),
                Val {
                    buf: Buf::Arena(r),
                    layout: Layout::contiguous(&dims),
                    dtype,
                },
            );
            operands.push(s.index());
        }
        self.pending
            .push((id.index(), operands, out_req, scratch_req, build));
        Ok(Val {
            buf: Buf::Arena(out_req),
            layout: at.dense,
            dtype: at.dtype,
        })
    }
}
