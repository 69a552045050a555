//! Decoder hyper-parameters read from GGUF metadata.

use rlx_gguf::{GgufError, GgufFile};

/// The model families RLX builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama and its close relatives (`llama`, `mistral`, `qwen2`): pre-norm, SwiGLU, RoPE.
    Llama,
    /// Gemma 3: extra post-norms, QK-norm, GeGLU, scaled embeddings, interleaved sliding-window
    /// and global layers with different RoPE bases.
    Gemma3,
}

/// Everything the graph builder needs to know about a decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct LlmConfig {
    /// `general.architecture` as written in the file.
    pub arch_name: String,
    /// Family.
    pub arch: Arch,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Key (and query) head size.
    pub head_dim: usize,
    /// Value head size.
    pub v_head_dim: usize,
    /// Feed-forward hidden size.
    pub n_ff: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE base of global layers.
    pub rope_theta: f32,
    /// RoPE base of sliding-window layers.
    pub rope_theta_local: f32,
    /// Rotate adjacent pairs (ggml "normal" mode, llama) instead of halves ("neox", Qwen2/Gemma).
    pub rope_interleaved: bool,
    /// Vocabulary size.
    pub vocab: usize,
    /// Context length the model was trained for.
    pub ctx_train: usize,
    /// Sliding-window length of local layers, if any.
    pub sliding_window: Option<usize>,
    /// Every `swa_period`-th layer is global, the others use the sliding window.
    pub swa_period: usize,
    /// Attention score scale.
    pub attn_scale: f32,
}

impl LlmConfig {
    /// Read the configuration of `f`, with an error naming the key when something is missing.
    pub fn from_gguf(f: &GgufFile) -> Result<LlmConfig, GgufError> {
        let arch_name = f.get_str("general.architecture")?.to_string();
        let arch = match arch_name.as_str() {
            "llama" | "mistral" | "qwen2" => Arch::Llama,
            "gemma3" => Arch::Gemma3,
            other => {
                let off = f.entry("general.architecture").map_or(0, |e| e.offset);
                return Err(GgufError::new(
                    off,
                    "metadata[\"general.architecture\"]",
                    format!("architecture \"{other}\" is not supported (RLX runs llama, mistral, qwen2 and gemma3)"),
                ));
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let opt_usize = |k: &str| {
            f.get(&key(k))
                .and_then(|v| v.as_int())
                .and_then(|v| usize::try_from(v).ok())
        };
        let n_embd = f.get_usize(&key("embedding_length"))?;
        let n_head = f.get_usize(&key("attention.head_count"))?;
        if n_head == 0 || n_embd == 0 {
            return Err(GgufError::new(
                0,
                key("attention.head_count"),
                "head count and embedding length must be positive",
            ));
        }
        let n_head_kv = opt_usize("attention.head_count_kv").unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(GgufError::new(
                0,
                key("attention.head_count_kv"),
                format!("{n_head_kv} KV heads do not divide {n_head} query heads"),
            ));
        }
        let head_dim = opt_usize("attention.key_length").unwrap_or(n_embd / n_head);
        let v_head_dim = opt_usize("attention.value_length").unwrap_or(head_dim);
        let vocab = match opt_usize("vocab_size") {
            Some(v) => v,
            None => f.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let gemma = arch == Arch::Gemma3;
        let rope_theta = f
            .get(&key("rope.freq_base"))
            .and_then(|v| v.as_f64())
            .unwrap_or(10000.0) as f32;
        let sliding_window = if gemma {
            opt_usize("attention.sliding_window")
        } else {
            None
        };
        let key_scale = f.get(&key("attention.scale")).and_then(|v| v.as_f64());
        Ok(LlmConfig {
            n_layer: f.get_usize(&key("block_count"))?,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            v_head_dim,
            n_ff: f.get_usize(&key("feed_forward_length"))?,
            eps: f.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta,
            // Gemma 3's local layers use base 10000 whatever the global base is.
            rope_theta_local: if gemma { 10000.0 } else { rope_theta },
            rope_interleaved: arch_name == "llama" || arch_name == "mistral",
            vocab,
            ctx_train: opt_usize("context_length").unwrap_or(4096),
            sliding_window,
            swa_period: if gemma { 6 } else { 1 },
            attn_scale: key_scale.map_or(1.0 / (head_dim as f32).sqrt(), |s| s as f32),
            arch,
            arch_name,
        })
    }

    /// The sliding window of layer `l` (`None` for global layers).
    pub fn window(&self, l: usize) -> Option<usize> {
        let w = self.sliding_window?;
        (!(l + 1).is_multiple_of(self.swa_period)).then_some(w)
    }

    /// The RoPE base of layer `l`.
    pub fn rope_base(&self, l: usize) -> f32 {
        if self.window(l).is_some() {
            self.rope_theta_local
        } else {
            self.rope_theta
        }
    }
}
