//! The endpoints: the router, its 404 / 405 answers, and the handlers (the completion
//! endpoints hand their requests to [`generate`]).

use super::error::ApiError;
use super::metrics::metrics;
use super::request::{
    body, parse_chat, parse_completion, parse_embeddings, token_list, Fields, RawBody,
};
use super::stream::{generate, Kind};
use super::Shared_;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

/// The endpoints, as (method, path): what [`router`] routes, and what the 404 and 405 errors
/// list.
pub(super) const ENDPOINTS: [(&str, &str); 8] = [
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
pub(super) const MAX_BODY: usize = 2 << 20;

/// The endpoints of [`ENDPOINTS`], with OpenAI-shaped errors for unknown paths (404), wrong
/// methods (405, with `Allow`) and bodies over [`MAX_BODY`] (413).
pub(super) fn router(shared: Shared_) -> Router {
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

async fn completions(
    State(s): State<Shared_>,
    RawBody(bytes): RawBody,
) -> Result<Response, ApiError> {
    let (prompt, opts) = parse_completion(&bytes, &s.tokenizer)?;
    generate(s, prompt, opts, Kind::Text).await
}

async fn chat_completions(
    State(s): State<Shared_>,
    RawBody(bytes): RawBody,
) -> Result<Response, ApiError> {
    let (prompt, opts) = parse_chat(&bytes, &s.tokenizer, &s.template)?;
    generate(s, prompt, opts, Kind::Chat).await
}
