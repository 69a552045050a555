//! The GGUF tokenizer against llama.cpp's own tokenization of the two target models.
//!
//! The reference ids are `crates/rlx/tests/golden/llm/{smollm2,gemma3}.json`, written by
//! `gen_llama_cpp.py` beside them, and `tests/golden/tokenizer_extra.json` (more strings),
//! written by `tests/golden/gen_tokenizer.py`; both use llama-cpp-python. The model files are not in the
//! repository: each test reads the path from an environment variable (`RLX_SMOLLM2_GGUF`,
//! `RLX_GEMMA3_GGUF`), falling back to the `rlx` model cache, and skips with a message
//! when the file is not there.

use rlx_gguf::{GgufFile, Tokenizer, TokenizerKind};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Instant;

struct Model {
    name: &'static str,
    env: &'static str,
    default_path: &'static str,
    kind: TokenizerKind,
}

const SMOLLM2: Model = Model {
    name: "smollm2",
    env: "RLX_SMOLLM2_GGUF",
    default_path: "SmolLM2-135M-Instruct.Q4_1.gguf",
    kind: TokenizerKind::Bpe,
};

const GEMMA3: Model = Model {
    name: "gemma3",
    env: "RLX_GEMMA3_GGUF",
    default_path: "gemma-3-270m-q4_k_m.gguf",
    kind: TokenizerKind::Spm,
};

/// Where `rlx` keeps the models it fetches (`rlx::hub::cache_dir`; `rlx fetch smollm2` fills it).
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RLX_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("rlx");
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rlx")
}

/// The tokenizer and golden file of `m`, or `None` (with a message) when either is absent.
fn load(m: &Model) -> Option<(Tokenizer, Value, Value)> {
    let path = std::env::var_os(m.env).map(PathBuf::from).unwrap_or_else(|| cache_dir().join(m.default_path));
    if !path.is_file() {
        println!("skipped: {} model file {} not found (set {} to its path)", m.name, path.display(), m.env);
        return None;
    }
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../rlx/tests/golden/llm/{}.json", m.name));
    let Ok(text) = std::fs::read_to_string(&golden) else {
        println!("skipped: {} reference file {} not found", m.name, golden.display());
        return None;
    };
    let golden: Value = serde_json::from_str(&text).expect("golden JSON parses");
    let extra = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/tokenizer_extra.json");
    let extra = std::fs::read_to_string(&extra).unwrap_or_else(|e| panic!("{}: {e}", extra.display()));
    let extra: Value = serde_json::from_str(&extra).expect("tokenizer_extra.json parses");
    let extra = extra["models"][m.name]["cases"].clone();
    assert!(extra.is_array(), "tokenizer_extra.json has no cases for {}", m.name);
    let f = GgufFile::open(&path).expect("model opens");
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer loads");
    println!("{}: tokenizer loaded in {:.1} ms", m.name, t0.elapsed().as_secs_f64() * 1e3);
    assert_eq!(tok.kind(), m.kind);
    Some((tok, golden, extra))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("an id list").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

/// Every reference of `m`'s golden file; panics listing every mismatch.
fn check(m: &Model) {
    let Some((tok, g, extra)) = load(m) else { return };
    let mut failures = Vec::new();
    let mut roundtrip_failures = Vec::new();
    let mut passed = 0;
    let mut expect = |what: String, got: Vec<u32>, want: Vec<u32>| {
        if got == want {
            passed += 1;
        } else {
            failures.push(format!("{what}\n      got  {got:?}\n      want {want:?}"));
        }
    };

    assert_eq!(tok.vocab_size() as u64, g["n_vocab"].as_u64().unwrap(), "vocabulary size");
    assert_eq!(tok.add_bos(), g["bos"].as_bool().unwrap(), "default BOS");
    assert_eq!(tok.bos_id().map(u64::from), g["bos_id"].as_u64(), "BOS id");
    assert_eq!(tok.eos_id().map(u64::from), g["eos_id"].as_u64(), "EOS id");
    let eog: Vec<u32> = (0..tok.vocab_size() as u32).filter(|&id| tok.is_eog(id)).collect();
    assert_eq!(eog, ids(&g["eog_ids"]), "end-of-generation tokens");

    let cases = g["tokenizer"].as_array().unwrap();
    let extra = extra.as_array().unwrap();
    let mut roundtrips = 0;
    for c in cases.iter().chain(extra) {
        let text = c["text"].as_str().unwrap();
        expect(format!("{text:?} special=true"), tok.encode(text, false, true), ids(&c["ids_special"]));
        let plain = tok.encode(text, false, false);
        // SentencePiece writes spaces as "▁", so a literal "▁" in the text comes back as a space.
        if m.kind == TokenizerKind::Bpe || !text.contains('▁') {
            roundtrips += 1;
            let back = tok.decode(&plain, false);
            if back != text {
                roundtrip_failures.push(format!("{text:?}: decode(encode(text)) gave {back:?}"));
            }
        }
        expect(format!("{text:?} special=false"), plain, ids(&c["ids_plain"]));
    }
    let mut prompts = 0;
    for case in g["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        expect(format!("prompt {prompt:?} (default BOS, special=true)"), tok.encode(prompt, true, true), ids(&case["prompt_ids"]));
        prompts += 1;
    }
    let forced = g["forced"]["text"].as_str().unwrap();
    expect("forced text (default BOS, special=true)".into(), tok.encode(forced, true, true), ids(&g["forced"]["ids"]));
    prompts += 1;

    let survived = roundtrips - roundtrip_failures.len();
    failures.extend(roundtrip_failures);
    println!(
        "{}: {passed}/{} reference tokenizations match ({} + {} strings x special/plain, {prompts} prompts); {survived}/{roundtrips} texts survive decode(encode(text))",
        m.name,
        2 * (cases.len() + extra.len()) + prompts,
        cases.len(),
        extra.len(),
    );
    assert!(failures.is_empty(), "{}: {} mismatches:\n  {}", m.name, failures.len(), failures.join("\n  "));
}

/// A long mixed text (every reference string, then the forced paragraph repeated) round-trips;
/// the time it takes is printed, not asserted (speed is a benchmark's business).
fn long_text(m: &Model) {
    let Some((tok, g, _)) = load(m) else { return };
    let mut text = String::new();
    let forced = g["forced"]["text"].as_str().unwrap();
    for case in g["tokenizer"].as_array().unwrap() {
        text.push_str(case["text"].as_str().unwrap());
    }
    while text.len() < 8000 {
        text.push_str(forced);
    }
    let t0 = Instant::now();
    let n = tok.encode(&text, true, true).len();
    let dt = t0.elapsed();
    println!("{}: {} chars -> {n} tokens in {:.2} ms", m.name, text.chars().count(), dt.as_secs_f64() * 1e3);
    let plain: String = g["forced"]["text"].as_str().unwrap().repeat(20);
    assert_eq!(tok.decode(&tok.encode(&plain, false, false), false), plain);
}

#[test]
fn smollm2_matches_llama_cpp() {
    check(&SMOLLM2);
}

#[test]
fn gemma3_matches_llama_cpp() {
    check(&GEMMA3);
}

#[test]
fn smollm2_long_text() {
    long_text(&SMOLLM2);
}

#[test]
fn gemma3_long_text() {
    long_text(&GEMMA3);
}
