//! Op rules, one file per op family.
//!
//! Each family file owns every rule of its ops: shape/dtype inference, the reference evaluator,
//! cost, decomposition, derivatives, batching and text-form attributes. This module only
//! dispatches to them. The IR's own ops are variants of [`crate::Op`]; an op can also be defined
//! in one file as an [`OpDef`] and listed in the registry ([`registrations`]), which is all it
//! takes to add it (see `quantize.rs`, `dequantize.rs`, `fake_quantize.rs`).

mod ad;
mod batch;
pub mod blocks;
pub mod complex;
mod cond;
mod custom;
mod def;
mod dequantize;
mod elementwise;
mod fake_quantize;
mod fft;
mod fused;
mod index;
mod kv;
mod linalg;
mod loops;
mod movement;
mod nn;
mod qint;
mod quant;
mod quantize;
mod reduce;
mod selective_scan;
mod spatial;

pub use batch::{batch, batch_supported, materialize as batch_materialize, Batched};
pub use blocks::{Embedding, Linear, Mlp, QuantLinear, TransformerBlock};
pub use complex::{Complex, Imag, Real};
pub use cond::If;
pub use def::{register, registration, registrations, DefinedOp, OpClass, OpDef, OpRegistration};
pub use dequantize::Dequantize;
pub use fake_quantize::FakeQuantize;
pub use fft::{Fft, FftKind};
pub use loops::{Scan, While};
pub use qint::{window as pool_window, QAdd, QConv2d, QLinear, QOut, QPool, QADD_LEFT_SHIFT};
pub use quantize::Quantize;
pub use selective_scan::SelectiveScan;

/// The ops defined in one file each ([`OpDef`]): adding one is its file plus one line here.
const DEFINED: &[OpRegistration] = &[
    quantize::OP,
    dequantize::OP,
    fake_quantize::OP,
    blocks::LINEAR,
    blocks::QUANT_LINEAR,
    blocks::EMBEDDING,
    blocks::MLP,
    blocks::TRANSFORMER_BLOCK,
    cond::OP,
    loops::WHILE,
    loops::SCAN,
    selective_scan::OP,
    complex::COMPLEX,
    complex::REAL,
    complex::IMAG,
    fft::OP,
    qint::QLINEAR,
    qint::QCONV2D,
    qint::QADD,
    qint::QPOOL,
];

use crate::{Dim, Error, Graph, NodeId, Op, Result, Shape};

