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
        /// Raw bytes (in JSON a hex string; an array of byte values is read too).
        #[serde(with = "crate::hex")]
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
    DequantizeRows {
        /// Row layout (a GGUF scheme).
        scheme: crate::QuantScheme,
    },
    /// `(cache [T, ...], update [S, ...], pos I32 [1])`: the cache with rows `[pos, pos + S)`
    /// replaced. With `slots I32 [S]` in place of `pos` (a paged cache), update row `i` goes to
    /// cache row `slots[i]` instead (the two forms agree when `S = 1`); rows outside the cache
    /// are dropped. `cache` must be a param used only here: backends update it in place, which is
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
    /// Attention over a paged KV cache, for many sequences in one batch:
    /// `(q [S, Hq, D], k [R, Hkv, D], v [R, Hkv, Dv], pos I32 [S], table I32 [S, M]) ->
    /// [S, Hq, Dv]`. The cache is a pool of blocks of `block` rows (`R` a multiple of `block`).
    /// Query `i` sits at position `pos[i]` of its sequence, whose position `j` is cache row
    /// `table[i, j / block] * block + j % block`; it attends to positions `j <= pos[i]` (and
    /// `j > pos[i] - window` with a sliding window), exactly as [`Op::CachedAttention`] over
    /// that sequence's rows laid end to end. Positions in a block outside the pool are skipped;
    /// a query that sees no position gives zeros.
    PagedAttention {
        /// Score scale.
        scale: f32,
        /// Sliding-window length, if any.
        window: Option<usize>,
        /// Rows per cache block.
        block: usize,
    },
    /// A fused region made by a fusion pass; see [`FusedRegion`].
    Fused(FusedRegion),
    /// An op defined in one file by an [`OpDef`](crate::ops::OpDef) (all its rules are
    /// methods), e.g. the affine int8 ops [`Quantize`](crate::ops::Quantize),
    /// [`Dequantize`](crate::ops::Dequantize) and [`FakeQuantize`](crate::ops::FakeQuantize).
    Defined(crate::ops::DefinedOp),
}

/// What a fused region computes; a backend that has a kernel for a kind runs the region as one
/// step, any other inlines its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FusionKind {
    /// A chain of elementwise, broadcast and cast ops over one iteration space.
    Elementwise,
    /// A matmul followed by elementwise work on its result (bias, activation).
    MatMulEpilogue,
    /// A residual add followed by RMSNorm or LayerNorm.
    ResidualNorm,
    /// `act(x W_gate) * (x W_up)`: SwiGLU (SiLU) or GeGLU (GELU).
    GatedMlp,
    /// Scores, mask, softmax and the weighted sum of one attention block.
    Attention,
    /// An RMSNorm read only by a product, with the residual add it normalizes where there is
    /// one (its sum the region's second result): a decode kernel normalizes the activations it
    /// stages instead of reading them normalized.
    NormMatMul,
    /// An optimizer's per-parameter update (SGD, Adam, AdamW).
    Optimizer,
    /// Elementwise work feeding a reduction (softmax and norm backward).
    MultiplyReduce,
}

impl FusionKind {
    /// Every kind.
    pub const ALL: [FusionKind; 8] = [
        FusionKind::Elementwise,
        FusionKind::MatMulEpilogue,
        FusionKind::ResidualNorm,
        FusionKind::GatedMlp,
        FusionKind::Attention,
        FusionKind::NormMatMul,
        FusionKind::Optimizer,
        FusionKind::MultiplyReduce,
    ];

