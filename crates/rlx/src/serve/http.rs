//! The OpenAI-compatible HTTP server (`rlx serve`): one engine thread owns the [`Engine`] and
//! steps it; the HTTP work (parsing, chat templates, detokenizing, stop strings, server-sent
//! events) runs on tokio's threads and talks to it over channels.
//!
//! Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both with `stream`),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus), `POST /tokenize`,
//! `POST /detokenize`. Bad requests (malformed bodies, fields of the wrong type or out of range,
//! unknown paths, wrong methods, bodies over [`MAX_BODY`]) get a 4xx with an OpenAI-shaped
//! error body; a full queue gets 503 with `Retry-After`; a client that goes away frees its
//! sequence at the next step.

use super::engine::{Engine, EngineStats, Event, Finish, GenParams, TokenLogprobs};
use crate::llm::{ChatMessage, ChatTemplate, JinjaTemplate, SamplerConfig};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use rlx_gguf::Tokenizer;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc as tmpsc, oneshot};

/// Where and as what to serve.
pub struct ServerOptions {
    /// Address to bind.
    pub host: String,
    /// Port (0: any free port; the bound address is printed).
    pub port: u16,
    /// The model's name in responses and `/v1/models`.
    pub model_name: String,
    /// A sentence encoder answering `POST /v1/embeddings` (none: that endpoint says how to
    /// start one).
    pub embedder: Option<crate::embed::Embedder>,
}

/// How prompts of chat requests are written.
enum Template {
    /// The model's own Jinja template.
    Jinja(Box<JinjaTemplate>),
    /// A known format, for models without a template.
    Known(ChatTemplate),
}

/// A request for the engine thread.
enum Cmd {
    Submit {
        prompt: Vec<u32>,
        params: GenParams,
        events: tmpsc::UnboundedSender<Msg>,
        reply: oneshot::Sender<Submitted>,
    },
}

enum Submitted {
    Accepted,
    Busy,
    Invalid(String),
}

/// What the engine thread sends a request's handler.
enum Msg {
    Event(Event),
    Failed(String),
}

/// Latency histogram in Prometheus form (cumulative buckets, seconds).
#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    n: u64,
}

const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Histogram {
    fn observe(&mut self, secs: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if secs <= b {
                *c += 1;
            }
        }
        self.sum += secs;
        self.n += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        use std::fmt::Write;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.n);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.n);
    }
}

#[derive(Default)]
struct Metrics {
    engine: EngineStats,
    requests: u64,
    rejected: u64,
    ttft: Histogram,
    itl: Histogram,
}

struct Shared {
    cmd: Mutex<mpsc::Sender<Cmd>>,
    /// The encoder of `/v1/embeddings` (one request embeds at a time).
    embedder: Option<Arc<Mutex<crate::embed::Embedder>>>,
    tokenizer: Tokenizer,
    template: Template,
    model: String,
    max_seq: usize,
    created: u64,
    metrics: Mutex<Metrics>,
}

type Shared_ = Arc<Shared>;

/// An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<String>,
}

impl ApiError {
    fn bad(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: param.map(str::to_string),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::SERVICE_UNAVAILABLE => "server_busy",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        let body = json!({"error": {
            "message": self.message, "type": kind, "param": self.param, "code": Value::Null
        }});
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// Serve `engine` until the process is stopped (Ctrl-C). Prints the address it listens on.
pub fn run(engine: Engine, opts: ServerOptions) -> rlx_ir::Result<()> {
    let err = |e: std::io::Error| rlx_ir::Error::Invalid(format!("server: {e}"));
    let tokenizer = engine.tokenizer.clone();
    let text = |id: Option<u32>| {
        id.and_then(|i| tokenizer.token_str(i))
            .unwrap_or("")
            .to_string()
    };
    let template = match &engine.chat_template {
        Some(src) => Template::Jinja(Box::new(
            JinjaTemplate::new(src, &text(tokenizer.bos_id()), &text(tokenizer.eos_id()))
                .map_err(rlx_ir::Error::Invalid)?,
        )),
        None => Template::Known(ChatTemplate::detect(None, &engine.config.arch_name)),
    };
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Shared {
        cmd: Mutex::new(tx),
        embedder: opts.embedder.map(|e| Arc::new(Mutex::new(e))),
        tokenizer: tokenizer.clone(),
        template,
        model: opts.model_name.clone(),
        max_seq: engine.max_seq_len(),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        metrics: Mutex::default(),
    });
    let for_engine = shared.clone();
    std::thread::Builder::new()
        .name("rlx-engine".into())
        .spawn(move || engine_loop(engine, rx, for_engine))
        .map_err(err)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_io()
        .enable_time()
        .build()
        .map_err(err)?;
    rt.block_on(async move {
        let app = router(shared);
        let listener = tokio::net::TcpListener::bind((opts.host.as_str(), opts.port))
            .await
            .map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        println!("rlx serve: listening on http://{addr}");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(err)
    })
}

/// The endpoints, as (method, path): what [`router`] routes, and what the 404 and 405 errors
/// list.
const ENDPOINTS: [(&str, &str); 8] = [
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("GET", "/metrics"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/embeddings"),
];

/// The largest request body taken, in bytes (2 MiB); a larger one gets a 413.
const MAX_BODY: usize = 2 << 20;

/// The endpoints of [`ENDPOINTS`], with OpenAI-shaped errors for unknown paths (404), wrong
/// methods (405, with `Allow`) and bodies over [`MAX_BODY`] (413).
fn router(shared: Shared_) -> Router {
    Router::new()
        .route(
            "/health",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(embeddings))
        // After the routes: it applies to the routes added so far.
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared)
}

/// `METHOD /path` of every endpoint, for error messages.
fn endpoint_list() -> String {
    ENDPOINTS
        .iter()
        .map(|(m, p)| format!("{m} {p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "no endpoint at `{method} {}`; this server has {}",
            uri.path(),
            endpoint_list()
        ),
        param: None,
    }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    let path = uri.path();
    let takes: Vec<&str> = ENDPOINTS
        .iter()
        .filter(|(_, p)| *p == path)
        .map(|(m, _)| *m)
        .collect();
    let message = if takes.is_empty() {
        format!("`{method} {path}`: method not allowed")
    } else {
        format!(
            "`{method} {path}`: method not allowed; `{path}` takes {}",
            takes.join(" or ")
        )
    };
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message,
        param: None,
    }
}

