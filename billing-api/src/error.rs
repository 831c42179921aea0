//! billing-api errors as `{"error": {"code", "message"}}`; the one place
//! errors become HTTP, and the shape the OpenAPI document gives them
//! ([`ErrorBody`]). 5xx bodies are generic, the detail goes to the log.
//! Extractor rejections (malformed JSON, queries and paths, a body too
//! large or of the wrong type) come here too, through the extractors in
//! [`crate::extract`], as do unknown paths and methods (the router's
//! fallbacks).

use axum::extract::rejection::{
    JsonRejection, PathRejection, QueryRejection, RawPathParamsRejection, StringRejection,
};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    #[error("missing or malformed Authorization header; send `Authorization: Bearer <token>`")]
    Unauthenticated,
    /// A header that must be sent at most once, sent more than once: which
    /// value counts is not for the server to guess.
    #[error("the {0} header is sent more than once; send it once")]
    RepeatedHeader(&'static str),
    /// Also what a team lead gets for another tenant, so ids can't be enumerated.
    #[error("not found")]
    NotFound,
    /// Something the request names (not in its path) does not exist; the
    /// message names it.
    #[error("{0}")]
    Missing(String),
    /// A path the API does not have.
    #[error("no such path: {0}")]
    UnknownPath(String),
    /// A path the API has, with a method it does not take (the response
    /// carries `Allow`).
    #[error("{0} is not allowed here; the Allow header lists the methods that are")]
    MethodNotAllowed(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The caller may see the tenant but not do this (e.g. a team lead finalizing).
    #[error("this role may not do that")]
    Forbidden,
    /// A page form without this session's CSRF token.
    #[error("the form's CSRF token does not match this session; reload the page and submit again")]
    CsrfMismatch,
    #[error("{0}")]
    Conflict(String),
    #[error("rating: {0}")]
    Rating(#[from] crate::rating::RatingError),
    #[error("configuration: {0}")]
    Config(String),
    /// A fault of the server's own (e.g. an extractor used on a route
    /// without the parameters it reads).
    #[error("internal: {0}")]
    Internal(String),
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Schema(#[from] schema::SchemaError),
}

impl BillingError {
    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::NotFound | Self::Missing(_) | Self::UnknownPath(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::BadRequest(_) | Self::RepeatedHeader(_) => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Forbidden | Self::CsrfMismatch => StatusCode::FORBIDDEN,
            Self::Conflict(_) | Self::Rating(_) => StatusCode::CONFLICT,
            Self::Config(_) | Self::Internal(_) | Self::Database(_) | Self::Schema(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The stable `error.code` of the body (listed in the OpenAPI document).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::NotFound | Self::Missing(_) | Self::UnknownPath(_) => "not_found",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::BadRequest(_) | Self::RepeatedHeader(_) => "bad_request",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::Forbidden => "forbidden",
            Self::CsrfMismatch => "csrf_mismatch",
            Self::Conflict(_) => "conflict",
            Self::Rating(_) => "unpriced_usage",
            Self::Config(_) | Self::Internal(_) | Self::Database(_) | Self::Schema(_) => "internal",
        }
    }

    /// An extractor's rejection, by the status axum gives it, with axum's
    /// text (which names the parameter or the JSON path at fault).
    fn rejected(status: StatusCode, text: String) -> Self {
        match status {
            StatusCode::PAYLOAD_TOO_LARGE => Self::PayloadTooLarge(text),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::UnsupportedMediaType(text),
            s if s.is_server_error() => Self::Internal(text),
            // Syntax (400) and data (422) errors alike: the request is malformed.
            _ => Self::BadRequest(text),
        }
    }
}

/// `From` each rejection the crate's extractors can produce.
macro_rules! from_rejection {
    ($($rejection:ty),*) => {$(
        impl From<$rejection> for BillingError {
            fn from(r: $rejection) -> Self {
                Self::rejected(r.status(), r.body_text())
            }
        }
    )*};
}

from_rejection!(
    JsonRejection,
    PathRejection,
    QueryRejection,
    RawPathParamsRejection,
    StringRejection
);

impl IntoResponse for BillingError {
    fn into_response(self) -> Response {
        let status = self.status_code();
        let message = if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
            "internal error".to_owned()
        } else {
            self.to_string()
        };
        (
            status,
            Json(json!({"error": {"code": self.code(), "message": message}})),
        )
            .into_response()
    }
}

/// The error shape every 4xx and 5xx uses.
#[derive(utoipa::ToSchema)]
#[expect(
    dead_code,
    reason = "documents the shape for the OpenAPI document; errors are built above"
)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(utoipa::ToSchema)]
#[expect(
    dead_code,
    reason = "documents the shape for the OpenAPI document; errors are built above"
)]
pub struct ErrorDetail {
    /// Stable and machine-readable (`BillingError::code`).
    #[schema(value_type = ErrorCode)]
    code: String,
    /// For people; for a 5xx, only "internal error".
    message: String,
}

/// The values of `error.code`.
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    Unauthenticated,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    Conflict,
    UnpricedUsage,
    PayloadTooLarge,
    UnsupportedMediaType,
    /// 408 from the serving layer: the body did not arrive in time.
    RequestTimeout,
    /// 400 from the serving layer: the body could not be read.
    BodyUnreadable,
    Internal,
}
