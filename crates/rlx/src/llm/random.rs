//! Random-weight models with a known model's shapes, block types and configuration: every
//! tensor of SmolLM2-135M (Q4_1) or Gemma 3 270M (Q4_K_M, llama.cpp's mix of Q5_0, Q4_K, Q6_K and
//! Q8_0 by layer) as in the published files, filled with random well-formed blocks, and a
//! synthetic vocabulary of the same size. Kernels, memory and speed are those of the real model
//! (a decode step reads the same bytes); the text is noise. For device checks and benchmarks
//! where the model file cannot travel.

use crate::hub::KnownModel;
use crate::{Error, Result};
use rlx_gguf::{random_tensor, synthetic_vocab, GgmlType, GgufWriter, SplitMix64, Value};

use GgmlType::{F32, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0};

fn gguf(e: rlx_gguf::GgufError) -> Error {
    Error::Invalid(format!("random model: {e}"))
}

/// A random-weight GGUF with the shapes of `model` (SmolLM2 or Gemma 3), its bytes. The same
/// seed gives the same file.
pub fn random_gguf(model: KnownModel, seed: u64) -> Result<Vec<u8>> {
    let mut w = GgufWriter::new();
    let mut rng = SplitMix64::new(seed);
    let u32v = Value::U32;
    // (name, type, shape): weights get spread 0.02 (as initialized transformers), norms 1 ± 0.1.
    let mut tensors: Vec<(String, GgmlType, Vec<usize>)> = Vec::new();
    match model {
        KnownModel::SmolLM2 => {
            let (layers, d, ff, kv, vocab) = (30usize, 576usize, 1536usize, 192usize, 49152usize);
            w.meta("general.architecture", Value::String("llama".into()))
                .meta(
                    "general.name",
                    Value::String("random SmolLM2-135M shape".into()),
                )
                .meta("llama.block_count", u32v(layers as u32))
                .meta("llama.context_length", u32v(8192))
                .meta("llama.embedding_length", u32v(d as u32))
                .meta("llama.feed_forward_length", u32v(ff as u32))
                .meta("llama.attention.head_count", u32v(9))
                .meta("llama.attention.head_count_kv", u32v(3))
                .meta("llama.rope.freq_base", Value::F32(100000.0))
                .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
                .meta("llama.vocab_size", u32v(vocab as u32))
                .meta("llama.rope.dimension_count", u32v(64));
            for (k, v) in synthetic_vocab(
                true,
                &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                vocab,
            )
            .map_err(gguf)?
            {
                w.meta(&k, v);
            }
            w.meta("tokenizer.ggml.bos_token_id", u32v(1))
                .meta("tokenizer.ggml.eos_token_id", u32v(2));
            tensors.push(("token_embd.weight".into(), Q8_0, vec![vocab, d]));
            for l in 0..layers {
                let b = |n: &str| format!("blk.{l}.{n}.weight");
                tensors.extend([
                    (b("attn_norm"), F32, vec![d]),
                    (b("ffn_down"), Q4_1, vec![d, ff]),
                    (b("ffn_gate"), Q4_1, vec![ff, d]),
                    (b("ffn_up"), Q4_1, vec![ff, d]),
                    (b("ffn_norm"), F32, vec![d]),
                    (b("attn_k"), Q4_1, vec![kv, d]),
                    (b("attn_output"), Q4_1, vec![d, d]),
                    (b("attn_q"), Q4_1, vec![d, d]),
                    (b("attn_v"), Q4_1, vec![kv, d]),
                ]);
            }
            tensors.push(("output_norm.weight".into(), F32, vec![d]));
        }
        KnownModel::Gemma3 => {
            let (layers, d, ff, hd, vocab) = (18usize, 640usize, 2048usize, 256usize, 262144usize);
            w.meta("general.architecture", Value::String("gemma3".into()))
                .meta(
                    "general.name",
                    Value::String("random Gemma 3 270M shape".into()),
                )
                .meta("gemma3.context_length", u32v(32768))
                .meta("gemma3.embedding_length", u32v(d as u32))
                .meta("gemma3.block_count", u32v(layers as u32))
                .meta("gemma3.feed_forward_length", u32v(ff as u32))
                .meta("gemma3.attention.head_count", u32v(4))
                .meta("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
                .meta("gemma3.attention.key_length", u32v(hd as u32))
                .meta("gemma3.attention.value_length", u32v(hd as u32))
                .meta("gemma3.rope.freq_base", Value::F32(1_000_000.0))
                .meta("gemma3.attention.sliding_window", u32v(512))
                .meta("gemma3.attention.head_count_kv", u32v(1));
            for (k, v) in synthetic_vocab(false, &["<pad>", "<eos>", "<bos>", "<unk>"], vocab)
                .map_err(gguf)?
            {
                w.meta(&k, v);
            }
            w.meta("tokenizer.ggml.bos_token_id", u32v(2))
                .meta("tokenizer.ggml.eos_token_id", u32v(1))
                .meta("tokenizer.ggml.unknown_token_id", u32v(3))
                .meta("tokenizer.ggml.padding_token_id", u32v(0));
            tensors.push(("token_embd.weight".into(), Q8_0, vec![vocab, d]));
            // llama.cpp's Q4_K_M gives the first eighth, the last eighth and every third layer
            // between more bits in attn_v and ffn_down.
            let more_bits =
                |l: usize| l < layers / 8 || l >= 7 * layers / 8 || (l - layers / 8) % 3 == 2;
            for l in 0..layers {
                let b = |n: &str| format!("blk.{l}.{n}.weight");
                let (v, down) = if more_bits(l) {
                    (Q8_0, Q6_K)
                } else {
                    (Q5_0, Q4_K)
                };
                tensors.extend([
                    (b("attn_norm"), F32, vec![d]),
                    (b("attn_q"), Q5_0, vec![4 * hd, d]),
                    (b("attn_k"), Q5_0, vec![hd, d]),
                    (b("attn_v"), v, vec![hd, d]),
                    (b("attn_q_norm"), F32, vec![hd]),
                    (b("attn_k_norm"), F32, vec![hd]),
                    (b("attn_output"), Q4_K, vec![d, 4 * hd]),
                    (b("post_attention_norm"), F32, vec![d]),
                    (b("ffn_norm"), F32, vec![d]),
                    (b("ffn_gate"), Q5_0, vec![ff, d]),
                    (b("ffn_up"), Q5_0, vec![ff, d]),
                    (b("ffn_down"), down, vec![d, ff]),
                    (b("post_ffw_norm"), F32, vec![d]),
                ]);
            }
            tensors.push(("output_norm.weight".into(), F32, vec![d]));
        }
        KnownModel::MiniLM => {
            return Err(Error::Invalid(
                "random models are written for the GGUF LLMs (smollm2, gemma3), not minilm".into(),
            ))
        }
    }
    for (name, ty, shape) in tensors {
        let (mean, spread) = if ty == F32 { (1.0, 0.1) } else { (0.0, 0.02) };
        let data = random_tensor(ty, &shape, mean, spread, &mut rng).map_err(gguf)?;
        w.tensor(&name, ty, &shape, data).map_err(gguf)?;
    }
    w.to_bytes().map_err(gguf)
}

/// The path of the random-weight model of `model`'s shapes for `seed` in the cache
/// (`random-<file name>` with the seed), written first if it is not there.
pub fn ensure_random(model: KnownModel, seed: u64) -> Result<std::path::PathBuf> {
    let dir = crate::hub::cache_dir();
    let path = dir.join(format!("random-{seed}-{}", model.file_name()));
    if path.exists() {
        return Ok(path);
    }
    let bytes = random_gguf(model, seed)?;
    let io = |e: std::io::Error| Error::Invalid(format!("writing {}: {e}", path.display()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    // Written aside and renamed, so a reader never sees half a file.
    let part = path.with_extension(format!("part{}", std::process::id()));
    std::fs::write(&part, bytes).map_err(io)?;
    std::fs::rename(&part, &path).map_err(io)?;
    Ok(path)
}
