//! The errors every endpoint answers with, shaped as OpenAI's.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) message: String,
    pub(super) param: Option<String>,
}

impl ApiError {
    pub(super) fn bad(message: impl Into<String>, param: Option<&str>) -> ApiError {
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