/// Infer the result shape of `op` applied to operands of shapes `inputs`.
///
/// Leaves (`Input`, `Param`, `Constant`) carry their own shape and are rejected here.
pub fn infer(op: &Op, inputs: &[&Shape]) -> Result<Shape> {
    let arity = expected_arity(op);
    if let Some((lo, hi)) = arity {
        if inputs.len() < lo || inputs.len() > hi {
            let want = match (lo, hi) {
                _ if lo == hi => format!("{lo}"),
                (_, usize::MAX) => format!("at least {lo}"),
                _ => format!("{lo} to {hi}"),
            };
            return Err(Error::op(
                op.name(),
                format!("takes {want} operands, got {}", inputs.len()),
            ));
        }
    }
    // JSON cannot hold NaN or infinities, so such attributes would not round-trip.
    let float_attr = match op {
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => Some(("eps", *eps)),
        Op::Attention { scale, .. } => Some(("scale", *scale)),
        Op::Rope { theta, .. } => Some(("theta", *theta)),
        Op::CachedAttention { scale, .. } | Op::PagedAttention { scale, .. } => {
            Some(("scale", *scale))
        }
        _ => None,
    };
    if let Some((what, v)) = float_attr.filter(|(_, v)| !v.is_finite()) {
        return Err(Error::op(
            op.name(),
            format!("{what} must be finite, got {v}"),
        ));
    }
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => Err(Error::op(
            op.name(),
            "leaves carry their own shape; nothing to infer",
        )),
        Op::Binary(b) => elementwise::binary(*b, inputs),
        Op::Compare(_) => elementwise::compare(op, inputs),
        Op::Where => elementwise::select(inputs),
        Op::Activation(a) => elementwise::activation(*a, inputs[0]),
        Op::Cast { to } => Ok(inputs[0].with_dtype(*to)),
        Op::MatMul => linalg::matmul(inputs),
        Op::DotGeneral(d) => linalg::dot_general(d, inputs),
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => reduce::reduce(*kind, axes, *keepdims, inputs[0]),
        Op::Softmax { axis } => reduce::softmax(*axis, inputs[0]),
        Op::Cumsum { axis } => reduce::cumsum(*axis, inputs[0]),
        Op::TopK { k, output } => reduce::topk(*k, *output, inputs[0]),
        Op::LayerNorm { .. } => nn::layer_norm(inputs),
        Op::RmsNorm { .. } => nn::rms_norm(inputs),
        Op::Attention { mask, .. } => nn::attention(*mask, inputs),
        Op::Rope { .. } => nn::rope(inputs),
        Op::Reshape { shape } => movement::reshape(shape, inputs[0]),
        Op::Transpose { perm } => movement::transpose(perm, inputs[0]),
        Op::Narrow { axis, start, len } => movement::narrow(*axis, *start, *len, inputs[0]),
        Op::Concat { axis } => movement::concat(*axis, inputs),
        Op::Expand { shape } => movement::expand(shape, inputs[0]),
        Op::Gather { axis } => index::gather(*axis, inputs),
        Op::ScatterAdd { axis } => index::scatter_add(*axis, inputs),
        Op::Conv(a) => spatial::conv(a, inputs),
        Op::Pool(a) => spatial::pool(a, inputs),
        Op::Custom(f) => custom::infer(f, inputs),
        Op::DequantMatMul { scheme } => quant::dequant_matmul(*scheme, inputs),
        Op::DequantizeRows { scheme } => quant::dequantize(*scheme, inputs),
        Op::CacheWrite => kv::cache_write(inputs),
        Op::CachedAttention { window, .. } => kv::cached_attention(*window, inputs),
        Op::PagedAttention { window, block, .. } => kv::paged_attention(*window, *block, inputs),
        Op::Fused(r) => fused::infer(r, inputs),
        Op::Defined(d) => d.def().infer(inputs),
    }
}

/// Evaluate `op` on host values `ins` (the reference evaluator's rule; see [`crate::eval`]).
/// `out` is the result shape shape inference gave. Composites without a rule of their own are
/// evaluated through their decomposition.
pub fn eval(op: &Op, ins: &[&crate::eval::Tensor], out: &Shape) -> Result<crate::eval::Tensor> {
    use crate::eval::through_decomposition as decomposed;
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => Err(Error::op(
            op.name(),
            "leaves are given to the evaluator, not computed",
        )),
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Cast { .. } => {
            elementwise::eval(op, ins, out)
        }
        Op::MatMul => linalg::eval_matmul(ins, out),
        Op::Reduce { .. } | Op::Softmax { .. } | Op::Cumsum { .. } | Op::TopK { .. } => {
            reduce::eval(op, ins, out)
        }
        Op::LayerNorm { eps } => nn::eval_norm(ins, out, *eps, false),
        Op::RmsNorm { eps } => nn::eval_norm(ins, out, *eps, true),
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. } => movement::eval(op, ins, out),
        Op::Gather { .. } | Op::ScatterAdd { .. } => index::eval(op, ins, out),
        Op::DequantMatMul { scheme } if scheme.is_gguf() => {
            quant::eval_dequant_matmul(*scheme, ins, out)
        }
        Op::DequantizeRows { scheme } => quant::eval_dequantize(*scheme, ins, out),
        Op::Defined(d) => d.def().eval(ins, out),
        Op::CacheWrite => kv::eval_cache_write(ins, out),
        Op::CachedAttention { scale, window } => {
            kv::eval_cached_attention(ins, out, *scale, *window)
        }
        Op::PagedAttention {
            scale,
            window,
            block,
        } => kv::eval_paged_attention(ins, out, *scale, *window, *block),
        Op::DotGeneral(_)
        | Op::Attention { .. }
        | Op::Rope { .. }
        | Op::Conv(_)
        | Op::Pool(_)
        | Op::Custom(_)
        | Op::Fused(_)
        | Op::DequantMatMul { .. } => decomposed(op, ins),
    }
}