/// The raw request body, read up to [`MAX_BODY`]; a larger body (413) or one that cannot be
/// read is an OpenAI-shaped error with the rejection's status.
struct RawBody(Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(req, state)
            .await
            .map(RawBody)
            .map_err(|r| {
                let status = r.status();
                let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    format!("the request body is larger than the limit of {MAX_BODY} bytes")
                } else {
                    format!("the request body could not be read: {}", r.body_text())
                };
                ApiError {
                    status,
                    message,
                    param: None,
                }
            })
    }
}

/// The engine thread: take requests, step while there is work, hand each event to its
/// request, cancel requests whose handler went away.
fn engine_loop(mut engine: Engine, rx: mpsc::Receiver<Cmd>, shared: Shared_) {
    let mut senders: HashMap<u64, tmpsc::UnboundedSender<Msg>> = HashMap::new();
    let mut known = 0u64;
    loop {
        let first = if engine.has_work() {
            rx.try_recv().ok()
        } else {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        };
        for cmd in first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
        {
            match cmd {
                Cmd::Submit {
                    prompt,
                    params,
                    events,
                    reply,
                } => {
                    if engine.stats().waiting >= engine.max_waiting() {
                        let _ = reply.send(Submitted::Busy);
                        continue;
                    }
                    match engine.submit(prompt, params) {
                        Ok(id) => {
                            senders.insert(id, events);
                            known = known.max(id + 1);
                            let _ = reply.send(Submitted::Accepted);
                        }
                        Err(e) => {
                            let _ = reply.send(Submitted::Invalid(e.to_string()));
                        }
                    }
                }
            }
        }
        senders.retain(|&id, tx| {
            let gone = tx.is_closed();
            if gone {
                engine.cancel(id);
            }
            !gone
        });
        match engine.step() {
            Ok(events) => {
                for e in events {
                    let (id, done) = (e.id, e.finish.is_some());
                    let delivered = senders
                        .get(&id)
                        .is_some_and(|tx| tx.send(Msg::Event(e)).is_ok());
                    if done || !delivered {
                        senders.remove(&id);
                        if !done {
                            engine.cancel(id);
                        }
                    }
                }
            }
            Err(e) => {
                for (id, tx) in senders.drain() {
                    let _ = tx.send(Msg::Failed(e.to_string()));
                    engine.cancel(id);
                }
            }
        }
        if let Ok(mut m) = shared.metrics.lock() {
            m.engine = engine.stats();
        }
    }
}

async fn models(State(s): State<Shared_>) -> impl IntoResponse {
    let mut data = vec![json!({
        "id": s.model, "object": "model", "created": s.created, "owned_by": "rlx",
        "meta": {"max_seq_len": s.max_seq}
    })];
    if let Some(e) = &s.embedder {
        let e = e.lock().unwrap_or_else(|e| e.into_inner());
        data.push(json!({
            "id": e.name(), "object": "model", "created": s.created, "owned_by": "rlx",
            "meta": {"max_seq_len": e.config().max_length, "dim": e.dim(), "kind": "embedding"}
        }));
    }
    axum::Json(json!({"object": "list", "data": data}))
}

