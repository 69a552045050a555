//! The IR vocabulary: [`Op`] and the attribute types its variants carry.
//!
//! An op's rules (shape/dtype inference, decomposition) live in the family file under
//! [`crate::ops`]; this file only names the ops.

use crate::DType;
use serde::{Deserialize, Serialize};

/// Elementwise binary arithmetic. Operands share a dtype and broadcast like numpy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    /// `a + b` (integers wrap on overflow).
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`. Integer division truncates toward zero; an integer `x / 0` gives all bits set
    /// (-1 signed, MAX unsigned) and `MIN / -1` wraps, as in XLA, so no input traps.
    Div,
    /// Elementwise maximum.
    Max,
    /// Elementwise minimum.
    Min,
    /// `a ** b` (floats only).
    Pow,
}

/// Elementwise comparison producing `Bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// Elementwise unary functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Activation {
    /// `x * Φ(x)` with the exact normal CDF (erf).
    Gelu,
    /// The tanh approximation of GELU.
    GeluApprox,
    /// The derivative of [`Activation::GeluApprox`]: what its differentiation rules multiply a
    /// tangent or cotangent by, as one function (like PyTorch's `gelu_backward`) instead of a
    /// dozen elementwise ops.
    GeluApproxGrad,
    /// `x * sigmoid(x)`
    Silu,
    /// `max(x, 0)`
    Relu,
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// `e^x`
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`
    Rsqrt,
    /// `-x`
    Neg,
    /// `|x|`
    Abs,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Tangent.
    Tan,
    /// Arc tangent.
    Atan,
    /// Round half to even.
    Round,
    /// The error function.
    Erf,
}

impl Activation {
    /// Whether the function is defined on integer dtypes too.
    pub fn allows_int(self) -> bool {
        matches!(self, Activation::Neg | Activation::Abs | Activation::Relu)
    }
}

/// Reduction kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceKind {
    /// Sum (0 over an empty axis).
    Sum,
    /// Arithmetic mean (floats only).
    Mean,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Product (1 over an empty axis).
    Prod,
}

/// Which keys a query may attend to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MaskKind {
    /// Every key.
    None,
    /// Keys at or before the query's position. With `Sq < Sk` the queries are the last `Sq`
    /// positions (KV-cache decoding).
    Causal,
    /// Causal, and only the last `w` keys up to the query's position.
    SlidingWindow(usize),
    /// An additive mask given as a 4th input, broadcastable to `[B, H, Sq, Sk]`.
    Custom,
}

/// Dimension numbers of [`Op::DotGeneral`], as in `jax.lax.dot_general`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct DotDims {
    /// Contracting axes of the left operand.
    pub lhs_contract: Vec<usize>,
    /// Contracting axes of the right operand (paired with `lhs_contract`).
    pub rhs_contract: Vec<usize>,
    /// Batch axes of the left operand.
    pub lhs_batch: Vec<usize>,
    /// Batch axes of the right operand (paired with `lhs_batch`).
    pub rhs_batch: Vec<usize>,
}

/// Attributes of [`Op::Conv`] (channels-first: `x [N, C, ...]`, `w [O, C/groups, ...]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvAttrs {
    /// Stride per spatial axis.
    pub stride: Vec<usize>,
    /// `(low, high)` zero padding per spatial axis.
    pub padding: Vec<(usize, usize)>,
    /// Kernel dilation per spatial axis.
    pub dilation: Vec<usize>,
    /// Feature groups (`C` and `O` divisible by it).
    pub groups: usize,
}

/// Pooling reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PoolKind {
    /// Maximum over the window (padding never wins).
    Max,
    /// Mean over the window's non-padding elements.
    Mean,
}

/// Attributes of [`Op::Pool`] (channels-first).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolAttrs {
    /// Reduction.
    pub kind: PoolKind,
    /// Window size per spatial axis.
    pub kernel: Vec<usize>,
    /// Stride per spatial axis.
    pub stride: Vec<usize>,
    /// `(low, high)` padding per spatial axis.
    pub padding: Vec<(usize, usize)>,
}

/// Which result of a top-k a [`Op::TopK`] node yields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TopKOutput {
    /// The k largest values, descending.
    Values,
    /// Their positions (I32), lower index first among ties.
    Indices,
}

