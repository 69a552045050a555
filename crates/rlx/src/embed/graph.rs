//! The encoder as an RLX graph for one batch shape `[B, S]`: token + token-type + absolute
//! position embeddings and a layer norm, post-norm transformer layers (fused QKV projection,
//! attention with a key-padding mask, residual + layer norm, GELU feed-forward, residual + layer
//! norm), then pooling weighted by the mask and, if the model asks, unit length. The compiler
//! fuses it like any other graph; nothing here is a hand-written model kernel.

use super::config::{EncoderConfig, HiddenAct, Pooling};
use rlx_ir::{Activation, CmpOp, DType, Graph, NodeId, ReduceKind, Result, Shape};

/// Names and shapes of the graph's params (what [`super::weights`] produces, same order).
pub(crate) fn params(cfg: &EncoderConfig) -> Vec<(String, Vec<usize>)> {
    let (h, f) = (cfg.hidden, cfg.intermediate);
    let mut p = vec![
        ("word_emb".to_string(), vec![cfg.vocab, h]),
        ("pos_emb".to_string(), vec![cfg.max_positions, h]),
        ("type_emb".to_string(), vec![cfg.type_vocab, h]),
        ("emb_ln.g".to_string(), vec![h]),
        ("emb_ln.b".to_string(), vec![h]),
    ];
    for l in 0..cfg.layers {
        for (n, d) in [
            ("wqkv", vec![h, 3 * h]),
            ("bqkv", vec![3 * h]),
            ("wo", vec![h, h]),
            ("bo", vec![h]),
            ("ln1.g", vec![h]),
            ("ln1.b", vec![h]),
            ("w1", vec![h, f]),
            ("b1", vec![f]),
            ("w2", vec![f, h]),
            ("b2", vec![h]),
            ("ln2.g", vec![h]),
            ("ln2.b", vec![h]),
        ] {
            p.push((format!("l{l}.{n}"), d));
        }
    }
    p
}

