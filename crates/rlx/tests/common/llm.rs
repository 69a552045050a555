//! The llama.cpp goldens of the LLM tests (`golden/llm/<model>.json`) and helpers to read them.

use serde_json::Value;

/// The golden file of `name` (smollm2, gemma3).
pub fn golden(name: &str) -> Value {
    // From the crate's folder; a test binary moved to another machine (scripts/gpu-check.sh)
    // finds the file under the repository root it runs in.
    let p = format!(
        "{}/tests/golden/llm/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(p)
        .or_else(|_| std::fs::read_to_string(format!("crates/rlx/tests/golden/llm/{name}.json")))
        .expect("golden file");
    serde_json::from_str(&text).expect("json")
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// A JSON array of floats.
pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("floats")
        .iter()
        .map(|x| x.as_f64().expect("float") as f32)
        .collect()
}

/// The index of the largest logit (the first among equals).
pub fn argmax(l: &[f32]) -> usize {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b })
}

/// Two candidate tokens this close in logits are a near-tie, where two correct implementations
/// may pick either: llama.cpp and RLX (`llm_parity.rs`), the GPU and the CPU (`gpu_llm.rs`).
/// Token by token RLX computes llama.cpp's logits exactly (`llm_parity.rs`'s `forced_stepwise`
/// asserts it); prompts, though, are evaluated in batches, where both sides use other kernels
/// (RLX an f32 GEMM on dequantized weights, llama.cpp tiled GEMMs with int8 activations), so
/// logits move by ~0.1 — llama.cpp's own batched and token-by-token runs of the teacher-forced
/// text differ by 0.13 on average and agree on 302 of 310 top-1 tokens.
pub const NEAR_TIE: f32 = 0.5;

/// The index of the second largest logit (the first among equals, the largest's index excluded).
pub fn runner_up(l: &[f32]) -> usize {
    let top = argmax(l);
    (0..l.len())
        .filter(|&i| i != top)
        .fold(None, |b: Option<usize>, i| match b {
            Some(b) if l[b] >= l[i] => Some(b),
            _ => Some(i),
        })
        .expect("two logits or more")
}

/// Whether a decoder's pick `got`, parting from a reference's top token, is a near-tie: `got` is
/// the reference's runner-up, the reference's margin between its top two logits is under
/// [`NEAR_TIE`], and so is the decoder's own margin for `got` over the reference's token.
pub fn is_near_tie(got: u32, runner_up: u32, reference_margin: f32, own_margin: f32) -> bool {
    got == runner_up && reference_margin < NEAR_TIE && own_margin < NEAR_TIE
}