/// A `/v1/embeddings` body: the texts and whether vectors go back as base64.
#[derive(Debug)]
struct EmbedRequest {
    input: Vec<String>,
    base64: bool,
    dimensions: Option<u64>,
}

/// Most texts one `/v1/embeddings` request may carry (OpenAI's limit).
const MAX_EMBED_INPUTS: usize = 2048;

fn parse_embeddings(bytes: &[u8]) -> Result<EmbedRequest, ApiError> {
    let b = body(bytes)?;
    let f = Fields(&b);
    let must = "`input` must be a string or a list of strings";
    let input = match b.get("input") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::bad("`input` is an empty list", Some("input")))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect(),
        Some(Value::Array(a)) if a.iter().all(|v| v.is_u64() || v.is_array()) => {
            return Err(ApiError::bad(
                format!("{must}; token-id input is not supported (send the text)"),
                Some("input"),
            ))
        }
        Some(_) => return Err(ApiError::bad(must, Some("input"))),
        None => {
            return Err(ApiError::bad(
                "`input` (a string or a list of strings) is required",
                Some("input"),
            ))
        }
    };
    if input.len() > MAX_EMBED_INPUTS {
        return Err(ApiError::bad(
            format!(
                "`input` has {} texts; at most {MAX_EMBED_INPUTS} per request",
                input.len()
            ),
            Some("input"),
        ));
    }
    let base64 = match f.string("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad(
                format!("`encoding_format` \"{other}\" is not one of \"float\", \"base64\""),
                Some("encoding_format"),
            ))
        }
    };
    let dimensions = match b.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            ApiError::bad(
                "`dimensions` must be a positive integer",
                Some("dimensions"),
            )
        })?),
    };
    f.string("model")?;
    Ok(EmbedRequest {
        input,
        base64,
        dimensions,
    })
}

async fn embeddings(
    State(s): State<Shared_>,
    RawBody(bytes): RawBody,
) -> Result<Response, ApiError> {
    let req = parse_embeddings(&bytes)?;
    let Some(enc) = s.embedder.clone() else {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: "this server has no embedding model; start it with `rlx serve \
                      --embedding-model minilm` (or a model directory)"
                .into(),
            param: Some("model".into()),
        });
    };
    let work = tokio::task::spawn_blocking(move || {
        let mut e = enc.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = req.dimensions {
            if d != e.dim() as u64 {
                return Err(ApiError::bad(
                    format!(
                        "`dimensions` {d}: {} gives {}-dimensional vectors and cannot shorten them",
                        e.name(),
                        e.dim()
                    ),
                    Some("dimensions"),
                ));
            }
        }
        let refs: Vec<&str> = req.input.iter().map(String::as_str).collect();
        let server = |err: rlx_ir::Error| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: err.to_string(),
            param: None,
        };
        let (vecs, tokens) = e.embed_counting(&refs).map_err(server)?;
        Ok((e.name().to_string(), tokens, vecs, req.base64))
    });
    let (model, tokens, vecs, b64) = work.await.map_err(|e| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: format!("the embedding task failed: {e}"),
        param: None,
    })??;
    let data: Vec<Value> = vecs
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if b64 {
                use base64::Engine as _;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list", "data": data, "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}
    }))
    .into_response())
}

async fn metrics(State(s): State<Shared_>) -> impl IntoResponse {
    use std::fmt::Write;
    let m = s.metrics.lock().unwrap_or_else(|e| e.into_inner());
    let e = &m.engine;
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, v: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    put(
        "rlx_requests_total",
        "counter",
        "Requests accepted.",
        m.requests as f64,
    );
    put(
        "rlx_requests_rejected_total",
        "counter",
        "Requests refused because the queue was full.",
        m.rejected as f64,
    );
    put(
        "rlx_requests_running",
        "gauge",
        "Sequences being computed.",
        e.running as f64,
    );
    put(
        "rlx_requests_waiting",
        "gauge",
        "Requests waiting for a slot (queue depth).",
        e.waiting as f64,
    );
    put(
        "rlx_prompt_tokens_total",
        "counter",
        "Prompt tokens computed (prefix-cache hits excluded).",
        e.prompt_tokens as f64,
    );
    put(
        "rlx_generated_tokens_total",
        "counter",
        "Tokens generated.",
        e.generated_tokens as f64,
    );
    put(
        "rlx_kv_blocks_in_use",
        "gauge",
        "KV-cache blocks held by sequences.",
        e.blocks_in_use as f64,
    );
    put(
        "rlx_kv_blocks_total",
        "gauge",
        "KV-cache blocks in the pool.",
        e.blocks as f64,
    );
    put(
        "rlx_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        e.pool.prefix_hit_tokens as f64,
    );
    put(
        "rlx_preemptions_total",
        "counter",
        "Sequences preempted for lack of KV blocks.",
        e.preemptions as f64,
    );
    put(
        "rlx_steps_total",
        "counter",
        "Forward passes run.",
        e.steps as f64,
    );
    put(
        "rlx_prefill_steps_total",
        "counter",
        "Forward passes that computed prompt tokens.",
        e.prefill_steps as f64,
    );
    put(
        "rlx_step_graphs_compiled_total",
        "counter",
        "Step graphs compiled (one per new step shape; at load included).",
        e.compiles as f64,
    );
    put(
        "rlx_step_graph_compile_seconds_total",
        "counter",
        "Time spent compiling step graphs while serving.",
        e.compile_us as f64 / 1e6,
    );
    put(
        "rlx_prompt_pieces_total",
        "counter",
        "Prompt pieces computed (several sequences' pieces may share a forward pass).",
        e.prompt_pieces as f64,
    );
    m.ttft.write(
        &mut out,
        "rlx_time_to_first_token_seconds",
        "Time from request to first token.",
    );
    m.itl.write(
        &mut out,
        "rlx_inter_token_latency_seconds",
        "Time between a request's tokens.",
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

/// The request body as a JSON object, or a 400 saying what is wrong with it.
fn body(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad(
            "the request body must be a JSON object",
            None,
        )),
        Err(e) => Err(ApiError::bad(
            format!("the request body is not valid JSON: {e}"),
            None,
        )),
    }
}

