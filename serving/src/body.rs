//! The request-body read timeout: a request's body is read whole, within
//! [`HttpSettings::body_read_timeout`](crate::HttpSettings), before the
//! handler runs; a client that stalls gets 408 and the connection closes.
//!
//! Every Meterline request body is a small JSON document (a chat request or
//! a price book), so reading it up front costs nothing a handler would not
//! spend anyway, and it keeps the timeout in one place instead of in every
//! extractor. Size limits stay with the extractors (axum's body limit).

use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

/// The most a body may hold before the extractors see it; axum's own
/// limits (2 MiB by default) are lower and answer first.
const HARD_LIMIT: usize = 64 * 1024 * 1024;

/// Reads the body within `timeout`, then runs the rest of the stack on it.
pub async fn read_within(State(timeout): State<Duration>, req: Request, next: Next) -> Response {
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, HARD_LIMIT)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) => {
            let e = e.into_inner();
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("the request body is larger than {HARD_LIMIT} bytes"),
                )
            } else {
                tracing::debug!(error = %e, "request body could not be read");
                error(
                    StatusCode::BAD_REQUEST,
                    "body_unreadable",
                    "the request body could not be read".into(),
                )
            }
        }
        Err(_) => {
            tracing::info!(
                timeout_secs = timeout.as_secs(),
                "request body not received in time; 408"
            );
            error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} s",
                    timeout.as_secs()
                ),
            )
        }
    }
}

/// [`crate::error::response`], and the connection closed after it: what
/// is left of the body is not read.
fn error(status: StatusCode, code: &str, message: String) -> Response {
    let mut res = crate::error::response(status, code, None, message);
    res.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
}