/// An op's estimated work: arithmetic operations and bytes moved to and from memory (each
/// operand read once, the result written once, unless the op says otherwise). Fusion and the
/// reports use it to compare alternatives; it is an estimate, not a measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cost {
    /// Arithmetic operations (a multiply-add counts two).
    pub flops: u64,
    /// Bytes read and written.
    pub bytes: u64,
}

impl Cost {
    /// `per` operations per result element, every operand read and the result written.
    pub fn streaming(ins: &[&Shape], out: &Shape, per: u64) -> Cost {
        Cost {
            flops: per * numel(out),
            bytes: bytes(out),
        }
        .with_reads(ins, 0)
    }

    /// The same cost with `flops` operations.
    pub fn with_flops(self, flops: u64) -> Cost {
        Cost { flops, ..self }
    }

    /// The cost plus reading every operand of `ins` and `flops` more operations.
    pub fn with_reads(self, ins: &[&Shape], flops: u64) -> Cost {
        Cost {
            flops: self.flops + flops,
            bytes: self.bytes + ins.iter().map(|s| bytes(s)).sum::<u64>(),
        }
    }
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            flops: self.flops + o.flops,
            bytes: self.bytes + o.bytes,
        }
    }
}

/// Elements of a shape (symbolic dimensions count as 1).
pub(crate) fn numel(s: &Shape) -> u64 {
    s.dims()
        .iter()
        .map(|d| d.as_static().unwrap_or(1) as u64)
        .product()
}

/// Bytes of a shape's elements.
pub(crate) fn bytes(s: &Shape) -> u64 {
    numel(s) * s.dtype().size_bytes() as u64
}

/// The estimated cost of `op` with operands `ins` and result `out` (leaves cost nothing).
pub fn cost(op: &Op, ins: &[&Shape], out: &Shape) -> Cost {
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => Cost::default(),
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Cast { .. } => {
            elementwise::cost(op, ins, out)
        }
        Op::MatMul => linalg::cost_matmul(ins, out),
        Op::DotGeneral(d) => linalg::cost_dot_general(d, ins, out),
        Op::Reduce { .. } | Op::Softmax { .. } | Op::Cumsum { .. } | Op::TopK { .. } => {
            reduce::cost(op, ins, out)
        }
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Attention { .. } | Op::Rope { .. } => {
            nn::cost(op, ins, out)
        }
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. } => movement::cost(op, ins, out),
        Op::Gather { .. } | Op::ScatterAdd { .. } => index::cost(op, ins, out),
        Op::Conv(_) | Op::Pool(_) => spatial::cost(op, ins, out),
        Op::Custom(f) => custom::cost(f),
        Op::DequantMatMul { .. } | Op::DequantizeRows { .. } => quant::cost(op, ins, out),
        Op::Defined(d) => d.def().cost(ins, out),
        Op::CacheWrite | Op::CachedAttention { .. } | Op::PagedAttention { .. } => {
            kv::cost(op, ins, out)
        }
        Op::Fused(r) => fused::cost(r, ins, out),
    }
}

/// The summed [`cost`] of every node of `g`.
pub fn graph_cost(g: &Graph) -> Cost {
    g.ids()
        .map(|id| {
            let n = g.node(id);
            let ins: Vec<&Shape> = n.inputs.iter().map(|&i| g.shape(i)).collect();
            cost(&n.op, &ins, &n.shape)
        })
        .fold(Cost::default(), |a, b| a + b)
}

