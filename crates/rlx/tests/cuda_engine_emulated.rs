//! The serving engine on `Device::Cuda` with the CUDA backend's programs run in host emulation
//! (`rlx_cuda::emulate`): a tiny Llama with random weights (two layers, so emulation is quick),
//! served through the engine's paged cache, chunked prompts and shared params. Each request's
//! greedy tokens are the same decoded beside the others as alone, its first token is the CPU
//! engine's, and requests preempted for lack of cache blocks complete.

use rlx::gguf::{random_tensor, synthetic_vocab, GgmlType, GgufWriter, SplitMix64, Value};
use rlx::serve::{Engine, EngineOptions, GenParams};
use rlx::Device;
use std::collections::BTreeMap;

/// A two-layer Llama of width 64 (4 query heads, 2 key/value heads) over 384 tokens, Q4_1 and
/// Q8_0 weights, written to a file.
fn tiny_llama() -> std::path::PathBuf {
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
    let path = std::env::temp_dir().join(format!("rlx-tiny-llama-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes().expect("GGUF bytes")).expect("written");
    path
}

/// Greedy tokens of every request, in submission order.
fn run_all(engine: &mut Engine, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
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

#[test]
fn the_engine_on_cuda_programs_keeps_each_requests_tokens_beside_others_and_completes_preempted_requests(
) {
    // This process only: Device::Cuda runs the CUDA backend's programs on the host.
    rlx::driver::register_backend(
        Device::Cuda,
        std::sync::Arc::new(rlx_cuda::emulate::EmulatedBackend),
    );
    let path = tiny_llama();
    // Prompts of 1 to 40 tokens: the long ones are computed in pieces of at least 16 rows.
    let prompts: Vec<Vec<u32>> = [3usize, 1, 9, 40, 17, 6]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            (0..len)
                .map(|j| (7 + 31 * i + 13 * j) as u32 % 380 + 3)
                .collect()
        })
        .collect();
    let n = 24;
    let load = |device: Device, parallel: usize, ctx_size: Option<usize>| {
        Engine::load(
            &path,
            EngineOptions {
                parallel,
                ctx_size,
                prefill_budget: 32,
                device,
                ..EngineOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("loading the engine on {device:?}: {e}"))
    };
    let cpu = run_all(&mut load(Device::Cpu, prompts.len(), None), &prompts, n);
    let alone = run_all(&mut load(Device::Cuda, 1, None), &prompts, n);
    let mut engine = load(Device::Cuda, prompts.len(), None);
    let together = run_all(&mut engine, &prompts, n);
    assert!(
        engine.stats().steps < (prompts.len() * n) as u64,
        "rows were batched: {:?}",
        engine.stats()
    );
    // The short prompts fit a cache of three blocks at first, then outgrow it while decoding.
    let short = [0, 1, 2, 5];
    let some: Vec<Vec<u32>> = short.iter().map(|&i| prompts[i].clone()).collect();
    let mut small = load(Device::Cuda, some.len(), Some(48));
    let preempted = run_all(&mut small, &some, n);
    assert!(small.stats().preemptions > 0, "{:?}", small.stats());
    for i in 0..prompts.len() {
        assert_eq!(alone[i].len(), n, "prompt {i} stopped early");
        assert_eq!(together[i], alone[i], "prompt {i} beside the others");
        // Random weights magnify rounding differences between backends (an activation
        // rounded to the next int8 level): the prompt's own result, not the whole run, is
        // compared with the CPU.
        assert_eq!(
            alone[i][0], cpu[i][0],
            "prompt {i}: CUDA programs and the CPU"
        );
    }
    // Every request completes after preemption (the tokens after it are not compared: with
    // this model the CPU engine's own preempted runs part from their unpreempted ones too).
    assert!(preempted.iter().all(|t| !t.is_empty() && t.len() <= n));
    let _ = std::fs::remove_file(&path);
}
