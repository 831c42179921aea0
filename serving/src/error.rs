//! The error body the serving layer answers with itself (before any
//! service's router runs), in the shape both of Meterline's APIs use:
//! `code` and `message` (billing-api), plus `type` and `param` (OpenAI's,
//! the gateway and the engine).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

pub(crate) fn response(
    status: StatusCode,
    code: &str,
    param: Option<&str>,
    message: String,
) -> Response {
    (
        status,
        Json(json!({"error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }})),
    )
        .into_response()
}
