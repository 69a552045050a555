//! The router itself on 127.0.0.1 (no model: a three-token vocabulary and no engine thread),
//! driven by raw HTTP: request errors, 404, 405 and 413 as OpenAI-shaped JSON.

use super::metrics::Metrics;
use super::request::{parse_chat, parse_completion};
use super::router::{router, ENDPOINTS, MAX_BODY};
use super::stream::TextStream;
use super::{Shared, Template};
use crate::llm::ChatTemplate;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A SentencePiece vocabulary of three tokens, as GGUF metadata.
fn tokenizer() -> rlx_gguf::Tokenizer {
    fn put_str(b: &mut Vec<u8>, s: &str) {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    }
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    put_str(&mut b, "tokenizer.ggml.model");
    b.extend_from_slice(&8u32.to_le_bytes());
    put_str(&mut b, "llama");
    put_str(&mut b, "tokenizer.ggml.tokens");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&3u64.to_le_bytes());
    for t in ["<unk>", "<s>", "</s>"] {
        put_str(&mut b, t);
    }
    let f = rlx_gguf::GgufFile::from_bytes(b).expect("test GGUF parses");
    rlx_gguf::Tokenizer::from_gguf(&f).expect("tokenizer")
}

fn template() -> Template {
    Template::Known(ChatTemplate::detect(None, "llama"))
}

/// The address of a server running [`router`] for the whole test binary.
fn server() -> &'static str {
    static ADDR: OnceLock<String> = OnceLock::new();
    ADDR.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // No engine: a request that gets as far as generating is a 500.
            let (cmd, _) = std::sync::mpsc::channel();
            let shared = Arc::new(Shared {
                cmd: Mutex::new(cmd),
                embedder: None,
                tokenizer: tokenizer(),
                template: template(),
                model: "test".into(),
                max_seq: 64,
                created: 0,
                metrics: Mutex::new(Metrics::default()),
            });
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("binds");
                tx.send(listener.local_addr().expect("address").to_string())
                    .expect("sends the address");
                axum::serve(listener, router(shared)).await.expect("serves");
            });
        });
        rx.recv().expect("the server starts")
    })
}

/// A response: status, headers (lower-cased names) and body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as OpenAI's error shape (checking every key and the content type); the
    /// error object.
    fn error(&self) -> Value {
        let what = format!("{} {:?}", self.status, self.body);
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{what}"
        );
        let v: Value = serde_json::from_str(&self.body).expect(&what);
        let e = v["error"].as_object().expect(&what);
        let mut keys: Vec<&str> = e.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["code", "message", "param", "type"], "{what}");
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
        assert_eq!(e["type"], "invalid_request_error", "{what}");
        assert!(v.as_object().is_some_and(|o| o.len() == 1), "{what}");
        v["error"].clone()
    }
}

/// Send `head` (the request line and headers, without the blank line) and `body` from
/// another thread, ignoring write errors (a server may answer and close before reading a
/// body it refuses); read the reply.
fn send(head: String, body: Vec<u8>) -> Reply {
    let mut s = TcpStream::connect(server()).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let mut w = s.try_clone().expect("clones");
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes());
        let _ = w.write_all(&body);
    });
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // A reset after the reply (the refused body still coming) ends it too.
            Err(_) if !raw.is_empty() => break,
            Err(e) => panic!("reads: {e}"),
        }
    }
    let _ = writer.join();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a full reply");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

fn request(method: &str, path: &str, body: &str) -> Reply {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}",
        body.len()
    );
    send(head, body.as_bytes().to_vec())
}

/// `body` to `path` is a 400 whose `param` is `param` and whose message has `want`.
fn assert_400(path: &str, body: Value, param: &str, want: &str) {
    let r = request("POST", path, &body.to_string());
    assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
    let e = r.error();
    assert_eq!(e["param"], param, "{path} {body}: {e}");
    assert_eq!(e["code"], Value::Null, "{e}");
    let msg = e["message"].as_str().unwrap_or("");
    assert!(msg.contains(want), "{path} {body}: {msg}");
}

#[test]
fn top_p_out_of_range_is_a_400_naming_it() {
    let chat = json!([{"role": "user", "content": "hi"}]);
    for top_p in [json!(5), json!(1.5), json!(-0.1), json!(-1)] {
        assert_400(
            "/v1/chat/completions",
            json!({"messages": chat, "top_p": top_p}),
            "top_p",
            &format!("`top_p` must be between 0 and 1, got {top_p}"),
        );
        assert_400(
            "/v1/completions",
            json!({"prompt": "hi", "top_p": top_p}),
            "top_p",
            "`top_p` must be between 0 and 1",
        );
    }
    // The ends of the range are taken.
    let tok = tokenizer();
    for top_p in [0.0, 1.0] {
        let b = json!({"prompt": "a", "top_p": top_p}).to_string();
        let (_, o) = parse_completion(b.as_bytes(), &tok).expect("in range");
        assert_eq!(o.params.sampler.top_p, top_p as f32);
    }
}