/// An operation of the RLX IR. Each node holds one op, its operand ids and its result shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// A value fed at every `run`.
    Input {
        /// Name used by `run`.
        name: String,
    },
    /// A weight set once with `set_param`.
    Param {
        /// Name used by `set_param`.
        name: String,
    },
    /// A literal; `data` holds the little-endian elements of the node's dtype.
    Constant {
        /// Raw bytes.
        data: Vec<u8>,
    },
    /// Elementwise arithmetic with broadcasting.
    Binary(BinaryOp),
    /// Elementwise comparison with broadcasting, producing Bool.
    Compare(CmpOp),
    /// `where(cond, a, b)` with broadcasting.
    Where,
    /// Elementwise unary function.
    Activation(Activation),
    /// Convert to another dtype (floats to ints truncate toward zero; to Bool is `!= 0`).
    Cast {
        /// Target dtype.
        to: DType,
    },
    /// Batched matrix product `[..., m, k] x [..., k, n]` with broadcast batch axes.
    MatMul,
    /// General tensor contraction with JAX dimension numbers.
    DotGeneral(DotDims),
    /// Reduce over `axes`.
    Reduce {
        /// Reduction kind.
        kind: ReduceKind,
        /// Sorted, distinct axes.
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keepdims: bool,
    },
    /// Numerically stable softmax along `axis`.
    Softmax {
        /// Axis.
        axis: usize,
    },
    /// `(x - mean) / sqrt(var + eps) * gamma + beta` over the last axis.
    LayerNorm {
        /// Variance epsilon.
        eps: f32,
    },
    /// `x / sqrt(mean(x^2) + eps) * gamma` over the last axis.
    RmsNorm {
        /// Epsilon.
        eps: f32,
    },
    /// Same elements, new static shape.
    Reshape {
        /// Target dimensions.
        shape: Vec<usize>,
    },
    /// Permute axes: output axis `i` is input axis `perm[i]`.
    Transpose {
        /// Permutation.
        perm: Vec<usize>,
    },
    /// Slice `[start, start + len)` along `axis`.
    Narrow {
        /// Axis.
        axis: usize,
        /// First index.
        start: usize,
        /// Length.
        len: usize,
    },
    /// Join operands along `axis`.
    Concat {
        /// Axis.
        axis: usize,
    },
    /// Broadcast to `shape` (numpy `broadcast_to`).
    Expand {
        /// Target dimensions.
        shape: Vec<usize>,
    },
    /// `take(x, indices, axis)`.
    Gather {
        /// Axis of `x` indexed.
        axis: usize,
    },
    /// `x` plus `updates` added at rows `indices` along `axis` (duplicates accumulate).
    ScatterAdd {
        /// Axis.
        axis: usize,
    },
    /// Inclusive cumulative sum along `axis`.
    Cumsum {
        /// Axis.
        axis: usize,
    },
    /// k largest along the last axis.
    TopK {
        /// How many.
        k: usize,
        /// Values or indices.
        output: TopKOutput,
    },
    /// Scaled dot-product attention, grouped-query aware: `q [B,Hq,Sq,D]`, `k [B,Hkv,Sk,D]`,
    /// `v [B,Hkv,Sk,Dv]` (+ an additive mask input for [`MaskKind::Custom`]).
    Attention {
        /// Mask kind.
        mask: MaskKind,
        /// Score scale, usually `1/sqrt(D)`.
        scale: f32,
    },
    /// Rotary position embedding of `x [..., S, D]` at `positions [S]`.
    Rope {
        /// Frequency base.
        theta: f32,
        /// Rotate pairs `(2i, 2i+1)` instead of `(i, i + D/2)`.
        interleaved: bool,
    },
    /// 1-d or 2-d convolution, channels first.
    Conv(ConvAttrs),
    /// 1-d or 2-d max / mean pooling, channels first.
    Pool(PoolAttrs),
    /// A user function with optional custom derivatives; see [`CustomFn`].
    Custom(CustomFn),
    /// `x [..., K]` times the transpose of a quantized weight holding `N` rows of `K`:
    /// result `[..., N]`. GGUF schemes take `(x, packed U8 [N, row_bytes])`; the others take
    /// `(x, quants, scale, zero_point)` with quants `I8 [N, K]` (Int8), `U8 [N, K/2]` (Int4) or
    /// `U8 [N, K]` (FP8), and f32 scale / zero point `[N, K/block_size]` (`[1]` for FP8; the
    /// zero point is ignored by symmetric schemes).
    DequantMatMul {
        /// Weight layout.
        scheme: crate::QuantScheme,
    },
    /// Packed GGUF rows `U8 [..., row_bytes]` decoded to `F32 [..., K]` (e.g. an embedding
    /// lookup of a quantized table: gather rows, then dequantize).
    Dequantize {
        /// Row layout (a GGUF scheme).
        scheme: crate::QuantScheme,
    },
    /// `(cache [T, ...], update [S, ...], pos I32 [1])`: the cache with rows `[pos, pos + S)`
    /// replaced. `cache` must be a param used only here: backends update it in place, which is
    /// what makes a KV cache persist from one run to the next.
    CacheWrite,
    /// Causal attention of new queries over a KV cache: `(q [S, Hq, D], k [T, Hkv, D],
    /// v [T, Hkv, Dv], pos I32 [1]) -> [S, Hq, Dv]`. Query `i` is at position `pos + i` and
    /// attends to cache rows `j <= pos + i` (and `j > pos + i - window` with a sliding window);
    /// rows past `pos + S` are never read. Heads are grouped as in [`Op::Attention`].
    CachedAttention {
        /// Score scale.
        scale: f32,
        /// Sliding-window length, if any.
        window: Option<usize>,
    },
}

