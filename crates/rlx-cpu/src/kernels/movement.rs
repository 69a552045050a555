//! Data movement: Transpose, Narrow, Expand and (contiguous) Reshape are views; Concat and the
//! reshape of a non-contiguous value copy.

use super::elementwise::copy;
use super::{compute, kernel, Kernel, Lowered, NodeInfo, TRef};
use crate::layout::Layout;
use rlx_ir::{Op, Result};

pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let x = info.ins[0];
    Ok(match &info.node.op {
        Op::Transpose { perm } => Lowered::View {
            src: 0,
            layout: x.permute(perm),
        },
        Op::Narrow { axis, start, len } => Lowered::View {
            src: 0,
            layout: x.narrow(*axis, *start, *len),
        },
        Op::Expand { shape } => Lowered::View {
            src: 0,
            layout: x.broadcast_to(shape),
        },
        Op::Reshape { shape } => match x.reshape(shape) {
            Some(l) => Lowered::View { src: 0, layout: l },
            // Copy in the source's row-major order; the dense result then reads as `shape`.
            None => compute(move |i, o| {
                let dense = TRef {
                    layout: Layout::contiguous(i[0].layout.dims()),
                    ..o
                };
                copy(i[0], dense)
            }),
        },
        Op::Concat { axis } => {
            let axis = *axis;
            compute(move |ins, out| {
                let mut parts: Vec<Box<dyn Kernel>> = Vec::new();
                let mut start = 0;
                for x in ins {
                    let len = x.layout.dims()[axis];
                    let dst = TRef {
                        layout: out.layout.narrow(axis, start, len),
                        ..out
                    };
                    parts.push(copy(*x, dst));
                    start += len;
                }
                kernel(move |pool| parts.iter().for_each(|p| p.run(pool)))
            })
        }
        _ => return Err(info.unsupported("not a movement op")),
    })
}
