//! Generating for a completion request: submitting it to the engine thread, decoding its
//! tokens into text (stop strings, split UTF-8), log-probabilities, and the answer as one
//! JSON body or as server-sent events.

use super::error::ApiError;
use super::request::Options;
use super::{Cmd, Msg, Shared, Shared_, Submitted};
use crate::serve::engine::{Finish, GenParams, TokenLogprobs};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc as tmpsc, oneshot};

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Text,
    Chat,
}

/// Text decoded from tokens as they come: UTF-8 sequences split across tokens wait for their
/// end; stop strings are found across token boundaries, and text that could begin one is held
/// back until it cannot.
pub(super) struct TextStream {
    bytes: Vec<u8>,
    pub(super) text: String,
    sent: usize,
    stop: Vec<String>,
    pub(super) stopped: bool,
}

impl TextStream {
    pub(super) fn new(stop: Vec<String>) -> TextStream {
        TextStream {
            bytes: Vec::new(),
            text: String::new(),
            sent: 0,
            stop,
            stopped: false,
        }
    }

    /// Add a token's bytes; returns the text that is now safe to send.
    pub(super) fn push(&mut self, tok: &[u8]) -> String {
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

/// Hand `prompt` to the engine thread: the receiver of its events once it is accepted; a full
/// queue is a 503, a prompt the engine refuses a 400, a stopped engine a 500.
async fn submit(
    s: &Shared,
    prompt: Vec<u32>,
    params: GenParams,
    kind: Kind,
) -> Result<tmpsc::UnboundedReceiver<Msg>, ApiError> {
    let (etx, erx) = tmpsc::unbounded_channel();
    let (rtx, rrx) = oneshot::channel();
    let cmd = Cmd::Submit {
        prompt,
        params,
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
    Ok(erx)
}

/// Generate for a completion request of `kind`: the whole answer as one JSON body, or (with
/// `stream`) server-sent events as the tokens come.
pub(super) async fn generate(
    s: Shared_,
    prompt: Vec<u32>,
    opts: Options,
    kind: Kind,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let n_prompt = prompt.len();
    let mut erx = submit(&s, prompt, opts.params.clone(), kind).await?;
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