/// Operand count bounds `(min, max)`; `None` for leaves.
pub fn expected_arity(op: &Op) -> Option<(usize, usize)> {
    Some(match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => (0, 0),
        Op::Binary(_) | Op::Compare(_) | Op::MatMul | Op::DotGeneral(_) => (2, 2),
        Op::Where | Op::LayerNorm { .. } | Op::ScatterAdd { .. } => (3, 3),
        Op::Defined(d) => d.def().arity(),
        Op::RmsNorm { .. } | Op::Gather { .. } | Op::Rope { .. } | Op::Conv(_) => (2, 2),
        Op::Attention { mask, .. } => {
            if matches!(mask, crate::MaskKind::Custom) {
                (4, 4)
            } else {
                (3, 3)
            }
        }
        Op::Concat { .. } => (1, usize::MAX),
        Op::DequantMatMul { scheme } => {
            let n = quant::arity(*scheme);
            (n, n)
        }
        Op::CacheWrite => (3, 3),
        Op::CachedAttention { .. } => (4, 4),
        Op::PagedAttention { .. } => (5, 5),
        Op::Custom(f) => {
            let n = custom::arity(f);
            (n, n)
        }
        Op::Fused(r) => {
            let n = fused::arity(r);
            (n, n)
        }
        Op::Activation(_)
        | Op::Cast { .. }
        | Op::Reduce { .. }
        | Op::Softmax { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Expand { .. }
        | Op::Cumsum { .. }
        | Op::TopK { .. }
        | Op::Pool(_)
        | Op::DequantizeRows { .. } => (1, 1),
    })
}

