//! The regions the backend takes into one launch: `norm_matmul` regions (an RMSNorm, and the
//! residual add it reads, formed by the compiler's pattern fusion) into their decode product's;
//! and, found here, RoPEs into the cache writes that read them.

use super::dims;
use crate::source;
use rlx_ir::{DType, Error, Graph, Node, NodeId, Op, QuantScheme};

/// Whether the decode product at `id` takes the RMSNorm it reads (and the residual add before
/// that norm, where the pattern joins it) into its launch: what `CudaBackend::fuses` answers
/// for [`rlx_ir::FusionKind::NormMatMul`]. The product normalizes its staged activations itself
/// (`source::dequant_matvec`'s `norm`), so: a block type whose activations round to blocks of
/// 32 or not at all, a few rows whose activations fit in shared memory, and f32 operand, gamma
/// and norm.
pub(crate) fn takes_norm(g: &Graph, id: NodeId) -> bool {
    let node = g.node(id);
    let Op::DequantMatMul { scheme } = node.op else {
        return false;
    };
    let h = node.inputs[0];
    let hn = g.node(h);
    let f32s = |x: NodeId| g.shape(x).dtype() == DType::F32;
    let Ok(xd) = dims(g, h) else { return false };
    let k = *xd.last().unwrap_or(&1);
    let xe: usize = xd.iter().product();
    let rows = xe.checked_div(k).unwrap_or(0);
    matches!(hn.op, Op::RmsNorm { .. })
        && f32s(h)
        && hn.inputs.iter().all(|&x| f32s(x))
        && rows <= source::QROWS
        && xe <= source::MATVEC_STAGE
        && source::norm_fuses(scheme)
        && super::unsupported(g, id).is_none()
        && super::unsupported(g, h).is_none()
}

/// A GGUF product as its launch takes it, operands as nodes of the graph: the block type, the
/// activations and weights; for a [`rlx_ir::FusionKind::NormMatMul`] region also the RMSNorm's gamma
/// and eps (`x` is then the norm's operand, or the add's first operand where the region has
/// the add), and with the add its second operand and the node of its sum (the region's second
/// result; `None` where nothing outside the region reads it).
pub(super) struct NormProduct {
    pub scheme: QuantScheme,
    pub x: NodeId,
    pub w: NodeId,
    pub norm: Option<(NodeId, f32)>,
    pub add: Option<(NodeId, Option<NodeId>)>,
}

impl NormProduct {
    /// A product of `x` and `w` with nothing before it.
    pub fn plain(scheme: QuantScheme, x: NodeId, w: NodeId) -> NormProduct {
        NormProduct {
            scheme,
            x,
            w,
            norm: None,
            add: None,
        }
    }
}

/// Whether the decode kernel takes region `np` (see [`takes_norm`]).
pub(super) fn takes_norm_of(g: &Graph, np: &NormProduct) -> bool {
    let Ok(xd) = dims(g, np.x) else { return false };
    let k = *xd.last().unwrap_or(&1);
    let xe: usize = xd.iter().product();
    let rows = xe.checked_div(k).unwrap_or(0);
    let row_bytes = g.shape(np.w).static_dims().and_then(|d| d.last().copied());
    np.norm.is_some()
        && rows <= source::QROWS
        && xe <= source::MATVEC_STAGE
        && source::norm_fuses(np.scheme)
        && row_bytes.is_some()
        && row_bytes == np.scheme.row_bytes(k)
}

/// The `norm_matmul` region whose result `id` is, as [`NormProduct`]; `None` where it is not
/// one of a GGUF product or a value is not f32.
pub(super) fn norm_product(g: &Graph, id: NodeId) -> Option<NormProduct> {
    let p = rlx_opt::norm_matmul_parts(g, id)?;
    let f32s = |x: NodeId| g.shape(x).dtype() == DType::F32;
    let fits = f32s(p.x) && f32s(p.gamma) && f32s(id) && p.residual.is_none_or(f32s);
    fits.then_some(NormProduct {
        scheme: p.scheme?,
        x: p.x,
        w: p.w,
        norm: Some((p.gamma, p.eps)),
        add: p.residual.map(|r| (r, p.sum)),
    })
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

/// The cache writes (position form) whose update is a rotation read by nothing else (through
/// reshapes: `rlx_opt::ropes_into_cache_writes`) that `source::rope` with a cache writes
/// rotated into the cache: an f32 rotation whose positions have the cache write's position
/// dtype. By the cache write's node, the rotation.
pub(super) fn ropes_into_caches(g: &Graph) -> Vec<Option<NodeId>> {
    rlx_opt::ropes_into_cache_writes(g, &|g, rope, write| {
        let (cache, pos) = (g.node(write).inputs[0], g.node(write).inputs[2]);
        g.shape(rope).dtype() == DType::F32
            && g.shape(g.node(rope).inputs[1]).dtype() == g.shape(pos).dtype()
            && source::rope(
                DType::F32,
                g.shape(pos).dtype(),
                Some(g.shape(cache).dtype()),
            )
            .is_some()
    })
}