/// Typed access to optional fields, each wrong type a 400 naming the field.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn uint(&self, k: &str) -> Result<Option<u64>, ApiError> {
        self.get(k)
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    ApiError::bad(
                        format!("`{k}` must be a non-negative integer, got {v}"),
                        Some(k),
                    )
                })
            })
            .transpose()
    }

    fn float(&self, k: &str) -> Result<Option<f32>, ApiError> {
        self.get(k)
            .map(|v| {
                v.as_f64()
                    .filter(|x| x.is_finite())
                    .map(|x| x as f32)
                    .ok_or_else(|| {
                        ApiError::bad(format!("`{k}` must be a number, got {v}"), Some(k))
                    })
            })
            .transpose()
    }

    /// A number in `lo..=hi` (OpenAI's range for the field).
    fn float_in(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        let x = self.float(k)?;
        match (self.get(k), self.get(k).and_then(Value::as_f64)) {
            (Some(v), Some(n)) if !(lo..=hi).contains(&n) => Err(ApiError::bad(
                format!("`{k}` must be between {lo} and {hi}, got {v}"),
                Some(k),
            )),
            _ => Ok(x),
        }
    }

    /// Any integer (OpenAI's `seed` may be negative); a negative one is taken as its two's
    /// complement.
    fn int(&self, k: &str) -> Result<Option<u64>, ApiError> {
        self.get(k)
            .map(|v| {
                v.as_u64()
                    .or_else(|| v.as_i64().map(|x| x as u64))
                    .ok_or_else(|| {
                        ApiError::bad(format!("`{k}` must be an integer, got {v}"), Some(k))
                    })
            })
            .transpose()
    }

    fn boolean(&self, k: &str) -> Result<Option<bool>, ApiError> {
        self.get(k)
            .map(|v| {
                v.as_bool().ok_or_else(|| {
                    ApiError::bad(format!("`{k}` must be true or false, got {v}"), Some(k))
                })
            })
            .transpose()
    }

    fn string(&self, k: &str) -> Result<Option<&str>, ApiError> {
        self.get(k)
            .map(|v| {
                v.as_str().ok_or_else(|| {
                    ApiError::bad(format!("`{k}` must be a string, got {v}"), Some(k))
                })
            })
            .transpose()
    }
}

/// What both completion endpoints take besides the prompt.
struct Options {
    params: GenParams,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
    /// Log-probabilities: none, or the chosen token's with this many alternatives.
    logprobs: Option<usize>,
}