/// Rewrite `op` applied to `inputs` (nodes of `g`) into simpler ops appended to `g`.
///
/// Returns `None` for ops that are primitive. Backends that lack a kernel for a composite op get
/// this decomposition instead. An op over complex values ([`complex::splits`]) decomposes into
/// its complex form: real ops on the real and imaginary parts.
pub fn decompose(g: &mut Graph, op: &Op, inputs: &[NodeId]) -> Option<Result<NodeId>> {
    let dtypes: Vec<crate::DType> = inputs.iter().map(|&i| g.shape(i).dtype()).collect();
    if complex::splits(op, &dtypes) {
        return Some(complex::split(g, op, inputs));
    }
    Some(match op {
        Op::DotGeneral(d) => linalg::decompose_dot_general(g, d, inputs[0], inputs[1]),
        Op::LayerNorm { eps } => nn::decompose_norm(g, inputs, *eps, false),
        Op::RmsNorm { eps } => nn::decompose_norm(g, inputs, *eps, true),
        Op::Attention { mask, scale } => nn::decompose_attention(g, *mask, *scale, inputs),
        Op::Conv(a) => spatial::decompose_conv(g, a, inputs),
        Op::Pool(a) => spatial::decompose_pool(g, a, inputs),
        Op::Rope { theta, interleaved } => nn::decompose_rope(g, *theta, *interleaved, inputs),
        Op::Custom(f) => custom::inline(g, &f.body, inputs).map(|o| o[0]),
        Op::Fused(r) => fused::decompose(g, r, inputs),
        Op::DequantMatMul { scheme } => return quant::decompose(g, *scheme, inputs),
        Op::Defined(d) => return d.def().decompose(g, inputs),
        // Primitives: every backend runs them (or reports it cannot).
        Op::Input { .. }
        | Op::Param { .. }
        | Op::Constant { .. }
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Where
        | Op::Activation(_)
        | Op::Cast { .. }
        | Op::MatMul
        | Op::Reduce { .. }
        | Op::Softmax { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::Cumsum { .. }
        | Op::TopK { .. }
        | Op::DequantizeRows { .. }
        | Op::CacheWrite
        | Op::CachedAttention { .. }
        | Op::PagedAttention { .. } => return None,
    })
}

/// Whether `op` has its own differentiation rules ([`vjp`], [`jvp`]). Ops without them are
/// differentiated through their [`decompose`]ition.
pub fn has_ad_rules(op: &Op) -> bool {
    has_vjp_rule(op) && has_jvp_rule(op)
}

fn composite(op: &Op) -> bool {
    matches!(
        op,
        Op::DotGeneral(_)
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Attention { .. }
            | Op::Conv(_)
            | Op::Pool(_)
            | Op::Fused(_)
    )
}

/// Inference-only ops: quantized weights and the stateful KV cache have no derivative rules
/// (autodiff reports them by name).
fn inference_only(op: &Op) -> bool {
    matches!(
        op,
        Op::DequantMatMul { .. }
            | Op::DequantizeRows { .. }
            | Op::CacheWrite
            | Op::CachedAttention { .. }
            | Op::PagedAttention { .. }
    )
}

/// The ops without derivative rules of their own: composites (differentiated through their
/// decomposition) and inference-only ops. A pattern, so [`vjp`] and [`jvp`] stay exhaustive.
macro_rules! without_ad_rules {
    () => {
        Op::DotGeneral(_)
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Attention { .. }
            | Op::Conv(_)
            | Op::Pool(_)
            | Op::Fused(_)
            | Op::DequantMatMul { .. }
            | Op::DequantizeRows { .. }
            | Op::CacheWrite
            | Op::CachedAttention { .. }
            | Op::PagedAttention { .. }
    };
}

/// Whether [`vjp`] has a rule for `op` (a custom function needs its own `vjp` graph).
pub fn has_vjp_rule(op: &Op) -> bool {
    match op {
        Op::Custom(f) => f.vjp.is_some(),
        Op::Defined(d) => d.def().has_vjp_rule(),
        op => !composite(op) && !inference_only(op),
    }
}

/// Whether [`jvp`] has a rule for `op` (a custom function needs its own `jvp` graph).
pub fn has_jvp_rule(op: &Op) -> bool {
    match op {
        Op::Custom(f) => f.jvp.is_some(),
        Op::Defined(d) => d.def().has_jvp_rule(),
        op => !composite(op) && !inference_only(op),
    }
}

/// Reverse-mode rule: the cotangents of `op`'s operands `ins` given the cotangent `ct` of its
/// result `out` (all nodes of `g`). `None` entries are zero or not differentiable (integer and
/// bool operands, indices). Returns `None` when the op has no rule of its own; see
/// [`has_ad_rules`].
pub fn vjp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    out: NodeId,
    ct: NodeId,
) -> Option<Result<Vec<Option<NodeId>>>> {
    if !has_vjp_rule(op) {
        return None;
    }
    Some(match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => Ok(Vec::new()),
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Cast { .. } => {
            elementwise::vjp(g, op, ins, out, ct)
        }
        Op::MatMul => linalg::vjp_matmul(g, ins, ct),
        Op::Reduce { .. } | Op::Softmax { .. } | Op::Cumsum { .. } | Op::TopK { .. } => {
            reduce::vjp(g, op, ins, out, ct)
        }
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. } => movement::vjp(g, op, ins, ct),
        Op::Gather { .. } | Op::ScatterAdd { .. } => index::vjp(g, op, ins, ct),
        Op::Rope { .. } => nn::vjp_rope(g, op, ins, ct),
        Op::Custom(f) => custom::vjp(g, f, ins, out, ct),
        Op::Defined(d) => d.def().vjp(g, ins, out, ct),
        without_ad_rules!() => Err(no_rule(op, "reverse-mode (VJP)")),
    })
}

/// Forward-mode rule: the tangent of `op`'s result `out` given its operands' tangents (`None`
/// is zero). Returns `None` when the op has no rule of its own; see [`has_ad_rules`].
pub fn jvp(
    g: &mut Graph,
    op: &Op,
    ins: &[NodeId],
    out: NodeId,
    tangents: &[Option<NodeId>],
) -> Option<Result<Option<NodeId>>> {
    if !has_jvp_rule(op) {
        return None;
    }
    if tangents.iter().all(Option::is_none) {
        return Some(Ok(None));
    }
    Some(match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => Ok(None),
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Cast { .. } => {
            elementwise::jvp(g, op, ins, out, tangents)
        }
        Op::MatMul => linalg::jvp_matmul(g, ins, out, tangents),
        Op::Reduce { .. } | Op::Softmax { .. } | Op::Cumsum { .. } | Op::TopK { .. } => {
            reduce::jvp(g, op, ins, out, tangents)
        }
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. } => movement::jvp(g, op, ins, tangents),
        Op::Gather { .. } | Op::ScatterAdd { .. } => index::jvp(g, op, ins, tangents),
        Op::Rope { .. } => nn::jvp_rope(g, op, ins, tangents),
        Op::Custom(f) => custom::jvp(g, f, ins, tangents),
        Op::Defined(d) => d.def().jvp(g, ins, out, tangents),
        without_ad_rules!() => Err(no_rule(op, "forward-mode (JVP)")),
    })
}

