//! The OpenAI-compatible HTTP server (`rlx serve`): one engine thread owns the [`Engine`] and
//! steps it; the HTTP work (parsing, chat templates, detokenizing, stop strings, server-sent
//! events) runs on tokio's threads and talks to it over channels.
//!
//! Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both with `stream`),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus), `POST /tokenize`,
//! `POST /detokenize`. Bad requests (malformed bodies, fields of the wrong type or out of range,
//! unknown paths, wrong methods, bodies over `MAX_BODY`) get a 4xx with an
//! OpenAI-shaped error body; a full queue gets 503 with `Retry-After`; a client that goes away
//! frees its sequence at the next step.

mod error;
mod metrics;
mod request;
mod router;
#[cfg(test)]
mod router_tests;
mod stream;
#[cfg(all(test, feature = "hub"))]
mod tests;

use super::engine::{Engine, Event, GenParams};
use crate::llm::{ChatTemplate, JinjaTemplate};
use metrics::Metrics;
use rlx_gguf::Tokenizer;
use router::router;
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
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
