//! Request parsing against a real tokenizer (feature `hub`: SmolLM2's), and the text stream.

use super::request::{parse_chat, parse_completion, parse_embeddings};
use super::stream::TextStream;
use super::Template;
use crate::llm::ChatTemplate;
use proptest::prelude::*;
use serde_json::{json, Value};

/// JSON values of every kind, nested a little.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u32>().prop_map(Value::from),
        any::<f64>().prop_map(|x| json!(x)),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("role".to_string()),
                        Just("content".to_string()),
                        Just("type".to_string()),
                        Just("text".to_string()),
                        "[a-z]{1,6}"
                    ],
                    inner
                ),
                0..4
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// The request fields, each given a random value or left out.
fn request() -> impl Strategy<Value = Value> {
    let keys = [
        "prompt",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "n",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "ignore_eos",
        "model",
        "input",
        "encoding_format",
        "dimensions",
    ];
    prop::collection::vec((0..keys.len(), value()), 0..8).prop_map(move |kv| {
        Value::Object(
            kv.into_iter()
                .map(|(k, v)| (keys[k].to_string(), v))
                .collect(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    /// Any body, valid JSON or not, parses or gives a 400; it never panics.
    #[test]
    fn request_bodies_parse_or_give_a_400(req in request(), junk in prop::collection::vec(any::<u8>(), 0..40)) {
        let tok = tokenizer();
        let t = Template::Known(ChatTemplate::detect(None, "llama"));
        for bytes in [serde_json::to_vec(&req).unwrap(), junk] {
            let parsed = [
                parse_completion(&bytes, tok).map(|_| ()),
                parse_chat(&bytes, tok, &t).map(|_| ()),
                parse_embeddings(&bytes).map(|_| ()),
            ];
            for r in parsed {
                if let Err(e) = r {
                    prop_assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
                    prop_assert!(!e.message.is_empty());
                }
            }
        }
    }
}

fn tokenizer() -> &'static rlx_gguf::Tokenizer {
    static T: std::sync::OnceLock<rlx_gguf::Tokenizer> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let path = crate::hub::ensure(crate::hub::KnownModel::SmolLM2, false).expect("model");
        let f = rlx_gguf::GgufFile::open(path).expect("opens");
        rlx_gguf::Tokenizer::from_gguf(&f).expect("tokenizer")
    })
}

#[test]
fn embedding_bodies_take_a_string_or_strings() {
    let ok = |v: Value| parse_embeddings(&serde_json::to_vec(&v).unwrap()).unwrap();
    let bad = |v: Value| parse_embeddings(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert_eq!(ok(json!({"input": "a"})).input, vec!["a"]);
    let r = ok(json!({"input": ["a", ""], "encoding_format": "base64", "model": "m"}));
    assert_eq!(r.input, vec!["a", ""]);
    assert!(r.base64);
    assert_eq!(bad(json!({})).param.as_deref(), Some("input"));
    assert!(bad(json!({"input": [1, 2]}))
        .message
        .contains("token-id input"));
    assert!(bad(json!({"input": []})).message.contains("empty"));
    assert_eq!(
        bad(json!({"input": "a", "encoding_format": "int8"}))
            .param
            .as_deref(),
        Some("encoding_format")
    );
    let many: Vec<&str> = vec!["x"; 2049];
    assert!(bad(json!({ "input": many }))
        .message
        .contains("at most 2048"));
}

#[test]
fn stop_strings_are_found_across_pieces_and_held_back() {
    let mut t = TextStream::new(vec!["END".into()]);
    assert_eq!(t.push(b"Hello E"), "Hello ");
    assert_eq!(t.push(b"N"), "");
    assert_eq!(t.push(b"Dless"), "");
    assert!(t.stopped);
    assert_eq!(t.text, "Hello ");
    // A held tail that turns out not to be a stop is sent.
    let mut t = TextStream::new(vec!["END".into()]);
    assert_eq!(t.push(b"an E"), "an ");
    assert_eq!(t.push(b"xit"), "Exit");
    assert!(!t.stopped);
}

#[test]
fn split_utf8_waits_for_its_end() {
    let mut t = TextStream::new(Vec::new());
    let e = "é".as_bytes();
    assert_eq!(t.push(&e[..1]), "");
    assert_eq!(t.push(&e[1..]), "é");
}