/// "Attention has no reverse-mode (VJP) rule": composites are differentiated through their
/// decomposition and inference-only ops not at all, so the rule functions never get them.
fn no_rule(op: &Op, which: &str) -> Error {
    Error::op(
        op.name(),
        format!("has no {which} rule of its own; differentiate its decomposition"),
    )
}

/// Static dimensions of an operand, or an error naming the op.
pub(crate) fn static_dims(op: &str, what: &str, s: &Shape) -> Result<Vec<usize>> {
    s.static_dims().ok_or_else(|| {
        Error::op(
            op,
            format!("{what} {s} has symbolic dimensions; bind them before using {op}"),
        )
    })
}

/// Check that an axis is within the rank.
pub(crate) fn check_axis(op: &str, axis: usize, s: &Shape) -> Result<()> {
    if axis >= s.rank() {
        return Err(Error::op(
            op,
            format!(
                "axis {axis} is out of range for operand {s} of rank {}",
                s.rank()
            ),
        ));
    }
    Ok(())
}

/// Require a floating-point operand.
pub(crate) fn require_float(op: &str, s: &Shape) -> Result<()> {
    if !s.dtype().is_float() {
        return Err(Error::op(
            op,
            format!("needs a floating-point operand, got {s}"),
        ));
    }
    Ok(())
}

/// Require two operands of one dtype.
pub(crate) fn same_dtype(op: &str, a: &Shape, b: &Shape) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::op(
            op,
            format!("operand dtypes differ: lhs {a} vs rhs {b}; insert a cast to make them equal"),
        ));
    }
    Ok(())
}

pub(crate) fn dims_of(v: &[usize]) -> Vec<Dim> {
    v.iter().map(|&d| Dim::Static(d)).collect()
}

/// The attributes of `op` in the text form ([`crate::text`]), in print order.
pub fn attrs(op: &Op) -> Vec<(&'static str, crate::text::Attr)> {
    use crate::text::Attr;
    match op {
        Op::Input { name } | Op::Param { name } => vec![("name", Attr::Str(name.clone()))],
        Op::Constant { data } => vec![("data", Attr::Bytes(data.clone()))],
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Cast { .. } => {
            elementwise::attrs(op)
        }
        Op::MatMul => Vec::new(),
        Op::DotGeneral(d) => linalg::attrs(d),
        Op::Reduce { .. } | Op::Softmax { .. } | Op::Cumsum { .. } | Op::TopK { .. } => {
            reduce::attrs(op)
        }
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Attention { .. } | Op::Rope { .. } => {
            nn::attrs(op)
        }
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. } => movement::attrs(op),
        Op::Gather { axis } | Op::ScatterAdd { axis } => index::attrs(*axis),
        Op::Conv(_) | Op::Pool(_) => spatial::attrs(op),
        Op::Custom(f) => custom::attrs(f),
        Op::DequantMatMul { scheme } | Op::DequantizeRows { scheme } => {
            vec![("scheme", quant::scheme_attr(*scheme))]
        }
        Op::Defined(d) => d.def().attrs(),
        Op::CacheWrite => Vec::new(),
        Op::CachedAttention { scale, window } => kv::attrs(*scale, *window),
        Op::PagedAttention {
            scale,
            window,
            block,
        } => kv::paged_attrs(*scale, *window, *block),
        Op::Fused(r) => fused::attrs(r),
    }
}

