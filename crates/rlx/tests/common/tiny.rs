//! A tiny Llama with random weights (two layers of width 64, 384 tokens), quick enough for the
//! serving engine's tests on every backend, host emulation included.

use rlx::gguf::{random_tensor, synthetic_vocab, GgmlType, GgufWriter, SplitMix64, Value};
use rlx::serve::{Engine, GenParams};
use std::collections::BTreeMap;

/// A two-layer Llama of width 64 (4 query heads, 2 key/value heads) over 384 tokens, Q4_1 and
/// Q8_0 weights, written to a file.
pub fn tiny_llama() -> std::path::PathBuf {
    let (layers, d, ff, kv, vocab) = (2usize, 64usize, 128usize, 32usize, 384usize);
    let mut w = GgufWriter::new();
    let u = Value::U32;
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("general.name", Value::String("tiny random llama".into()))
        .meta("llama.block_count", u(layers as u32))
        .meta("llama.context_length", u(1024))
        .meta("llama.embedding_length", u(d as u32))
        .meta("llama.feed_forward_length", u(ff as u32))
        .meta("llama.attention.head_count", u(4))
        .meta("llama.attention.head_count_kv", u(2))
        .meta("llama.rope.freq_base", Value::F32(10000.0))
        .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .meta("llama.vocab_size", u(vocab as u32))
        .meta("llama.rope.dimension_count", u(16));
    for (k, v) in synthetic_vocab(
        true,
        &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        vocab,
    )
    .expect("a vocabulary")
    {
        w.meta(&k, v);
    }
    w.meta("tokenizer.ggml.bos_token_id", u(1))
        .meta("tokenizer.ggml.eos_token_id", u(2));
    let mut tensors = vec![(
        "token_embd.weight".to_string(),
        GgmlType::Q8_0,
        vec![vocab, d],
    )];
    for l in 0..layers {
        let b = |n: &str| format!("blk.{l}.{n}.weight");
        tensors.extend([
            (b("attn_norm"), GgmlType::F32, vec![d]),
            (b("attn_q"), GgmlType::Q4_1, vec![d, d]),
            (b("attn_k"), GgmlType::Q4_1, vec![kv, d]),
            (b("attn_v"), GgmlType::Q4_1, vec![kv, d]),
            (b("attn_output"), GgmlType::Q4_1, vec![d, d]),
            (b("ffn_norm"), GgmlType::F32, vec![d]),
            (b("ffn_gate"), GgmlType::Q4_1, vec![ff, d]),
            (b("ffn_up"), GgmlType::Q4_1, vec![ff, d]),
            (b("ffn_down"), GgmlType::Q4_1, vec![d, ff]),
        ]);
    }
    tensors.push(("output_norm.weight".into(), GgmlType::F32, vec![d]));
    let mut rng = SplitMix64::new(5);
    for (name, ty, shape) in tensors {
        // Spread 0.3: logits far enough apart that greedy picks are not near-ties.
        let (mean, spread) = if ty == GgmlType::F32 {
            (1.0, 0.1)
        } else {
            (0.0, 0.3)
        };
        let data = random_tensor(ty, &shape, mean, spread, &mut rng).expect("random weights");
        w.tensor(&name, ty, &shape, data).expect("a tensor");
    }
    static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("rlx-tiny-llama-{}-{n}.gguf", std::process::id());
    let path = std::env::temp_dir().join(name);
    std::fs::write(&path, w.to_bytes().expect("GGUF bytes")).expect("written");
    path
}

/// Greedy tokens of every request, in submission order.
pub fn greedy_tokens(engine: &mut Engine, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| {
            let params = GenParams {
                max_tokens: n,
                ..GenParams::default()
            };
            engine.submit(p.clone(), params).unwrap()
        })
        .collect();
    let mut got: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut steps = 0;
    while engine.has_work() {
        for e in engine.step().unwrap() {
            got.entry(e.id).or_default().extend(e.token);
        }
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
    }
    ids.iter()
        .map(|id| got.remove(id).unwrap_or_default())
        .collect()
}

/// Greedy tokens of every request with the log-softmax of every step over the whole
/// vocabulary (`vocab` entries, indexed by token), in submission order.
pub fn greedy_with_logprobs(
    engine: &mut Engine,
    prompts: &[Vec<u32>],
    n: usize,
    vocab: usize,
) -> Vec<Vec<(u32, Vec<f32>)>> {
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| {
            let params = GenParams {
                max_tokens: n,
                logprobs: Some(vocab),
                ..GenParams::default()
            };
            engine.submit(p.clone(), params).unwrap()
        })
        .collect();
    let mut got: BTreeMap<u64, Vec<(u32, Vec<f32>)>> = BTreeMap::new();
    let mut steps = 0;
    while engine.has_work() {
        for e in engine.step().unwrap() {
            if let (Some(t), Some(lp)) = (e.token, e.logprobs) {
                let mut row = vec![f32::NEG_INFINITY; vocab];
                for (tok, l) in lp.top {
                    row[tok as usize] = l;
                }
                got.entry(e.id).or_default().push((t, row));
            }
        }
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
    }
    ids.iter()
        .map(|id| got.remove(id).unwrap_or_default())
        .collect()
}
