//! The HIR blocks: the layers a model builder thinks in (`linear`, `embedding`, `mlp`,
//! `transformer_block`), each an op defined in this file whose decomposition is its lowering to
//! MIR (the tensor ops every pass works on). [`is_block`] names them; `rlx_opt::module` lowers a
//! graph holding them (HIR) to MIR by their decompositions. Inference, the reference evaluator
//! and the cost all go through the decomposition, so the block and its lowering cannot
//! disagree, and autodiff and vmap use it too (the blocks have no rules of their own).
//! RMS / layer norms and attention are MIR ops already and serve as blocks as they are.

use super::{graph_cost, Cost, DefinedOp, OpDef, OpRegistration};
use crate::eval::Tensor;
use crate::text::Attr;
use crate::{Activation, Error, Graph, MaskKind, NodeId, Op, Result, Shape};

/// Whether `op` is an HIR block (lowered to MIR by its decomposition).
pub fn is_block(op: &Op) -> bool {
    matches!(op, Op::Defined(d) if BLOCKS.contains(&d.name()))
}

/// The names of the block ops.
pub const BLOCKS: &[&str] = &[
    "linear",
    "quant_linear",
    "embedding",
    "mlp",
    "transformer_block",
];

/// The decomposition of `def` over inputs of shapes `ins`, in a graph of its own.
fn lowered(def: &dyn OpDef, ins: &[&Shape]) -> Result<(Graph, NodeId)> {
    let mut g = Graph::new(def.name());
    let mut args = Vec::with_capacity(ins.len());
    for (i, s) in ins.iter().enumerate() {
        args.push(g.try_input(&format!("arg{i}"), (*s).clone())?);
    }
    let r = def
        .decompose(&mut g, &args)
        .ok_or_else(|| Error::op(def.name(), "has no lowering"))?
        .map_err(|e| Error::op(def.name(), format!("operands {ins:?}: {e}")))?;
    Ok((g, r))
}

fn infer(def: &dyn OpDef, ins: &[&Shape]) -> Result<Shape> {
    let (g, r) = lowered(def, ins)?;
    Ok(g.shape(r).clone())
}

fn cost(def: &dyn OpDef, ins: &[&Shape]) -> Cost {
    lowered(def, ins).map_or(Cost::default(), |(g, _)| graph_cost(&g))
}

/// The activations an `mlp` block may use.
const ACTS: [Activation; 4] = [
    Activation::Gelu,
    Activation::GeluApprox,
    Activation::Silu,
    Activation::Relu,
];

fn act_name(a: Activation) -> &'static str {
    match a {
        Activation::Gelu => "gelu",
        Activation::GeluApprox => "gelu_approx",
        Activation::Silu => "silu",
        Activation::Relu => "relu",
        // Not an mlp activation (refused by `Mlp::infer`); printed by its kind's name.
        other => Op::Activation(other).name(),
    }
}

/// Implements the parts every block shares: name, inference, evaluation and cost through
/// the decomposition.
macro_rules! block_rules {
    ($name:literal) => {
        fn name(&self) -> &'static str {
            $name
        }

        fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
            infer(self, ins)
        }

        fn eval(&self, ins: &[&Tensor], _out: &Shape) -> Result<Tensor> {
            crate::eval::through_decomposition(&Op::defined(self.clone()), ins)
        }

        fn cost(&self, ins: &[&Shape], _out: &Shape) -> Cost {
            cost(self, ins)
        }
    };
}

/// `x · w (+ b)`: `x [..., in]`, `w [in, out]`, optionally `b [out]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Linear;

pub(super) const LINEAR: OpRegistration = OpRegistration {
    name: "linear",
    from_attrs: |_| Ok(DefinedOp::new(Linear)),
    examples: || vec![DefinedOp::new(Linear)],
};

impl OpDef for Linear {
    block_rules!("linear");

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        Vec::new()
    }

    fn arity(&self) -> (usize, usize) {
        (2, 3)
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some(g.try_dot(ins[0], ins[1]).and_then(|y| match ins.get(2) {
            Some(&b) => g.try_add(y, b),
            None => Ok(y),
        }))
    }
}

/// `x · Wᵀ` for a weight kept packed as GGUF (or RLX block) rows `w` (`U8 [out, row_bytes]`)
/// of `scheme`: the linear layer of a quantized model, lowered to `dequant_matmul`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantLinear {
    /// How `w`'s rows are packed.
    pub scheme: crate::QuantScheme,
}

pub(super) const QUANT_LINEAR: OpRegistration = OpRegistration {
    name: "quant_linear",
    from_attrs: |a| {
        Ok(DefinedOp::new(QuantLinear {
            scheme: super::quant::scheme_from_attrs("quant_linear", a)?,
        }))
    },
    examples: || {
        vec![DefinedOp::new(QuantLinear {
            scheme: crate::QuantScheme::GgufQ4_0,
        })]
    },
};

impl OpDef for QuantLinear {
    block_rules!("quant_linear");

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![("scheme", super::quant::scheme_attr(self.scheme))]
    }

    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some(g.try_dequant_matmul(ins[0], ins[1], self.scheme))
    }
}

/// Rows of `table [vocab, dim]` picked by integer `ids [...]`: `[..., dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Embedding;

pub(super) const EMBEDDING: OpRegistration = OpRegistration {
    name: "embedding",
    from_attrs: |_| Ok(DefinedOp::new(Embedding)),
    examples: || vec![DefinedOp::new(Embedding)],
};

impl OpDef for Embedding {
    block_rules!("embedding");

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        Vec::new()
    }

    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some(g.try_gather(ins[0], ins[1], 0))
    }
}