    /// The kind's name in the text form and reports.
    pub fn name(self) -> &'static str {
        match self {
            FusionKind::Elementwise => "elementwise",
            FusionKind::MatMulEpilogue => "matmul_epilogue",
            FusionKind::ResidualNorm => "residual_norm",
            FusionKind::GatedMlp => "gated_mlp",
            FusionKind::Attention => "attention",
            FusionKind::NormMatMul => "norm_matmul",
            FusionKind::Optimizer => "optimizer",
            FusionKind::MultiplyReduce => "multiply_reduce",
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<FusionKind> {
        FusionKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A fused region: its kind and its body, a graph in ordinary ops whose `Input` nodes (in
/// definition order) are the operands and whose output number `output` is the node's result.
/// The body is the region's meaning: the evaluator, autodiff, vmap and every backend without a
/// kernel for the kind use it (MLX's `fast::Custom` fallback).
///
/// A region with several results (an optimizer's new param beside its new moments, a normalized
/// value beside its scaled one) is one node per result, as [`Op::TopK`] is, each a complete op
/// (the evaluator, autodiff and a backend without the kernel can compute any one alone): the
/// nodes share kind, body, operands and `region`, differ in `output`, and the first result's
/// node comes before the others (the verifier checks all of it). A backend with a kernel for
/// the kind computes them in the first result's step ([`crate::Graph::fused_results`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FusedRegion {
    /// What the region computes.
    pub kind: FusionKind,
    /// The region as a graph.
    pub body: Box<crate::Graph>,
    /// Which of the body's outputs this node yields.
    pub output: usize,
    /// The region's identity in its graph when it has several result nodes (one id per region,
    /// shared by its result nodes); `None` for a region whose node is its only one.
    #[serde(default)]
    pub region: Option<u32>,
}

impl FusedRegion {
    /// The ops of the body, in order (inputs and constants left out): what the region computes,
    /// for reports and pictures.
    pub fn op_names(&self) -> Vec<&'static str> {
        self.body
            .nodes()
            .iter()
            .filter(|b| !b.op.is_leaf())
            .map(|b| b.op.name())
            .collect()
    }
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

/// Declares [`OpKind`] and its list of every kind from one table, so the list cannot miss one.
macro_rules! op_kinds {
    ($($(#[$m:meta])* $kind:ident = $name:literal,)*) => {
        /// Every op of the IR, one kind per name (each binary, compare and activation function
        /// counts on its own). [`OpKind::all`] enumerates them, so tables that must cover every
        /// op (the op test table, a backend's support list) can check themselves.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind {
            $($(#[$m])* $kind,)*
            /// An op defined by an [`OpDef`](crate::ops::OpDef), by its registered name.
            Defined(&'static str),
        }

        impl OpKind {
            /// The kinds of the IR's own variants, in declaration order (without the
            /// [`OpKind::Defined`] ones; [`OpKind::all`] has both).
            pub const BUILTIN: &'static [OpKind] = &[$(OpKind::$kind,)*];

            /// The op's lowercase name, as printed and parsed.
            pub fn name(self) -> &'static str {
                match self {
                    $(OpKind::$kind => $name,)*
                    OpKind::Defined(name) => name,
                }
            }
        }
    };
}

impl OpKind {
    /// Every kind: the IR's own, then each registered defined op.
    pub fn all() -> Vec<OpKind> {
        let defined = crate::ops::registrations()
            .into_iter()
            .map(|r| OpKind::Defined(r.name));
        OpKind::BUILTIN.iter().copied().chain(defined).collect()
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::BUILTIN
            .iter()
            .copied()
            .find(|k| k.name() == name)
            .or_else(|| crate::ops::registration(name).map(|r| OpKind::Defined(r.name)))
    }
}

/// Kinds serialize as their names (`"matmul"`, `"quantize"`).
impl Serialize for OpKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for OpKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        OpKind::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown op `{name}`")))
    }
}

op_kinds! {
    /// `input`
    Input = "input",
    /// `param`
    Param = "param",
    /// `constant`
    Constant = "constant",
    /// `add`
    Add = "add",
    /// `sub`
    Sub = "sub",
    /// `mul`
    Mul = "mul",
    /// `div`
    Div = "div",
    /// `max`
    Max = "max",
    /// `min`
    Min = "min",
    /// `pow`
    Pow = "pow",
    /// `eq`
    Eq = "eq",
    /// `ne`
    Ne = "ne",
    /// `lt`
    Lt = "lt",
    /// `le`
    Le = "le",
    /// `gt`
    Gt = "gt",
    /// `ge`
    Ge = "ge",
    /// `where`
    Where = "where",
    /// `gelu`
    Gelu = "gelu",
    /// `gelu_approx`
    GeluApprox = "gelu_approx",
    /// `gelu_approx_grad`
    GeluApproxGrad = "gelu_approx_grad",
    /// `silu`
    Silu = "silu",
    /// `relu`
    Relu = "relu",
    /// `sigmoid`
    Sigmoid = "sigmoid",
    /// `tanh`
    Tanh = "tanh",
    /// `exp`
    Exp = "exp",
    /// `log`
    Log = "log",
    /// `sqrt`
    Sqrt = "sqrt",
    /// `rsqrt`
    Rsqrt = "rsqrt",
    /// `neg`
    Neg = "neg",
    /// `abs`
    Abs = "abs",
    /// `sin`
    Sin = "sin",
    /// `cos`
    Cos = "cos",
    /// `tan`
    Tan = "tan",
    /// `atan`
    Atan = "atan",
    /// `round`
    Round = "round",
    /// `erf`
    Erf = "erf",
    /// `cast`
    Cast = "cast",
    /// `matmul`
    MatMul = "matmul",
    /// `dot_general`
    DotGeneral = "dot_general",
    /// `reduce`
    Reduce = "reduce",
    /// `softmax`
    Softmax = "softmax",
    /// `layer_norm`
    LayerNorm = "layer_norm",
    /// `rms_norm`
    RmsNorm = "rms_norm",
    /// `reshape`
    Reshape = "reshape",
    /// `transpose`
    Transpose = "transpose",
    /// `narrow`
    Narrow = "narrow",
    /// `concat`
    Concat = "concat",
    /// `expand`
    Expand = "expand",
    /// `gather`
    Gather = "gather",
    /// `scatter_add`
    ScatterAdd = "scatter_add",
    /// `cumsum`
    Cumsum = "cumsum",
    /// `topk`
    TopK = "topk",
    /// `attention`
    Attention = "attention",
    /// `rope`
    Rope = "rope",
    /// `conv`
    Conv = "conv",
    /// `pool`
    Pool = "pool",
    /// `custom`
    Custom = "custom",
    /// `dequant_matmul`
    DequantMatMul = "dequant_matmul",
    /// `dequantize`
    DequantizeRows = "dequantize_rows",
    /// `cache_write`
    CacheWrite = "cache_write",
    /// `cached_attention`
    CachedAttention = "cached_attention",
    /// `paged_attention`
    PagedAttention = "paged_attention",
    /// `fused`
    Fused = "fused",
}

impl Op {
    /// The op defined by `def` ([`Op::Defined`]), e.g. `Op::defined(Quantize { axis: None })`.
    pub fn defined(def: impl crate::ops::OpDef) -> Op {
        Op::Defined(crate::ops::DefinedOp::new(def))
    }

    /// The op's kind (its name without attributes).
    pub fn kind(&self) -> OpKind {
        use OpKind as K;
        match self {
            Op::Input { .. } => K::Input,
            Op::Param { .. } => K::Param,
            Op::Constant { .. } => K::Constant,
            Op::Binary(b) => match b {
                BinaryOp::Add => K::Add,
                BinaryOp::Sub => K::Sub,
                BinaryOp::Mul => K::Mul,
                BinaryOp::Div => K::Div,
                BinaryOp::Max => K::Max,
                BinaryOp::Min => K::Min,
                BinaryOp::Pow => K::Pow,
            },
            Op::Compare(c) => match c {
                CmpOp::Eq => K::Eq,
                CmpOp::Ne => K::Ne,
                CmpOp::Lt => K::Lt,
                CmpOp::Le => K::Le,
                CmpOp::Gt => K::Gt,
                CmpOp::Ge => K::Ge,
            },
            Op::Where => K::Where,
            Op::Activation(a) => match a {
                Activation::Gelu => K::Gelu,
                Activation::GeluApprox => K::GeluApprox,
                Activation::GeluApproxGrad => K::GeluApproxGrad,
                Activation::Silu => K::Silu,
                Activation::Relu => K::Relu,
                Activation::Sigmoid => K::Sigmoid,
                Activation::Tanh => K::Tanh,
                Activation::Exp => K::Exp,
                Activation::Log => K::Log,
                Activation::Sqrt => K::Sqrt,
                Activation::Rsqrt => K::Rsqrt,
                Activation::Neg => K::Neg,
                Activation::Abs => K::Abs,
                Activation::Sin => K::Sin,
                Activation::Cos => K::Cos,
                Activation::Tan => K::Tan,
                Activation::Atan => K::Atan,
                Activation::Round => K::Round,
                Activation::Erf => K::Erf,
            },
            Op::Cast { .. } => K::Cast,
            Op::MatMul => K::MatMul,
            Op::DotGeneral(_) => K::DotGeneral,
            Op::Reduce { .. } => K::Reduce,
            Op::Softmax { .. } => K::Softmax,
            Op::LayerNorm { .. } => K::LayerNorm,
            Op::RmsNorm { .. } => K::RmsNorm,
            Op::Reshape { .. } => K::Reshape,
            Op::Transpose { .. } => K::Transpose,
            Op::Narrow { .. } => K::Narrow,
            Op::Concat { .. } => K::Concat,
            Op::Expand { .. } => K::Expand,
            Op::Gather { .. } => K::Gather,
            Op::ScatterAdd { .. } => K::ScatterAdd,
            Op::Cumsum { .. } => K::Cumsum,
            Op::TopK { .. } => K::TopK,
            Op::Attention { .. } => K::Attention,
            Op::Rope { .. } => K::Rope,
            Op::Conv(_) => K::Conv,
            Op::Pool(_) => K::Pool,
            Op::Custom(_) => K::Custom,
            Op::DequantMatMul { .. } => K::DequantMatMul,
            Op::DequantizeRows { .. } => K::DequantizeRows,
            Op::CacheWrite => K::CacheWrite,
            Op::CachedAttention { .. } => K::CachedAttention,
            Op::PagedAttention { .. } => K::PagedAttention,
            Op::Fused(_) => K::Fused,
            Op::Defined(d) => K::Defined(d.name()),
        }
    }

    /// Short lowercase name used in errors and the printer.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The name of a backend's step for this op in programs and profiles: [`Op::name`], but a
    /// fused region other than an elementwise one is named by its kind (`norm_matmul`,
    /// `multiply_reduce`, ...).
    pub fn step_name(&self) -> &'static str {
        match self {
            Op::Fused(r) if r.kind != FusionKind::Elementwise => r.kind.name(),
            op => op.name(),
        }
    }

    /// Leaves have no operands and carry their shape themselves.
    pub fn is_leaf(&self) -> bool {
        matches!(
            self,
            Op::Input { .. } | Op::Param { .. } | Op::Constant { .. }
        )
    }
}