/// The graph embedding a batch of `batch` inputs padded to `seq` tokens. Inputs: `ids` and
/// `types` (I32 `[B, S]`), `mask` (F32 `[B, S]`, 1 for a real token, 0 for padding). Output:
/// the sentence vectors, F32 `[B, hidden]`.
pub(crate) fn build(cfg: &EncoderConfig, batch: usize, seq: usize) -> Result<Graph> {
    let (b, s, h) = (batch, seq, cfg.hidden);
    let (nh, dh) = (cfg.heads, cfg.hidden / cfg.heads);
    let mut g = Graph::new(&format!("encoder_b{b}_s{s}"));
    let mut p = std::collections::HashMap::new();
    for (name, dims) in params(cfg) {
        let id = g.try_param(&name, Shape::new(&dims, DType::F32))?;
        p.insert(name, id);
    }
    let ids = g.try_input("ids", Shape::new(&[b, s], DType::I32))?;
    let types = g.try_input("types", Shape::new(&[b, s], DType::I32))?;
    let mask = g.try_input("mask", Shape::new(&[b, s], DType::F32))?;

    let x = g.try_gather(p["word_emb"], ids, 0)?;
    let t = g.try_gather(p["type_emb"], types, 0)?;
    let x = g.try_add(x, t)?;
    let pos = g.try_narrow(p["pos_emb"], 0, 0, s)?;
    let x = g.try_add(x, pos)?;
    let x = g.try_layer_norm(x, p["emb_ln.g"], p["emb_ln.b"], cfg.eps)?;
    let mut x = g.try_reshape(x, &[b * s, h])?;

    // Additive key mask [B, 1, 1, S]: 0 for real tokens, the most negative f32 for padding
    // (what the reference implementation adds), so padded keys get zero probability.
    let one = g.try_scalar(1.0, DType::F32)?;
    let neg = g.try_scalar(f32::MIN as f64, DType::F32)?;
    let off = g.try_sub(one, mask)?;
    let add_mask = g.try_mul(off, neg)?;
    let add_mask = g.try_reshape(add_mask, &[b, 1, 1, s])?;

    let linear = |g: &mut Graph, x: NodeId, w: &str, bias: &str| -> Result<NodeId> {
        let y = g.try_dot(x, p[w])?;
        g.try_add(y, p[bias])
    };
    let heads = |g: &mut Graph, qkv: NodeId, i: usize| -> Result<NodeId> {
        let t = g.try_narrow(qkv, 1, i * h, h)?;
        let t = g.try_reshape(t, &[b, s, nh, dh])?;
        g.try_transpose(t, &[0, 2, 1, 3])
    };
    for l in 0..cfg.layers {
        let n = |s: &str| format!("l{l}.{s}");
        let qkv = linear(&mut g, x, &n("wqkv"), &n("bqkv"))?;
        let (q, k, v) = (
            heads(&mut g, qkv, 0)?,
            heads(&mut g, qkv, 1)?,
            heads(&mut g, qkv, 2)?,
        );
        let a = g.try_attention_masked(q, k, v, add_mask, 1.0 / (dh as f32).sqrt())?;
        let a = g.try_transpose(a, &[0, 2, 1, 3])?;
        let a = g.try_reshape(a, &[b * s, h])?;
        let a = linear(&mut g, a, &n("wo"), &n("bo"))?;
        let a = g.try_add(a, x)?;
        x = g.try_layer_norm(a, p[&n("ln1.g")], p[&n("ln1.b")], cfg.eps)?;
        let f = linear(&mut g, x, &n("w1"), &n("b1"))?;
        let f = g.try_activation(
            match cfg.act {
                HiddenAct::Gelu => Activation::Gelu,
                HiddenAct::GeluTanh => Activation::GeluApprox,
                HiddenAct::Relu => Activation::Relu,
            },
            f,
        )?;
        let f = linear(&mut g, f, &n("w2"), &n("b2"))?;
        let f = g.try_add(f, x)?;
        x = g.try_layer_norm(f, p[&n("ln2.g")], p[&n("ln2.b")], cfg.eps)?;
    }
    let x = g.try_reshape(x, &[b, s, h])?;
    let m3 = g.try_reshape(mask, &[b, s, 1])?;
    let mut e = match cfg.pooling {
        Pooling::Cls => {
            let c = g.try_narrow(x, 1, 0, 1)?;
            g.try_reshape(c, &[b, h])?
        }
        Pooling::Max => {
            // Padding takes -1e9 (as sentence-transformers sets it) before the maximum.
            let zero = g.try_scalar(0.0, DType::F32)?;
            let real = g.try_compare(CmpOp::Gt, m3, zero)?;
            let low = g.try_scalar(-1e9, DType::F32)?;
            let low = g.try_expand(low, &[b, s, h])?;
            let xm = g.try_select(real, x, low)?;
            g.try_reduce(ReduceKind::Max, xm, &[1], false)?
        }
        Pooling::Mean | Pooling::MeanSqrtLen => {
            let xm = g.try_mul(x, m3)?;
            let sum = g.try_sum(xm, &[1], false)?;
            let count = g.try_sum(mask, &[1], true)?;
            let tiny = g.try_scalar(1e-9, DType::F32)?;
            let count = g.try_maximum(count, tiny)?;
            let count = if cfg.pooling == Pooling::MeanSqrtLen {
                g.try_activation(Activation::Sqrt, count)?
            } else {
                count
            };
            g.try_div(sum, count)?
        }
    };
    if cfg.normalize {
        // x / max(|x|, 1e-12), as torch.nn.functional.normalize.
        let sq = g.try_mul(e, e)?;
        let ss = g.try_sum(sq, &[1], true)?;
        let norm = g.try_activation(Activation::Sqrt, ss)?;
        let tiny = g.try_scalar(1e-12, DType::F32)?;
        let norm = g.try_maximum(norm, tiny)?;
        e = g.try_div(e, norm)?;
    }
    g.set_outputs(vec![e]);
    Ok(g)
}
