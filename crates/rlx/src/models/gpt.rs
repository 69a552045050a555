//! A pre-norm decoder-only transformer (GPT) over integer tokens: token and learned position
//! embeddings, `layers` blocks of RMSNorm → causal multi-head attention → residual → RMSNorm →
//! GELU MLP (4× width) → residual, a final RMSNorm and an untied output projection.

use rlx_ir::ops::{Embedding, Linear, TransformerBlock};
use rlx_ir::{DType, Graph, NodeId, Result, Shape};

/// Sizes of a [`Gpt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Context length.
    pub ctx: usize,
    /// Model width.
    pub dim: usize,
    /// Attention heads (`dim` must be a multiple).
    pub heads: usize,
    /// Transformer blocks.
    pub layers: usize,
}

/// The model: its config and its params' names and shapes.
pub struct Gpt {
    /// Sizes.
    pub config: GptConfig,
}

impl Gpt {
    /// A model with `config`.
    pub fn new(config: GptConfig) -> Result<Gpt> {
        if config.heads == 0 || !config.dim.is_multiple_of(config.heads) {
            return Err(rlx_ir::Error::Invalid(format!(
                "width {} is not a multiple of {} heads",
                config.dim, config.heads
            )));
        }
        Ok(Gpt { config })
    }

    /// `(name, shape, init)` of every param; `init` is the standard deviation of a normal
    /// initialization, or `None` for norm weights (initialized to one).
    pub fn params(&self) -> Vec<(String, Vec<usize>, Option<f32>)> {
        let c = self.config;
        let d = c.dim;
        let s = 1.0 / (d as f32).sqrt();
        let res = 1.0 / (2.0 * c.layers as f32).sqrt();
        let mut p = vec![
            ("tok_emb".to_string(), vec![c.vocab, d], Some(0.1)),
            ("pos_emb".to_string(), vec![c.ctx, d], Some(0.1)),
        ];
        for l in 0..c.layers {
            p.push((format!("l{l}.norm1"), vec![d], None));
            p.push((format!("l{l}.wqkv"), vec![d, 3 * d], Some(s)));
            p.push((format!("l{l}.wo"), vec![d, d], Some(s * res)));
            p.push((format!("l{l}.norm2"), vec![d], None));
            p.push((format!("l{l}.w1"), vec![d, 4 * d], Some(s)));
            p.push((
                format!("l{l}.w2"),
                vec![4 * d, d],
                Some(0.5 / (4.0 * d as f32).sqrt() * res),
            ));
        }
        p.push(("norm_f".to_string(), vec![d], None));
        p.push(("w_out".to_string(), vec![d, c.vocab], Some(s)));
        p
    }

    /// Declare the params in `g` and return the logits `[batch * ctx, vocab]` of `tokens
    /// [batch, ctx]` (an integer input). The graph is HIR: an `embedding`, one
    /// `transformer_block` per layer and a `linear` head, which the compiler lowers to MIR.
    pub fn logits(&self, g: &mut Graph, batch: usize, tokens: NodeId) -> Result<NodeId> {
        let c = self.config;
        let (t, h) = (c.ctx, c.heads);
        let mut ps = std::collections::HashMap::new();
        for (name, shape, _) in self.params() {
            let id = g.try_param(&name, Shape::new(&shape, DType::F32))?;
            ps.insert(name, id);
        }
        let x = g.define(Embedding, &[ps["tok_emb"], tokens])?;
        let mut x = g.try_add(x, ps["pos_emb"])?;
        let block = TransformerBlock {
            heads: h,
            eps: 1e-5,
            causal: true,
        };
        for l in 0..c.layers {
            let p = |n: &str| ps[&format!("l{l}.{n}")];
            x = g.define(
                block,
                &[
                    x,
                    p("norm1"),
                    p("wqkv"),
                    p("wo"),
                    p("norm2"),
                    p("w1"),
                    p("w2"),
                ],
            )?;
        }
        let x = g.try_rms_norm(x, ps["norm_f"], 1e-5)?;
        let logits = g.define(Linear, &[x, ps["w_out"]])?;
        g.try_reshape(logits, &[batch * t, c.vocab])
    }

    /// A training graph: inputs `tokens [batch, ctx]` and `targets [batch * ctx]` (I32), output
    /// the mean softmax cross-entropy.
    pub fn training_graph(&self, batch: usize) -> Result<Graph> {
        let c = self.config;
        let mut g = Graph::new("gpt_train");
        let tokens = g.try_input("tokens", Shape::new(&[batch, c.ctx], DType::I32))?;
        let targets = g.try_input("targets", Shape::new(&[batch * c.ctx], DType::I32))?;
        let logits = self.logits(&mut g, batch, tokens)?;
        let loss = crate::train::softmax_cross_entropy(&mut g, logits, targets)?;
        g.try_set_outputs(vec![loss])?;
        Ok(g)
    }
}
