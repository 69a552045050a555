//! What a model directory says about its encoder: `config.json` (the BERT sizes),
//! sentence-transformers' `modules.json`, `1_Pooling/config.json` and `sentence_bert_config.json`
//! (pooling, normalization, maximum length).

use crate::{Error, Result};
use serde_json::Value;
use std::path::Path;

/// How token vectors become one sentence vector (sentence-transformers' `Pooling` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Average of the real (unpadded) tokens' vectors.
    Mean,
    /// The first token's (`[CLS]`) vector.
    Cls,
    /// Elementwise maximum over the real tokens.
    Max,
    /// Sum of the real tokens' vectors divided by the square root of their count.
    MeanSqrtLen,
}

impl Pooling {
    /// The name sentence-transformers' pooling config uses (`mean`, `cls`, `max`,
    /// `mean_sqrt_len_tokens`).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Max => "max",
            Pooling::MeanSqrtLen => "mean_sqrt_len_tokens",
        }
    }
}

/// Activation of the feed-forward layers (`hidden_act`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HiddenAct {
    /// GELU with the exact normal CDF (`gelu`).
    Gelu,
    /// The tanh approximation (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    /// `relu`.
    Relu,
}

/// A BERT-family encoder and how its sentence vectors are made.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Width of the token vectors.
    pub hidden: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Attention heads per layer.
    pub heads: usize,
    /// Width of the feed-forward layers.
    pub intermediate: usize,
    /// Rows of the position table.
    pub max_positions: usize,
    /// Rows of the token-type table.
    pub type_vocab: usize,
    /// Epsilon of every layer norm.
    pub eps: f32,
    /// Feed-forward activation.
    pub act: HiddenAct,
    /// Id of the padding token.
    pub pad_id: u32,
    /// Longest input in tokens (special tokens included); longer inputs are truncated.
    pub max_length: usize,
    /// Pooling of the token vectors.
    pub pooling: Pooling,
    /// Whether sentence vectors are scaled to unit length.
    pub normalize: bool,
}

fn read_json(dir: &Path, file: &str) -> Result<Option<Value>> {
    let path = dir.join(file);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::Invalid(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Invalid(format!("{}: not valid JSON: {e}", path.display())))
}

fn field(v: &Value, file: &Path, key: &str) -> Result<usize> {
    v[key]
        .as_u64()
        .filter(|&n| n > 0)
        .map(|n| n as usize)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{}: \"{key}\" is missing or not a positive integer",
                file.display()
            ))
        })
}

impl EncoderConfig {
    /// Read the config of the model in `dir`. `config.json` is required; without
    /// sentence-transformers' files the model pools by mean, does not normalize, and takes inputs
    /// up to its position table.
    pub fn load(dir: &Path) -> Result<EncoderConfig> {
        let cfg_path = dir.join("config.json");
        let c = read_json(dir, "config.json")?.ok_or_else(|| {
            Error::Invalid(format!(
                "{} is missing: a model directory holds config.json, model.safetensors and \
                 tokenizer.json (a Hugging Face BERT-family model)",
                cfg_path.display()
            ))
        })?;
        let kind = c["model_type"].as_str().unwrap_or("bert");
        if kind != "bert" {
            return Err(Error::Invalid(format!(
                "{}: model_type \"{kind}\" is not supported; RLX embeds with BERT-family \
                 encoders (model_type \"bert\": MiniLM, BGE, E5, GTE ...)",
                cfg_path.display()
            )));
        }
        if let Some(p) = c["position_embedding_type"].as_str() {
            if p != "absolute" {
                return Err(Error::Invalid(format!(
                    "{}: position_embedding_type \"{p}\" is not supported (only \"absolute\")",
                    cfg_path.display()
                )));
            }
        }
        let act = match c["hidden_act"].as_str().unwrap_or("gelu") {
            "gelu" => HiddenAct::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" => HiddenAct::GeluTanh,
            "relu" => HiddenAct::Relu,
            other => {
                return Err(Error::Invalid(format!(
                    "{}: hidden_act \"{other}\" is not supported (gelu, gelu_new, \
                     gelu_pytorch_tanh, relu)",
                    cfg_path.display()
                )))
            }
        };
        let hidden = field(&c, &cfg_path, "hidden_size")?;
        let heads = field(&c, &cfg_path, "num_attention_heads")?;
        if !hidden.is_multiple_of(heads) {
            return Err(Error::Invalid(format!(
                "{}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}",
                cfg_path.display()
            )));
        }
        let max_positions = field(&c, &cfg_path, "max_position_embeddings")?;
        let eps = c["layer_norm_eps"].as_f64().unwrap_or(1e-12) as f32;
        let type_vocab = c["type_vocab_size"].as_u64().unwrap_or(2).max(1) as usize;
        let pad_id = c["pad_token_id"].as_u64().unwrap_or(0) as u32;

        // sentence-transformers: modules.json names the pooling folder and a Normalize module.
        let mut pooling = Pooling::Mean;
        let mut normalize = false;
        let mut pool_dir = "1_Pooling".to_string();
        if let Some(m) = read_json(dir, "modules.json")? {
            for module in m.as_array().into_iter().flatten() {
                let ty = module["type"].as_str().unwrap_or("");
                if ty.ends_with("Normalize") {
                    normalize = true;
                }
                if ty.ends_with("Pooling") {
                    if let Some(p) = module["path"].as_str() {
                        pool_dir = p.to_string();
                    }
                }
            }
        }
        if let Some(p) = read_json(dir, &format!("{pool_dir}/config.json"))? {
            let on = |k: &str| p[k].as_bool().unwrap_or(false);
            pooling = if on("pooling_mode_cls_token") {
                Pooling::Cls
            } else if on("pooling_mode_max_tokens") {
                Pooling::Max
            } else if on("pooling_mode_mean_sqrt_len_tokens") {
                Pooling::MeanSqrtLen
            } else if on("pooling_mode_mean_tokens") {
                Pooling::Mean
            } else {
                let path = dir.join(&pool_dir).join("config.json");
                return Err(Error::Invalid(format!(
                    "{}: no pooling mode RLX supports is on (mean, cls, max, \
                     mean_sqrt_len_tokens)",
                    path.display()
                )));
            };
        }
        let max_length = read_json(dir, "sentence_bert_config.json")?
            .and_then(|s| s["max_seq_length"].as_u64())
            .map(|n| n as usize)
            .unwrap_or(max_positions);
        if max_length == 0 || max_length > max_positions {
            return Err(Error::Invalid(format!(
                "{}: max_seq_length {max_length} must be between 1 and the position table's \
                 {max_positions} rows",
                dir.join("sentence_bert_config.json").display()
            )));
        }
        Ok(EncoderConfig {
            vocab: field(&c, &cfg_path, "vocab_size")?,
            hidden,
            layers: field(&c, &cfg_path, "num_hidden_layers")?,
            heads,
            intermediate: field(&c, &cfg_path, "intermediate_size")?,
            max_positions,
            type_vocab,
            eps,
            act,
            pad_id,
            max_length,
            pooling,
            normalize,
        })
    }
}