/// A function given as a graph, usable as one op. The body's `Input` nodes, in definition order,
/// are the arguments and its first output is the result. Backends run the inlined body;
/// autodiff uses the optional derivative graphs instead of differentiating the body:
/// - `vjp`: inputs `(args..., result, cotangent)`, one output per argument (its cotangent);
/// - `jvp`: inputs `(args..., tangents...)`, one output (the result's tangent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CustomFn {
    /// A name for printing and errors.
    pub name: String,
    /// The function.
    pub body: Box<crate::Graph>,
    /// Custom reverse-mode rule.
    pub vjp: Option<Box<crate::Graph>>,
    /// Custom forward-mode rule.
    pub jvp: Option<Box<crate::Graph>>,
}

impl Op {
    /// Short lowercase name used in errors and the printer.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Param { .. } => "param",
            Op::Constant { .. } => "constant",
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Max => "max",
                BinaryOp::Min => "min",
                BinaryOp::Pow => "pow",
            },
            Op::Compare(c) => match c {
                CmpOp::Eq => "eq",
                CmpOp::Ne => "ne",
                CmpOp::Lt => "lt",
                CmpOp::Le => "le",
                CmpOp::Gt => "gt",
                CmpOp::Ge => "ge",
            },
            Op::Where => "where",
            Op::Activation(a) => match a {
                Activation::Gelu => "gelu",
                Activation::GeluApprox => "gelu_approx",
                Activation::GeluApproxGrad => "gelu_approx_grad",
                Activation::Silu => "silu",
                Activation::Relu => "relu",
                Activation::Sigmoid => "sigmoid",
                Activation::Tanh => "tanh",
                Activation::Exp => "exp",
                Activation::Log => "log",
                Activation::Sqrt => "sqrt",
                Activation::Rsqrt => "rsqrt",
                Activation::Neg => "neg",
                Activation::Abs => "abs",
                Activation::Sin => "sin",
                Activation::Cos => "cos",
                Activation::Tan => "tan",
                Activation::Atan => "atan",
                Activation::Round => "round",
                Activation::Erf => "erf",
            },
            Op::Cast { .. } => "cast",
            Op::MatMul => "matmul",
            Op::DotGeneral(_) => "dot_general",
            Op::Reduce { .. } => "reduce",
            Op::Softmax { .. } => "softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Narrow { .. } => "narrow",
            Op::Concat { .. } => "concat",
            Op::Expand { .. } => "expand",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Cumsum { .. } => "cumsum",
            Op::TopK { .. } => "topk",
            Op::Attention { .. } => "attention",
            Op::Rope { .. } => "rope",
            Op::Conv(_) => "conv",
            Op::Pool(_) => "pool",
            Op::Custom(_) => "custom",
            Op::DequantMatMul { .. } => "dequant_matmul",
            Op::Dequantize { .. } => "dequantize",
            Op::CacheWrite => "cache_write",
            Op::CachedAttention { .. } => "cached_attention",
        }
    }

    /// Leaves have no operands and carry their shape themselves.
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Input { .. } | Op::Param { .. } | Op::Constant { .. })
    }
}
