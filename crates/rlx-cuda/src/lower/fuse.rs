//! Which nodes the lowering takes into another node's launch: RMSNorms (and the residual adds
//! they read) into the decode products that read them, RoPEs into the cache writes that read
//! them.

use super::dims;
use crate::source;
use rlx_ir::{DType, Error, Graph, Node, NodeId, Op};

/// The RMSNorms whose one reader is a decode product that can normalize its staged activations
/// itself (`source::dequant_matvec`'s `norm`): f32 operand, gamma and result, the result no
/// output of the graph and read by nothing else; and the residual adds such a norm reads (f32
/// operands of the result's shape, every other reader after the product), which that product
/// computes (`add`).
pub(super) fn norms_into_products(g: &Graph) -> (Vec<bool>, Vec<bool>) {
    let readers = readers(g);
    let mut into = vec![false; g.len()];
    for id in g.ids() {
        let node = g.node(id);
        let f32s = |x: NodeId| g.shape(x).dtype() == DType::F32;
        if !matches!(node.op, Op::RmsNorm { .. })
            || !f32s(id)
            || !node.inputs.iter().all(|&x| f32s(x))
            || g.outputs().contains(&id)
        {
            continue;
        }
        let [p] = readers[id.index()][..] else {
            continue;
        };
        let prod = g.node(p);
        let Op::DequantMatMul { scheme } = prod.op else {
            continue;
        };
        let Ok(xd) = dims(g, id) else { continue };
        let k = *xd.last().unwrap_or(&1);
        let xe: usize = xd.iter().product();
        let rows = xe.checked_div(k).unwrap_or(0);
        into[id.index()] = prod.inputs[0] == id
            && prod.inputs[1] != id
            && rows <= source::QROWS
            && xe <= source::MATVEC_STAGE
            && source::norm_fuses(scheme);
    }
    let mut add = vec![false; g.len()];
    for id in g.ids() {
        if !into[id.index()] {
            continue;
        }
        // The product launches where the add would have: every other reader of the sum must
        // come after it.
        let (a, p) = (g.node(id).inputs[0], readers[id.index()][0]);
        let node = g.node(a);
        let same = |x: NodeId| g.shape(x) == g.shape(a);
        add[a.index()] = matches!(node.op, Op::Binary(rlx_ir::BinaryOp::Add))
            && node.inputs.iter().all(|&x| same(x))
            && readers[a.index()]
                .iter()
                .all(|&r| r == id || r.index() > p.index())
            && !g.outputs().contains(&a);
    }
    (into, add)
}

/// The error for a node taken into `id`'s launch that is not the `what` it was taken in as (the
/// lowering's own bookkeeping gone wrong, named rather than a panic).
pub(super) fn taken_in(id: NodeId, taken: &Node, what: &str) -> Error {
    Error::Unsupported {
        backend: "cuda".into(),
        op: taken.op.name().into(),
        node: id,
        msg: format!("taken into node {id:?}'s launch as {what}, but it is not one"),
    }
}

/// The nodes reading each node.
fn readers(g: &Graph) -> Vec<Vec<NodeId>> {
    let mut readers: Vec<Vec<NodeId>> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for x in &g.node(id).inputs {
            readers[x.index()].push(id);
        }
    }
    readers
}

/// The cache writes (position form) whose update is a rotation (f32, its positions of the
/// cache write's position dtype) read by nothing else, through reshapes that nothing else
/// reads either: `source::rope` with a cache writes it rotated into the cache (by the cache
/// write's node, the rotation).
pub(super) fn ropes_into_caches(g: &Graph) -> Vec<Option<NodeId>> {
    let readers = readers(g);
    let mut of = vec![None; g.len()];
    for id in g.ids() {
        let node = g.node(id);
        if !matches!(node.op, Op::CacheWrite) {
            continue;
        }
        let (cache, pos) = (node.inputs[0], node.inputs[2]);
        let one_pos = dims(g, pos).is_ok_and(|d| d.iter().product::<usize>() == 1);
        let mut u = node.inputs[1];
        let mut next = id;
        while matches!(g.node(u).op, Op::Reshape { .. }) && readers[u.index()] == [next] {
            next = u;
            u = g.node(u).inputs[0];
        }
        let r = g.node(u);
        let fits = matches!(r.op, Op::Rope { .. })
            && readers[u.index()] == [next]
            && !g.outputs().contains(&u)
            && one_pos
            && g.shape(u).dtype() == DType::F32
            && g.shape(r.inputs[1]).dtype() == g.shape(pos).dtype()
            && source::rope(
                DType::F32,
                g.shape(pos).dtype(),
                Some(g.shape(cache).dtype()),
            )
            .is_some();
        if fits {
            of[id.index()] = Some(u);
        }
    }
    of
}
