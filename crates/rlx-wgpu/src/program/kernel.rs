//! What a step computes before addresses are fixed ([`Kernel`], by op family), and the shape
//! arithmetic both phases of the lowering share.

use crate::shaders::RANK;
use rlx_ir::{Error, Graph, NodeId, Result};

/// What a step needs before addresses are fixed.
pub(super) enum Kernel {
    /// Elementwise ops and fused regions.
    Elementwise(Elementwise),
    /// Strided copies and the index ops.
    Movement(Movement),
    /// Reductions over axes, softmax, cumsum, top-k.
    Reduction(Reduction),
    /// The tiled product `a @ b`.
    MatMul { a: usize, b: usize },
    /// GGUF products and rows, and the KV cache.
    QuantKv(QuantKv),
    /// A kernel of [`crate::nn`] (norms, RoPE, attention, convolution, pooling).
    Native,
    /// The kernel registered for a defined op ([`crate::registered`]).
    Registered,
}

/// Elementwise kernels: one generated shader per body.
pub(super) enum Elementwise {
    /// An elementwise body over `operands`; `extra` are further results of the region the same
    /// step computes.
    Map {
        body: Graph,
        operands: Vec<usize>,
        extra: Vec<usize>,
    },
    /// A multiply-reduce region.
    MultiplyReduce { body: Graph, operands: Vec<usize> },
}

/// Copies and index ops.
pub(super) enum Movement {
    /// Copy `src` viewed with `(offset, strides)` over `dims` into `dst` at `dst_off` (elements) with `dst_strides`.
    Copy {
        src: usize,
        src_off: usize,
        src_strides: Vec<usize>,
        dims: Vec<usize>,
        dst_off: usize,
        dst_strides: Vec<usize>,
    },
    Gather {
        x: usize,
        idx: usize,
        axis: usize,
    },
    ScatterAdd {
        x: usize,
        idx: usize,
        u: usize,
        axis: usize,
    },
}

/// Kernels that loop over an axis of their operand.
pub(super) enum Reduction {
    Reduce {
        kind: rlx_ir::ReduceKind,
        src: usize,
        axes: Vec<usize>,
    },
    Softmax {
        src: usize,
        axis: usize,
    },
    Cumsum {
        src: usize,
        axis: usize,
    },
    TopK {
        x: usize,
        k: usize,
        indices: bool,
    },
}

/// Where a `norm_matmul` region's residual sum goes: its node's words, or a scratch request
/// where nothing outside the region reads it.
#[derive(Clone, Copy)]
pub(super) enum SumAt {
    Value(usize),
    Scratch(usize),
}

/// GGUF products and rows, and the KV cache.
pub(super) enum QuantKv {
    /// `x` rounded to int8 blocks of `blk` and back into arena request `to` (the product's
    /// activations, as the CPU rounds them).
    QuantizeActs { x: usize, to: usize, blk: u32 },
    DequantMatMul {
        x: usize,
        w: usize,
        scheme: rlx_ir::QuantScheme,
        /// The arena request holding the rounded activations, if the scheme rounds them.
        acts: Option<usize>,
        /// A `norm_matmul` region's RMSNorm: gamma and eps (`x` is the norm's operand).
        norm: Option<(usize, f32)>,
        /// Its residual add: the second operand and where the sum goes (`x` the first).
        add: Option<(usize, SumAt)>,
        /// The sum's node where it is the region's second result.
        extra: Vec<usize>,
    },
    DequantizeRows {
        w: usize,
        scheme: rlx_ir::QuantScheme,
    },
    CacheWrite {
        cache: usize,
        upd: usize,
        pos: usize,
    },
    /// A RoPE node's rotation written straight into the cache by the cache write computing
    /// this step's node (`crate::nn::rope_into_cache`).
    RopeIntoCache { rope: usize },
    /// Cached attention of a few query rows (decode) over a cache of at most
    /// `shaders::ATTENTION_STAGE` rows in one step, the scores in workgroup memory.
    DecodeAttention {
        q: usize,
        k: usize,
        v: usize,
        pos: usize,
        scale: f32,
        window: Option<usize>,
    },
    /// Cached attention in three steps over a scratch of `[S, Hq, T]` scores (arena request
    /// `scores`): `step` 0 the scaled scores (masked keys -inf), 1 the normalized weights in
    /// place, 2 the weighted values. Each invocation loops over one axis only: lavapipe ends a
    /// shader invocation's loops after 65535 iterations in all.
    CachedAttention {
        q: usize,
        k: usize,
        v: usize,
        pos: usize,
        scale: f32,
        window: Option<usize>,
        scores: usize,
        step: u8,
    },
}

impl Kernel {
    /// Further results of a fused region this kernel computes beside its node's.
    pub(super) fn extra(&self) -> &[usize] {
        match self {
            Kernel::Elementwise(Elementwise::Map { extra, .. }) => extra,
            Kernel::QuantKv(QuantKv::DequantMatMul { extra, .. }) => extra,
            _ => &[],
        }
    }
}

/// Length of axis `a` of value `x` of `g` (0 when symbolic).
pub(super) fn axis_len_in(g: &Graph, x: NodeId, a: usize) -> usize {
    g.shape(x).static_dims().map_or(0, |d| d[a])
}

pub(super) fn dims(g: &Graph, id: NodeId) -> Result<Vec<usize>> {
    g.shape(id).static_dims().ok_or_else(|| Error::Unsupported {
        backend: "wgpu".into(),
        op: g.node(id).op.name().into(),
        node: id,
        msg: format!(
            "shape {} has symbolic dimensions; bind them before compiling",
            g.shape(id)
        ),
    })
}

pub(super) fn dense_strides(d: &[usize]) -> Vec<usize> {
    let mut s = vec![1; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * d[i + 1];
    }
    s
}

/// `v` padded with zeros to `RANK` words.
pub(super) fn pad(v: &[usize]) -> Vec<u32> {
    let mut w: Vec<u32> = v.iter().map(|&x| x as u32).collect();
    w.resize(RANK, 0);
    w
}

/// Strides of an operand of dims `d` broadcast (numpy style) to `out` dims.
pub(super) fn broadcast_strides(d: &[usize], out: &[usize]) -> Vec<usize> {
    let s = dense_strides(d);
    let lead = out.len() - d.len();
    (0..out.len())
        .map(|i| {
            if i < lead || d[i - lead] == 1 {
                0
            } else {
                s[i - lead]
            }
        })
        .collect()
}
