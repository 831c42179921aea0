//! billing-api errors as `{"error": {"code", "message"}}`; the one place
//! errors become HTTP. 5xx bodies are generic, the detail goes to the log.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    #[error("missing or malformed Authorization header; send `Authorization: Bearer <token>`")]
    Unauthenticated,
    /// Also what a team lead gets for another tenant, so ids can't be enumerated.
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    BadRequest(String),
    /// The caller may see the tenant but not do this (e.g. a team lead finalizing).
    #[error("this role may not do that")]
    Forbidden,
    #[error("{0}")]
    Conflict(String),
    #[error("rating: {0}")]
    Rating(#[from] crate::rating::RatingError),
    #[error("configuration: {0}")]
    Config(String),
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Schema(#[from] schema::SchemaError),
}

impl BillingError {
    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::Conflict(_) | Self::Rating(_) => StatusCode::CONFLICT,
            Self::Config(_) | Self::Database(_) | Self::Schema(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::NotFound => "not_found",
            Self::BadRequest(_) => "bad_request",
            Self::Forbidden => "forbidden",
            Self::Conflict(_) => "conflict",
            Self::Rating(_) => "unpriced_usage",
            Self::Config(_) | Self::Database(_) | Self::Schema(_) => "internal",
        }
    }
}

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