#[test]
fn sampling_fields_out_of_openai_ranges_are_400s_naming_them() {
    let cases = [
        ("temperature", json!(2.5), "between 0 and 2"),
        ("temperature", json!(-1), "between 0 and 2"),
        ("presence_penalty", json!(2.5), "between -2 and 2"),
        ("frequency_penalty", json!(-3), "between -2 and 2"),
        ("min_p", json!(1.5), "between 0 and 1"),
        ("repeat_penalty", json!(0), "greater than 0"),
        ("n", json!(0), "at least 1"),
        ("n", json!(2), "not supported"),
        ("max_tokens", json!(0), "at least 1"),
        ("max_tokens", json!(-5), "non-negative integer"),
        ("seed", json!(1.5), "an integer"),
    ];
    for (k, v, want) in cases {
        let mut b = json!({"prompt": "hi"});
        b[k] = v.clone();
        assert_400("/v1/completions", b, k, want);
    }
    // Both chat spellings of the limit are checked, whichever is used.
    let chat = json!([{"role": "user", "content": "hi"}]);
    assert_400(
        "/v1/chat/completions",
        json!({"messages": chat, "max_tokens": 0, "max_completion_tokens": 4}),
        "max_tokens",
        "at least 1",
    );
    // In range (the ends included) parses; OpenAI's seeds may be negative.
    let tok = tokenizer();
    let ok = json!({"prompt": "a", "temperature": 2, "presence_penalty": -2,
                    "frequency_penalty": 2, "min_p": 0, "seed": -1, "n": 1});
    let (_, o) = parse_completion(ok.to_string().as_bytes(), &tok).expect("in range");
    assert_eq!(o.params.sampler.temperature, 2.0);
    assert_eq!(o.params.sampler.seed, u64::MAX);
}

#[test]
fn an_unknown_role_is_a_400_naming_messages_i_role() {
    assert_400(
        "/v1/chat/completions",
        json!({"messages": [{"role": "wizard", "content": "hi"}]}),
        "messages[0].role",
        r#"`role` "wizard" is not one of "system", "user", "assistant", "tool", "developer""#,
    );
    assert_400(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}, {"role": "User", "content": "x"}]}),
        "messages[1].role",
        r#""User" is not one of"#,
    );
    assert_400(
        "/v1/chat/completions",
        json!({"messages": [{"content": "hi"}]}),
        "messages[0].role",
        "`role` must be a string",
    );
    assert_400(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": 7}]}),
        "messages[0].content",
        "`content` must be",
    );
    // Every OpenAI role renders.
    let tok = tokenizer();
    for role in ["system", "user", "assistant", "tool", "developer"] {
        let b = json!({"messages": [{"role": role, "content": "a"}]}).to_string();
        parse_chat(b.as_bytes(), &tok, &template()).expect(role);
    }
}

#[test]
fn an_unknown_path_is_a_json_404() {
    for (method, path) in [
        ("GET", "/v1/nonexistent"),
        ("POST", "/v1/chat/completion"),
        ("GET", "/"),
    ] {
        let r = request(method, path, "");
        assert_eq!(r.status, 404, "{method} {path}: {}", r.body);
        let e = r.error();
        assert_eq!(e["param"], Value::Null);
        let msg = e["message"].as_str().unwrap_or("");
        assert!(msg.contains(&format!("`{method} {path}`")), "{msg}");
        assert!(msg.contains("POST /v1/chat/completions"), "{msg}");
    }
}

#[test]
fn a_wrong_method_is_a_json_405_with_allow() {
    for (method, path, allow) in [
        ("GET", "/v1/chat/completions", "POST"),
        ("DELETE", "/v1/completions", "POST"),
        ("POST", "/v1/models", "GET"),
    ] {
        let r = request(method, path, "");
        assert_eq!(r.status, 405, "{method} {path}: {}", r.body);
        let e = r.error();
        assert_eq!(e["param"], Value::Null);
        let msg = e["message"].as_str().unwrap_or("");
        assert!(msg.contains(&format!("`{method} {path}`")), "{msg}");
        assert!(msg.contains(&format!("takes {allow}")), "{msg}");
        let got = r.header("allow").unwrap_or("");
        assert!(got.split(',').any(|m| m.trim() == allow), "Allow: {got}");
    }
}

#[test]
fn an_oversized_body_is_a_json_413() {
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(MAX_BODY + 1));
    for path in ["/v1/completions", "/v1/chat/completions", "/v1/embeddings"] {
        let r = request("POST", path, &big);
        assert_eq!(r.status, 413, "{path}: {}", r.body);
        let e = r.error();
        assert_eq!(e["param"], Value::Null);
        let msg = e["message"].as_str().unwrap_or("");
        assert!(msg.contains(&format!("limit of {MAX_BODY} bytes")), "{msg}");
    }
    // Chunked, with no length given up front.
    let mut body = Vec::new();
    for _ in 0..3 {
        let chunk = "a".repeat(MAX_BODY / 2);
        body.extend_from_slice(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let head = "POST /v1/completions HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked";
    let r = send(head.to_string(), body);
    assert_eq!(r.status, 413, "{}", r.body);
    r.error();
    // A body just under the limit is read (and then found wanting).
    let fits = format!(
        "{{\"prompt\": 1, \"x\": \"{}\"}}",
        "a".repeat(MAX_BODY - 100)
    );
    let r = request("POST", "/v1/completions", &fits);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error()["param"], "prompt");
}

#[test]
fn every_endpoint_is_routed_by_its_method() {
    for (method, path) in ENDPOINTS {
        let r = request(method, path, "{}");
        assert!(
            ![404, 405].contains(&r.status),
            "{method} {path}: {} {}",
            r.status,
            r.body
        );
    }
}

#[test]
fn stop_strings_are_searched_from_a_character_boundary() {
    // The new text's search starts one byte before its end, inside "é".
    let mut t = TextStream::new(vec!["x".into()]);
    assert_eq!(t.push("é".as_bytes()), "é");
    assert_eq!(t.push(b"ax"), "a");
    assert!(t.stopped);
    let mut t = TextStream::new(vec!["éa".into(), "zz".into()]);
    assert_eq!(t.push("日é".as_bytes()), "日");
    assert_eq!(t.push(b"a"), "");
    assert!(t.stopped);
    assert_eq!(t.text, "日");
}