fn options(f: &Fields, chat: bool) -> Result<Options, ApiError> {
    match f.uint("n")? {
        Some(0) => return Err(ApiError::bad("`n` must be at least 1", Some("n"))),
        Some(n) if n != 1 => return Err(ApiError::bad(
            "`n` other than 1 is not supported; send the request n times (with different seeds)",
            Some("n"),
        )),
        _ => {}
    }
    let d = SamplerConfig::default();
    let max_key = if chat && f.get("max_completion_tokens").is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let repeat_penalty = f.float("repeat_penalty")?;
    if let Some(r) = repeat_penalty.filter(|&r| r <= 0.0) {
        return Err(ApiError::bad(
            format!("`repeat_penalty` must be greater than 0 (1: off), got {r}"),
            Some("repeat_penalty"),
        ));
    }
    // OpenAI's ranges; `min_p` (an extension) is a fraction like `top_p`.
    let sampler = SamplerConfig {
        temperature: f
            .float_in("temperature", 0.0, 2.0)?
            .unwrap_or(d.temperature),
        top_k: f.uint("top_k")?.map_or(d.top_k, |v| v as usize),
        top_p: f.float_in("top_p", 0.0, 1.0)?.unwrap_or(d.top_p),
        min_p: f.float_in("min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        repeat_penalty: repeat_penalty.unwrap_or(d.repeat_penalty),
        presence_penalty: f.float_in("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: f.float_in("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        seed: f.int("seed")?.unwrap_or(d.seed),
        ..d
    };
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::bad("`stop` must be a string or a list of strings", Some("stop"))
            })?,
        Some(v) => {
            return Err(ApiError::bad(
                format!("`stop` must be a string or a list of strings, got {v}"),
                Some("stop"),
            ))
        }
    };
    let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
    let logprobs = if chat {
        match (f.boolean("logprobs")?, f.uint("top_logprobs")?) {
            (Some(true), n) => Some(n.unwrap_or(0).min(20) as usize),
            (_, Some(_)) => {
                return Err(ApiError::bad(
                    "`top_logprobs` needs `logprobs: true`",
                    Some("top_logprobs"),
                ))
            }
            _ => None,
        }
    } else {
        f.uint("logprobs")?.map(|n| n.min(20) as usize)
    };
    let max_keys: &[&str] = if chat {
        &["max_tokens", "max_completion_tokens"]
    } else {
        &["max_tokens"]
    };
    for &k in max_keys {
        if f.uint(k)? == Some(0) {
            return Err(ApiError::bad(format!("`{k}` must be at least 1"), Some(k)));
        }
    }
    let include_usage = match f.get("stream_options") {
        Some(Value::Object(o)) => Fields(o).boolean("include_usage")?.unwrap_or(false),
        Some(v) => {
            return Err(ApiError::bad(
                format!("`stream_options` must be an object, got {v}"),
                Some("stream_options"),
            ))
        }
        None => false,
    };
    Ok(Options {
        params: GenParams {
            max_tokens: f
                .uint(max_key)?
                .map_or(if chat { usize::MAX } else { 16 }, |v| v as usize),
            sampler,
            // llama-server's extension: generate past end-of-generation tokens.
            stop_at_eog: !f.boolean("ignore_eos")?.unwrap_or(false),
            logprobs,
        },
        stop,
        stream: f.boolean("stream")?.unwrap_or(false),
        include_usage,
        logprobs,
    })
}

async fn tokenize(State(s): State<Shared_>, RawBody(bytes): RawBody) -> Result<Response, ApiError> {
    let b = body(&bytes)?;
    let f = Fields(&b);
    let text = f.string("content")?.ok_or_else(|| {
        ApiError::bad(
            "`content` (the text to tokenize) is required",
            Some("content"),
        )
    })?;
    let add = f.boolean("add_special")?.unwrap_or(false);
    let ids = s.tokenizer.encode(text, add && s.tokenizer.add_bos(), true);
    Ok(axum::Json(json!({"tokens": ids})).into_response())
}

async fn detokenize(
    State(s): State<Shared_>,
    RawBody(bytes): RawBody,
) -> Result<Response, ApiError> {
    let b = body(&bytes)?;
    let ids =
        token_list(b.get("tokens"), "tokens", s.tokenizer.vocab_size())?.ok_or_else(|| {
            ApiError::bad("`tokens` (a list of token ids) is required", Some("tokens"))
        })?;
    Ok(axum::Json(json!({"content": s.tokenizer.decode(&ids, false)})).into_response())
}