/// A feed-forward block. Plain: `act(x · w_up) · w_down` (operands `x, w_up, w_down`). Gated
/// (SwiGLU with `silu`, GeGLU with `gelu`): `(act(x · w_gate) * (x · w_up)) · w_down` (operands
/// `x, w_gate, w_up, w_down`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mlp {
    /// The activation (`gelu`, `gelu_approx`, `silu` or `relu`).
    pub act: Activation,
    /// Whether a gate product multiplies the activation.
    pub gated: bool,
}

pub(super) const MLP: OpRegistration = OpRegistration {
    name: "mlp",
    from_attrs: |a| {
        // A word (`act = silu`), or a string as JSON-built rows write it.
        let act = match a.take("act")? {
            Attr::Word(w) | Attr::Str(w) => ACTS.into_iter().find(|&x| act_name(x) == w),
            _ => None,
        }
        .ok_or_else(|| {
            Error::op(
                "mlp",
                "attribute `act` must be one of gelu, gelu_approx, silu, relu",
            )
        })?;
        Ok(DefinedOp::new(Mlp {
            act,
            gated: a.bool("gated")?,
        }))
    },
    examples: || {
        vec![
            DefinedOp::new(Mlp {
                act: Activation::GeluApprox,
                gated: false,
            }),
            DefinedOp::new(Mlp {
                act: Activation::Silu,
                gated: true,
            }),
        ]
    },
};

impl OpDef for Mlp {
    block_rules!("mlp");

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("act", Attr::word(act_name(self.act))),
            ("gated", self.gated.into()),
        ]
    }

    fn arity(&self) -> (usize, usize) {
        if self.gated {
            (4, 4)
        } else {
            (3, 3)
        }
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        let ok = ACTS.contains(&self.act);
        Some(if !ok {
            Err(Error::op(
                "mlp",
                format!(
                    "activation {} is not one of gelu, gelu_approx, silu, relu",
                    act_name(self.act)
                ),
            ))
        } else {
            (|| {
                let x = ins[0];
                let h = g.try_dot(x, ins[1])?;
                let h = g.try_activation(self.act, h)?;
                let (h, down) = if self.gated {
                    let up = g.try_dot(x, ins[2])?;
                    (g.try_mul(h, up)?, ins[3])
                } else {
                    (h, ins[2])
                };
                g.try_dot(h, down)
            })()
        })
    }
}

/// A pre-norm decoder block (GPT-2 style with RMS norms): `x [batch, ctx, dim]` →
/// `x + attn(rms_norm(x))`, then `+ mlp(rms_norm(·))`, with operands `x, norm1 [dim],
/// wqkv [dim, 3·dim], wo [dim, dim], norm2 [dim], w1 [dim, hidden], w2 [hidden, dim]`.
/// Attention is multi-head (`heads` divides `dim`), scaled by `1/sqrt(dim/heads)`, causal when
/// `causal`; the MLP is `gelu_approx`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransformerBlock {
    /// Attention heads.
    pub heads: usize,
    /// The norms' epsilon.
    pub eps: f32,
    /// Whether attention is causal.
    pub causal: bool,
}

pub(super) const TRANSFORMER_BLOCK: OpRegistration = OpRegistration {
    name: "transformer_block",
    from_attrs: |a| {
        Ok(DefinedOp::new(TransformerBlock {
            heads: a.usize("heads")?,
            eps: a.f32("eps")?,
            causal: a.bool("causal")?,
        }))
    },
    examples: || {
        vec![
            DefinedOp::new(TransformerBlock {
                heads: 4,
                eps: 1e-5,
                causal: true,
            }),
            DefinedOp::new(TransformerBlock {
                heads: 1,
                eps: 1e-6,
                causal: false,
            }),
        ]
    },
};

impl OpDef for TransformerBlock {
    block_rules!("transformer_block");

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("heads", self.heads.into()),
            ("eps", self.eps.into()),
            ("causal", self.causal.into()),
        ]
    }

    fn arity(&self) -> (usize, usize) {
        (7, 7)
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some((|| {
            let [x, norm1, wqkv, wo, norm2, w1, w2] = ins else {
                return Err(Error::op("transformer_block", "takes 7 operands"));
            };
            let dims = g.shape(*x).static_dims().unwrap_or_default();
            let [b, t, d] = dims[..] else {
                return Err(Error::op(
                    "transformer_block",
                    format!("x must be [batch, ctx, dim], got {}", g.shape(*x)),
                ));
            };
            let h = self.heads;
            if h == 0 || d % h != 0 {
                return Err(Error::op(
                    "transformer_block",
                    format!("{h} heads do not divide the width {d}"),
                ));
            }
            let dh = d / h;
            let hn = g.try_rms_norm(*x, *norm1, self.eps)?;
            let qkv = g.try_dot(hn, *wqkv)?;
            let mut heads = Vec::with_capacity(3);
            for i in 0..3 {
                let part = g.try_narrow(qkv, 2, i * d, d)?;
                let r = g.try_reshape(part, &[b, t, h, dh])?;
                heads.push(g.try_transpose(r, &[0, 2, 1, 3])?);
            }
            let mask = if self.causal {
                MaskKind::Causal
            } else {
                MaskKind::None
            };
            let a = g.try_attention(heads[0], heads[1], heads[2], mask, (dh as f32).powf(-0.5))?;
            let a = g.try_transpose(a, &[0, 2, 1, 3])?;
            let a = g.try_reshape(a, &[b, t, d])?;
            let a = g.try_dot(a, *wo)?;
            let x = g.try_add(*x, a)?;
            let hn = g.try_rms_norm(x, *norm2, self.eps)?;
            let m = g.try_dot(hn, *w1)?;
            let m = g.try_activation(Activation::GeluApprox, m)?;
            let m = g.try_dot(m, *w2)?;
            g.try_add(x, m)
        })())
    }
}