/// The op of `kind` from its text-form attributes; a missing, mistyped or unknown attribute is
/// an error naming the op.
pub fn from_attrs(kind: crate::OpKind, mut a: crate::text::Attrs) -> Result<Op> {
    use crate::OpKind as K;
    let op = match kind {
        K::Input => Op::Input {
            name: a.string("name")?,
        },
        K::Param => Op::Param {
            name: a.string("name")?,
        },
        K::Constant => Op::Constant {
            data: a.bytes("data")?,
        },
        K::Add | K::Sub | K::Mul | K::Div | K::Max | K::Min | K::Pow => {
            elementwise::from_attrs(kind, &mut a)?
        }
        K::Eq | K::Ne | K::Lt | K::Le | K::Gt | K::Ge | K::Where | K::Cast => {
            elementwise::from_attrs(kind, &mut a)?
        }
        K::Gelu
        | K::GeluApprox
        | K::GeluApproxGrad
        | K::Silu
        | K::Relu
        | K::Sigmoid
        | K::Tanh
        | K::Exp
        | K::Log => elementwise::from_attrs(kind, &mut a)?,
        K::Sqrt
        | K::Rsqrt
        | K::Neg
        | K::Abs
        | K::Sin
        | K::Cos
        | K::Tan
        | K::Atan
        | K::Round
        | K::Erf => elementwise::from_attrs(kind, &mut a)?,
        K::MatMul => Op::MatMul,
        K::DotGeneral => Op::DotGeneral(linalg::from_attrs(&mut a)?),
        K::Reduce | K::Softmax | K::Cumsum | K::TopK => reduce::from_attrs(kind, &mut a)?,
        K::LayerNorm | K::RmsNorm | K::Attention | K::Rope => nn::from_attrs(kind, &mut a)?,
        K::Reshape | K::Transpose | K::Narrow | K::Concat | K::Expand => {
            movement::from_attrs(kind, &mut a)?
        }
        K::Gather | K::ScatterAdd => index::from_attrs(kind, &mut a)?,
        K::Conv | K::Pool => spatial::from_attrs(kind, &mut a)?,
        K::Custom => Op::Custom(custom::from_attrs(&mut a)?),
        K::DequantMatMul => Op::DequantMatMul {
            scheme: quant::scheme_from_attrs("dequant_matmul", &mut a)?,
        },
        K::DequantizeRows => Op::DequantizeRows {
            scheme: quant::scheme_from_attrs("dequantize_rows", &mut a)?,
        },
        K::Defined(name) => {
            let reg =
                registration(name).ok_or_else(|| Error::op(name, "is not a registered op"))?;
            Op::Defined((reg.from_attrs)(&mut a)?)
        }
        K::CacheWrite => Op::CacheWrite,
        K::CachedAttention | K::PagedAttention => kv::from_attrs(kind, &mut a)?,
        K::Fused => Op::Fused(fused::from_attrs(&mut a)?),
    };
    a.finish()?;
    Ok(op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn costs_count_flops_and_bytes() {
        let (a, b) = (
            Shape::new(&[2, 3, 4], DType::F32),
            Shape::new(&[4, 5], DType::F32),
        );
        let out = infer(&Op::MatMul, &[&a, &b]).unwrap();
        assert_eq!(
            cost(&Op::MatMul, &[&a, &b], &out),
            Cost {
                flops: 2 * 2 * 3 * 5 * 4,
                bytes: (24 + 20 + 30) * 4
            }
        );
        let r = Op::Reshape { shape: vec![6, 4] };
        assert_eq!(cost(&r, &[&a], &infer(&r, &[&a]).unwrap()), Cost::default());
        let e = Op::Activation(crate::Activation::Exp);
        assert_eq!(cost(&e, &[&a], &a).flops, 10 * 24);
        let mut g = Graph::new("g");
        let x = g.input("x", a.clone());
        let y = g.activation(crate::Activation::Exp, x);
        let z = g.add(y, x);
        g.set_outputs(vec![z]);
        assert_eq!(
            graph_cost(&g),
            Cost {
                flops: 11 * 24,
                bytes: 5 * 24 * 4
            }
        );
    }
}