/// A list of token ids (`None` when `v` is not a list of integers), each checked.
fn token_list(v: Option<&Value>, key: &str, vocab: usize) -> Result<Option<Vec<u32>>, ApiError> {
    let Some(Value::Array(a)) = v else {
        return Ok(None);
    };
    if !a.iter().all(Value::is_u64) {
        return Ok(None);
    }
    a.iter()
        .map(|x| {
            let t = x.as_u64().unwrap_or(u64::MAX);
            if (t as usize) < vocab {
                Ok(t as u32)
            } else {
                Err(ApiError::bad(
                    format!("token id {t} in `{key}` is outside the {vocab}-token vocabulary"),
                    Some(key),
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

async fn completions(
    State(s): State<Shared_>,
    RawBody(bytes): RawBody,
) -> Result<Response, ApiError> {
    let (prompt, opts) = parse_completion(&bytes, &s.tokenizer)?;
    generate(s, prompt, opts, Kind::Text).await
}

/// A `/v1/completions` body: the prompt's tokens and the options.
fn parse_completion(bytes: &[u8], tok: &Tokenizer) -> Result<(Vec<u32>, Options), ApiError> {
    let b = body(bytes)?;
    let f = Fields(&b);
    let opts = options(&f, false)?;
    let vocab = tok.vocab_size();
    let prompt = match b.get("prompt") {
        Some(Value::String(t)) => tok.encode(t, tok.add_bos(), true),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            tok.encode(a[0].as_str().unwrap_or(""), tok.add_bos(), true)
        }
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_array() => token_list(a.first(), "prompt", vocab)?
            .ok_or_else(|| ApiError::bad("`prompt` must be a string or a list of token ids", Some("prompt")))?,
        v @ Some(Value::Array(_)) => token_list(v, "prompt", vocab)?.ok_or_else(|| {
            ApiError::bad(
                "`prompt` must be one string or one list of token ids (several prompts: send several requests)",
                Some("prompt"),
            )
        })?,
        _ => return Err(ApiError::bad("`prompt` (a string) is required", Some("prompt"))),
    };
    Ok((prompt, opts))
}

async fn chat_completions(
    State(s): State<Shared_>,
    RawBody(bytes): RawBody,
) -> Result<Response, ApiError> {
    let (prompt, opts) = parse_chat(&bytes, &s.tokenizer, &s.template)?;
    generate(s, prompt, opts, Kind::Chat).await
}

/// The roles a chat message may have (OpenAI's, less the deprecated `function`).
const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

/// A `/v1/chat/completions` body: the rendered conversation's tokens and the options.
fn parse_chat(
    bytes: &[u8],
    tok: &Tokenizer,
    template: &Template,
) -> Result<(Vec<u32>, Options), ApiError> {
    let b = body(bytes)?;
    let f = Fields(&b);
    let opts = options(&f, true)?;
    let Some(Value::Array(msgs)) = b.get("messages") else {
        return Err(ApiError::bad(
            "`messages` (a list of {role, content}) is required",
            Some("messages"),
        ));
    };
    let mut messages = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let bad = |what: &str, part: &str| {
            let param = format!("messages[{i}]{part}");
            ApiError::bad(format!("messages[{i}]: {what}"), Some(&param))
        };
        let Value::Object(o) = m else {
            return Err(bad("must be an object", ""));
        };
        let role = o
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("`role` must be a string", ".role"))?;
        if !ROLES.contains(&role) {
            let allowed = ROLES.map(|r| format!("\"{r}\"")).join(", ");
            return Err(bad(
                &format!("`role` \"{role}\" is not one of {allowed}"),
                ".role",
            ));
        }
        let bad = |what: &str| bad(what, ".content");
        let content = match o.get("content") {
            Some(Value::String(t)) => t.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| {
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => Ok(t),
                        _ => Err(bad("only text content parts are supported")),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
            None | Some(Value::Null) => String::new(),
            Some(_) => return Err(bad("`content` must be a string or a list of text parts")),
        };
        messages.push(ChatMessage::new(role, &content));
    }
    if messages.is_empty() {
        return Err(ApiError::bad("`messages` is empty", Some("messages")));
    }
    let text = match template {
        Template::Jinja(t) => t
            .render(&messages, true)
            .map_err(|e| ApiError::bad(e, Some("messages")))?,
        Template::Known(t) => t.render(&messages),
    };
    // A template that writes the BOS token itself gets no second one.
    let bos_text = tok.bos_id().and_then(|i| tok.token_str(i)).unwrap_or("");
    let add_bos = tok.add_bos() && (bos_text.is_empty() || !text.starts_with(bos_text));
    Ok((tok.encode(&text, add_bos, true), opts))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Chat,
}

/// Text decoded from tokens as they come: UTF-8 sequences split across tokens wait for their
/// end; stop strings are found across token boundaries, and text that could begin one is held
/// back until it cannot.
struct TextStream {
    bytes: Vec<u8>,
    text: String,
    sent: usize,
    stop: Vec<String>,
    stopped: bool,
}

impl TextStream {
    fn new(stop: Vec<String>) -> TextStream {
        TextStream {
            bytes: Vec::new(),
            text: String::new(),
            sent: 0,
            stop,
            stopped: false,
        }
    }

    /// Add a token's bytes; returns the text that is now safe to send.
    fn push(&mut self, tok: &[u8]) -> String {
        self.bytes.extend_from_slice(tok);
        let valid = match std::str::from_utf8(&self.bytes) {
            Ok(_) => self.bytes.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // Invalid bytes (not a split sequence) are replaced, as the tokenizer's decode does.
            Err(_) => self.bytes.len(),
        };
        let chunk: Vec<u8> = self.bytes.drain(..valid).collect();
        // A stop string ending in the new text starts at most its length before the end of the
        // old text (moved back to a character's start).
        let mut search_from = self.text.len().saturating_sub(self.longest_stop());
        while !self.text.is_char_boundary(search_from) {
            search_from -= 1;
        }
        self.text.push_str(&String::from_utf8_lossy(&chunk));
        let hit = self
            .stop
            .iter()
            .filter_map(|s| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|i| search_from + i)
            })
            .min();
        if let Some(at) = hit {
            self.text.truncate(at);
            self.stopped = true;
            return self.take(self.text.len());
        }
        // Hold back a tail that is the start of some stop string.
        let hold = self
            .stop
            .iter()
            .map(|s| {
                (1..s.len().min(self.text.len() + 1))
                    .rev()
                    .find(|&n| {
                        self.text.is_char_boundary(self.text.len() - n)
                            && s.starts_with(&self.text[self.text.len() - n..])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        self.take(self.text.len() - hold)
    }

    fn longest_stop(&self) -> usize {
        self.stop.iter().map(String::len).max().unwrap_or(0)
    }

    fn take(&mut self, upto: usize) -> String {
        let upto = upto.max(self.sent);
        let s = self.text[self.sent..upto].to_string();
        self.sent = upto;
        s
    }

    /// Everything not sent yet (at the end).
    fn rest(&mut self) -> String {
        self.take(self.text.len())
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn finish_reason(f: Option<Finish>, stopped: bool) -> &'static str {
    match (stopped, f) {
        (true, _) | (_, Some(Finish::Stop)) => "stop",
        _ => "length",
    }
}

/// A token and its log-probabilities in the shape of the endpoint.
fn logprob_entry(s: &Shared, kind: Kind, tok: u32, lp: &TokenLogprobs) -> Value {
    let text = |t: u32| String::from_utf8_lossy(&s.tokenizer.token_bytes(t, false)).into_owned();
    match kind {
        Kind::Chat => json!({
            "token": text(tok),
            "logprob": lp.logprob,
            "bytes": s.tokenizer.token_bytes(tok, false),
            "top_logprobs": lp.top.iter().map(|&(t, l)| json!({
                "token": text(t), "logprob": l, "bytes": s.tokenizer.token_bytes(t, false)
            })).collect::<Vec<_>>(),
        }),
        Kind::Text => json!({
            "token": text(tok),
            "logprob": lp.logprob,
            "top": lp.top.iter().map(|&(t, l)| (text(t), json!(l))).collect::<Map<String, Value>>(),
        }),
    }
}

/// The `logprobs` object of a choice from entries made by [`logprob_entry`].
fn logprobs_object(kind: Kind, entries: &[Value]) -> Value {
    match kind {
        Kind::Chat => json!({"content": entries}),
        Kind::Text => json!({
            "tokens": entries.iter().map(|e| e["token"].clone()).collect::<Vec<_>>(),
            "token_logprobs": entries.iter().map(|e| e["logprob"].clone()).collect::<Vec<_>>(),
            "top_logprobs": entries.iter().map(|e| e["top"].clone()).collect::<Vec<_>>(),
        }),
    }
}

async fn generate(
    s: Shared_,
    prompt: Vec<u32>,
    opts: Options,
    kind: Kind,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let (etx, mut erx) = tmpsc::unbounded_channel();
    let (rtx, rrx) = oneshot::channel();
    let n_prompt = prompt.len();
    let cmd = Cmd::Submit {
        prompt,
        params: opts.params.clone(),
        events: etx,
        reply: rtx,
    };
    let sent = s
        .cmd
        .lock()
        .map_err(|_| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "the engine stopped".into(),
            param: None,
        })?
        .send(cmd);
    if sent.is_err() {
        return Err(ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "the engine stopped".into(),
            param: None,
        });
    }
    match rrx.await {
        Ok(Submitted::Accepted) => {}
        Ok(Submitted::Busy) => {
            s.metrics.lock().unwrap_or_else(|e| e.into_inner()).rejected += 1;
            return Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the server is busy (its queue is full); retry shortly".into(),
                param: None,
            });
        }
        Ok(Submitted::Invalid(m)) => {
            return Err(ApiError::bad(
                m,
                Some(if kind == Kind::Chat {
                    "messages"
                } else {
                    "prompt"
                }),
            ))
        }
        Err(_) => {
            return Err(ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: "the engine stopped".into(),
                param: None,
            })
        }
    }
    s.metrics.lock().unwrap_or_else(|e| e.into_inner()).requests += 1;
    let (id, object, chunk_object) = match kind {
        Kind::Text => (
            format!("cmpl-{:x}", rand_id()),
            "text_completion",
            "text_completion",
        ),
        Kind::Chat => (
            format!("chatcmpl-{:x}", rand_id()),
            "chat.completion",
            "chat.completion.chunk",
        ),
    };
    let created = now();
    let model = s.model.clone();
    let mut text = TextStream::new(opts.stop.clone());
    let want_logprobs = opts.logprobs.is_some();
    let mut last = t0;
    let mut first = true;
    let mut observe = move |s: &Shared| {
        let mut m = s.metrics.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if first {
            m.ttft.observe(now.duration_since(t0).as_secs_f64());
            first = false;
        } else {
            m.itl.observe(now.duration_since(last).as_secs_f64());
        }
        last = now;
    };
    let usage = move |n: usize| json!({"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n});
    let choice = move |delta: &str, finish: Option<&str>, lps: Option<Value>| -> Value {
        match kind {
            Kind::Text => {
                json!({"index": 0, "text": delta, "logprobs": lps, "finish_reason": finish})
            }
            Kind::Chat => {
                let d = if delta.is_empty() {
                    json!({})
                } else {
                    json!({"content": delta})
                };
                json!({"index": 0, "delta": d, "logprobs": lps, "finish_reason": finish})
            }
        }
    };
    if !opts.stream {
        let (mut n, mut finish, mut entries) = (0usize, None, Vec::new());
        while let Some(msg) = erx.recv().await {
            match msg {
                Msg::Failed(e) => {
                    return Err(ApiError {
                        status: StatusCode::INTERNAL_SERVER_ERROR,
                        message: e,
                        param: None,
                    })
                }
                Msg::Event(e) => {
                    if let Some(t) = e.token {
                        observe(&s);
                        n += 1;
                        text.push(&s.tokenizer.token_bytes(t, false));
                        if let (Some(lp), false) = (&e.logprobs, text.stopped) {
                            entries.push(logprob_entry(&s, kind, t, lp));
                        }
                    }
                    finish = e.finish.or(finish);
                    if text.stopped || e.finish.is_some() {
                        break;
                    }
                }
            }
        }
        let text_all = text.text.clone();
        let reason = finish_reason(finish, text.stopped);
        let lps = want_logprobs.then(|| logprobs_object(kind, &entries));
        let choice = match kind {
            Kind::Text => {
                json!({"index": 0, "text": text_all, "logprobs": lps, "finish_reason": reason})
            }
            Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text_all},
                                 "logprobs": lps, "finish_reason": reason}),
        };
        return Ok(axum::Json(json!({
            "id": id, "object": object, "created": created, "model": model,
            "choices": [choice], "usage": usage(n),
        }))
        .into_response());
    }
    // Streaming: one server-sent event per piece of text, then the finish, usage and [DONE].
    let include_usage = opts.include_usage;
    let envelope = move |choices: Value, usage: Option<Value>| -> SseEvent {
        let mut v = json!({"id": id, "object": chunk_object, "created": created, "model": model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        SseEvent::default().data(v.to_string())
    };
    let stream = async_stream(move |tx: tmpsc::Sender<SseEvent>| async move {
        if kind == Kind::Chat {
            let head = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": Value::Null, "finish_reason": Value::Null}]);
            if tx.send(envelope(head, None)).await.is_err() {
                return;
            }
        }
        let (mut n, mut finish) = (0usize, None);
        while let Some(msg) = erx.recv().await {
            let Msg::Event(e) = msg else {
                break;
            };
            if let Some(t) = e.token {
                observe(&s);
                n += 1;
                let piece = text.push(&s.tokenizer.token_bytes(t, false));
                let lps = match (&e.logprobs, text.stopped) {
                    (Some(lp), false) => {
                        Some(logprobs_object(kind, &[logprob_entry(&s, kind, t, lp)]))
                    }
                    _ => None,
                };
                if (!piece.is_empty() || lps.is_some())
                    && tx
                        .send(envelope(json!([choice(&piece, None, lps)]), None))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            finish = e.finish.or(finish);
            if text.stopped || e.finish.is_some() {
                break;
            }
        }
        let rest = text.rest();
        let reason = finish_reason(finish, text.stopped);
        let _ = tx
            .send(envelope(json!([choice(&rest, Some(reason), None)]), None))
            .await;
        if include_usage {
            let _ = tx.send(envelope(json!([]), Some(usage(n)))).await;
        }
        let _ = tx.send(SseEvent::default().data("[DONE]")).await;
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// A stream of server-sent events produced by `body`, which sends them on a channel; dropping
/// the stream (the client went away) drops the receiver, so `body`'s sends fail and it ends,
/// dropping the request's event receiver, which tells the engine to cancel the request.
fn async_stream<F, Fut>(
    body: F,
) -> impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>
where
    F: FnOnce(tmpsc::Sender<SseEvent>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tmpsc::channel(16);
    tokio::spawn(body(tx));
    futures_util::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
    )
}

/// A request id (not cryptographic).
fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
}

#[cfg(all(test, feature = "hub"))]
mod tests {
    use super::{parse_chat, parse_completion, parse_embeddings, Template, TextStream};
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
}

/// The router itself on 127.0.0.1 (no model: a three-token vocabulary and no engine thread),
/// driven by raw HTTP: request errors, 404, 405 and 413 as OpenAI-shaped JSON.
#[cfg(test)]
mod router_tests {
    use super::{
        parse_chat, parse_completion, router, Metrics, Shared, Template, TextStream, ENDPOINTS,
        MAX_BODY,
    };
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
}
