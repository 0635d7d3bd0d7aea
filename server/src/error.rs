//! Errors as the OpenAI API returns them: a status and `{"error": {"message", "type", "param",
//! "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `not_found_error` or `server_error`.
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before trying again (503 only).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400: the request itself is wrong; `param` names the field.
    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
            retry_after: None,
        }
    }

    /// 404 with `code`.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            code: Some(code),
            ..ApiError::invalid(None, message)
        }
    }

    /// 503 with `code` and a `Retry-After` of `seconds`.
    pub fn unavailable(code: &'static str, seconds: u64, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            code: Some(code),
            retry_after: Some(seconds),
            ..ApiError::invalid(None, message)
        }
    }

    /// 500: the engine failed the request.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            ..ApiError::invalid(None, message)
        }
    }

    /// The body, also sent as a stream's last event when a stream fails.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
