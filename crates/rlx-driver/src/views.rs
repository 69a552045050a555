//! Values a row-major backend may keep as views of another value's storage, rather than copy.
//!
//! A reshape is always its operand's bytes. A narrow is a view when the range it keeps is
//! contiguous in its operand: every axis before the narrowed one has length 1 (a decode step's
//! split of a stacked `[1, q + k + v]` product into its three parts), so the result is the
//! operand's bytes from an offset on. A backend that takes the view offsets every address of the
//! result by [`narrow_view`]'s element count, and computes nothing for the node.

use rlx_ir::{Graph, NodeId, Op};

/// The element offset at which narrow node `id`'s result starts inside its operand, when that
/// result is a contiguous range of the operand's row-major storage (every axis before the
/// narrowed one has length 1, static dims) and the storage is not a param's: a param may be
/// written in place (a cache write, a donated update) while a view of it is still to be read.
/// `None` for every other node.
pub fn narrow_view(g: &Graph, id: NodeId) -> Option<usize> {
    let n = g.node(id);
    let Op::Narrow { axis, start, .. } = n.op else {
        return None;
    };
    let x = *n.inputs.first()?;
    let dims = g.shape(x).static_dims()?;
    if axis >= dims.len() || dims[..axis].iter().any(|&d| d != 1) {
        return None;
    }
    // The storage's owner: through the ops that are views of their first operand.
    let mut root = x;
    loop {
        match g.node(root).op {
            Op::Reshape { .. } | Op::Narrow { .. } | Op::CacheWrite => {
                root = g.node(root).inputs[0];
            }
            Op::Param { .. } => return None,
            _ => break,
        }
    }
    Some(start * dims[axis + 1..].iter().product::<usize>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{DType, Shape};

    #[test]
    fn only_contiguous_narrows_of_values_that_are_not_params_are_views() {
        let mut g = Graph::new("v");
        let x = g.input("x", Shape::new(&[1, 4, 6], DType::F32));
        let y = g.input("y", Shape::new(&[2, 6], DType::F32));
        let p = g.param("p", Shape::new(&[1, 6], DType::F32));
        let a = g.try_narrow(x, 1, 1, 2).unwrap();
        let b = g.try_narrow(x, 2, 1, 2).unwrap();
        let c = g.try_narrow(y, 1, 2, 2).unwrap();
        let r = g.try_reshape(p, &[6]).unwrap();
        let d = g.try_narrow(r, 0, 2, 2).unwrap();
        let e = g.try_narrow(y, 0, 1, 1).unwrap();
        assert_eq!(narrow_view(&g, a), Some(6));
        assert_eq!(
            narrow_view(&g, b),
            None,
            "axis 1 (length 4) comes before it"
        );
        assert_eq!(narrow_view(&g, c), None, "a leading axis of 2");
        assert_eq!(narrow_view(&g, d), None, "a param's storage");
        assert_eq!(narrow_view(&g, e), Some(6), "whole rows from row 1");
        assert_eq!(narrow_view(&g, x), None);
    }
}
