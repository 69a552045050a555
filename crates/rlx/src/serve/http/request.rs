//! Reading and checking request bodies: typed fields (each wrong type or value out of range a
//! 400 naming the field), the completion options, prompts, chat messages and embedding inputs.

use super::error::ApiError;
use super::router::MAX_BODY;
use super::Template;
use crate::llm::{ChatMessage, SamplerConfig};
use crate::serve::engine::GenParams;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use rlx_gguf::Tokenizer;
use serde_json::{Map, Value};

/// The raw request body, read up to [`MAX_BODY`]; a larger body (413) or one that cannot be
/// read is an OpenAI-shaped error with the rejection's status.
pub(super) struct RawBody(pub(super) Bytes);

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

/// The request body as a JSON object, or a 400 saying what is wrong with it.
pub(super) fn body(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
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
pub(super) struct Fields<'a>(pub(super) &'a Map<String, Value>);

impl Fields<'_> {
    pub(super) fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    pub(super) fn uint(&self, k: &str) -> Result<Option<u64>, ApiError> {
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

    pub(super) fn float(&self, k: &str) -> Result<Option<f32>, ApiError> {
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
    pub(super) fn float_in(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
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
    pub(super) fn int(&self, k: &str) -> Result<Option<u64>, ApiError> {
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

    pub(super) fn boolean(&self, k: &str) -> Result<Option<bool>, ApiError> {
        self.get(k)
            .map(|v| {
                v.as_bool().ok_or_else(|| {
                    ApiError::bad(format!("`{k}` must be true or false, got {v}"), Some(k))
                })
            })
            .transpose()
    }

    pub(super) fn string(&self, k: &str) -> Result<Option<&str>, ApiError> {
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
pub(super) struct Options {
    pub(super) params: GenParams,
    pub(super) stop: Vec<String>,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    /// Log-probabilities: none, or the chosen token's with this many alternatives.
    pub(super) logprobs: Option<usize>,
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

/// A list of token ids (`None` when `v` is not a list of integers), each checked.
pub(super) fn token_list(
    v: Option<&Value>,
    key: &str,
    vocab: usize,
) -> Result<Option<Vec<u32>>, ApiError> {
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

/// A `/v1/completions` body: the prompt's tokens and the options.
pub(super) fn parse_completion(
    bytes: &[u8],
    tok: &Tokenizer,
) -> Result<(Vec<u32>, Options), ApiError> {
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

/// The roles a chat message may have (OpenAI's, less the deprecated `function`).
const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

/// A `/v1/chat/completions` body: the rendered conversation's tokens and the options.
pub(super) fn parse_chat(
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

/// A `/v1/embeddings` body: the texts and whether vectors go back as base64.
#[derive(Debug)]
pub(super) struct EmbedRequest {
    pub(super) input: Vec<String>,
    pub(super) base64: bool,
    pub(super) dimensions: Option<u64>,
}

/// Most texts one `/v1/embeddings` request may carry (OpenAI's limit).
const MAX_EMBED_INPUTS: usize = 2048;

pub(super) fn parse_embeddings(bytes: &[u8]) -> Result<EmbedRequest, ApiError> {
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
