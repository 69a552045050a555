//! The llama.cpp goldens of the LLM tests (`golden/llm/<model>.json`) and helpers to read them.

use serde_json::Value;

/// The golden file of `name` (smollm2, gemma3).
pub fn golden(name: &str) -> Value {
    let p = format!(
        "{}/tests/golden/llm/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(p).expect("golden file")).expect("json")
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
