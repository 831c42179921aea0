//! Gateway errors, answered in OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`. This is the one place
//! errors become HTTP.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::EngineError;
use openai_wire::{ErrorBody, GENERIC_SERVER_ERROR};

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("missing or malformed Authorization header; send `Authorization: Bearer <key>`")]
    MissingKey,
    #[error("the API key is not valid or has been revoked")]
    InvalidKey,
    #[error("request body is not valid: {0}")]
    BadRequest(String),
    #[error("{message}")]
    InvalidParam {
        /// OpenAI's `param`: the field, header or query parameter at fault.
        param: std::borrow::Cow<'static, str>,
        message: String,
    },
    #[error("the model `{0}` does not exist or you do not have access to it")]
    UnknownModel(String),
    /// A path the gateway does not serve: `METHOD /path`.
    #[error("Invalid URL ({0})")]
    UnknownPath(String),
    /// A path served with other methods (the response carries `Allow`).
    #[error("{0}: method not allowed; the Allow header lists the methods that are")]
    MethodNotAllowed(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("usage could not be recorded durably; the request was not billed, retry it")]
    Outbox(#[from] crate::outbox::OutboxError),
    #[error("configuration: {0}")]
    Config(String),
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Schema(#[from] schema::SchemaError),
    #[error("engine: {0}")]
    Engine(String),
    /// An HTTP upstream failed or could not be reached (502).
    #[error("the upstream engine failed: {0}")]
    Upstream(String),
    /// The replica running the request died mid-way (502; the client is
    /// told, and billed for what the request used; nothing is regenerated).
    #[error(
        "the replica running this request ({0}) failed; nothing was regenerated: retry the request"
    )]
    ReplicaFailed(String),
    /// The engine's replica is too full for this tenant's class.
    #[error("the gateway is shutting down; send new requests to another gateway")]
    Draining,
    #[error(
        "the model is at capacity for this request's class; retry after the Retry-After interval"
    )]
    NoCapacity(String),
    /// The pool has room only inside other tenants' unused reserved floors
    /// (still `no_capacity` to a client, with its own message).
    #[error(
        "the model's free capacity for this request's class is held for reserved tenants' floors; retry after the Retry-After interval"
    )]
    HeldForFloors(String),
    /// Over a per-key or per-tenant limit (429, never mixed up with 503).
    #[error("{}", .0.message)]
    RateLimited(admission::limits::Rejected),
    /// The request ran past GATEWAY_REQUEST_TIMEOUT_SECS (504).
    #[error(
        "the request did not finish within {} s (GATEWAY_REQUEST_TIMEOUT_SECS); it was stopped and billed for the tokens it produced",
        .0.as_secs()
    )]
    Timeout(std::time::Duration),
    #[error("a request with this Idempotency-Key is still in progress; retry after it finished")]
    IdempotencyInFlight,
    #[error("this Idempotency-Key was already used with a different request body")]
    IdempotencyMismatch,
    /// The model's queue for this priority is at its depth (429).
    #[error("the queue for this model is full at priority {level} ({depth} waiting); retry after the Retry-After interval")]
    QueueFull { level: u8, depth: usize },
    /// Waited in the model's queue for the tenant's whole budget (429).
    #[error("no capacity for this request within its wait budget of {} ms; retry after the Retry-After interval", .0.as_millis())]
    QueueTimeout(std::time::Duration),
    /// Retries are above their share of the last minute's traffic (503).
    #[error(
        "retries are more than 20% of this gateway's traffic over the last minute; \
         this retry is shed before first attempts: retry after the Retry-After interval"
    )]
    RetryBudget,
}

impl GatewayError {
    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey => StatusCode::UNAUTHORIZED,
            Self::BadRequest(_) | Self::InvalidParam { .. } => StatusCode::BAD_REQUEST,
            Self::UnknownModel(_) | Self::UnknownPath(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Outbox(_)
            | Self::NoCapacity(_)
            | Self::HeldForFloors(_)
            | Self::Draining
            | Self::RetryBudget => StatusCode::SERVICE_UNAVAILABLE,
            Self::RateLimited(_) | Self::QueueFull { .. } | Self::QueueTimeout(_) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::IdempotencyInFlight => StatusCode::CONFLICT,
            Self::IdempotencyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Upstream(_) | Self::ReplicaFailed(_) => StatusCode::BAD_GATEWAY,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Config(_)
            | Self::Database(_)
            | Self::Kafka(_)
            | Self::Schema(_)
            | Self::Engine(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` and `code` for this error.
    fn kind(&self) -> (&'static str, Option<&'static str>) {
        match self {
            Self::MissingKey | Self::InvalidKey => {
                ("invalid_request_error", Some("invalid_api_key"))
            }
            Self::BadRequest(_) | Self::InvalidParam { .. } | Self::PayloadTooLarge(_) => {
                ("invalid_request_error", None)
            }
            Self::UnknownPath(_) => ("invalid_request_error", Some("unknown_url")),
            Self::MethodNotAllowed(_) => ("invalid_request_error", Some("method_not_allowed")),
            Self::UnknownModel(_) => ("invalid_request_error", Some("model_not_found")),
            Self::Outbox(_) => ("server_error", Some("usage_not_recorded")),
            Self::NoCapacity(_) | Self::HeldForFloors(_) => ("server_error", Some("no_capacity")),
            Self::Draining => ("server_error", Some("draining")),
            Self::RetryBudget => ("server_error", Some("retry_budget_exhausted")),
            Self::QueueFull { .. } => ("queue", Some("queue_full")),
            Self::QueueTimeout(_) => ("queue", Some("queue_timeout")),
            Self::Timeout(_) => ("timeout", Some("request_timeout")),
            Self::ReplicaFailed(_) => ("server_error", Some("replica_failed")),
            Self::RateLimited(r) => (r.limit.as_str(), Some("rate_limit_exceeded")),
            Self::IdempotencyInFlight => ("invalid_request_error", Some("idempotency_key_in_use")),
            Self::IdempotencyMismatch => ("invalid_request_error", Some("idempotency_key_reused")),
            Self::Config(_)
            | Self::Database(_)
            | Self::Kafka(_)
            | Self::Schema(_)
            | Self::Engine(_)
            | Self::Upstream(_) => ("server_error", None),
        }
    }
}

impl GatewayError {
    /// Whether the client is told only that something failed (the details
    /// are for the log).
    fn hidden(&self) -> bool {
        self.status_code().is_server_error()
            && !matches!(
                self,
                Self::Outbox(_)
                    | Self::NoCapacity(_)
                    | Self::HeldForFloors(_)
                    | Self::Timeout(_)
                    | Self::ReplicaFailed(_)
            )
    }

    /// OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`,
    /// as a response body or as the last chunk of a stream.
    pub fn openai_body(&self) -> ErrorBody {
        let (kind, code) = self.kind();
        if self.hidden() {
            return ErrorBody::new(GENERIC_SERVER_ERROR, kind, None, code);
        }
        let param = match self {
            Self::InvalidParam { param, .. } => Some(param.as_ref()),
            _ => None,
        };
        ErrorBody::new(self.to_string(), kind, param, code)
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        if self.hidden() {
            tracing::error!(error = %self, "request failed");
        }
        let mut res = (self.status_code(), Json(self.openai_body())).into_response();
        let retry_after = match &self {
            Self::NoCapacity(detail) | Self::HeldForFloors(detail) => {
                tracing::warn!(detail = %detail, "engine has no capacity");
                Some(admission::limits::RetryAfter::no_capacity())
            }
            Self::RateLimited(r) => Some(admission::limits::RetryAfter::rate_limited(r.wait)),
            Self::RetryBudget => Some(admission::limits::RetryAfter::no_capacity()),
            Self::QueueFull { .. } | Self::QueueTimeout(_) => Some(
                admission::limits::RetryAfter::rate_limited(std::time::Duration::from_secs(1)),
            ),
            _ => None,
        };
        if let Some(after) = retry_after {
            let headers = res.headers_mut();
            headers.insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(after.secs()),
            );
            headers.insert(
                axum::http::HeaderName::from_static("retry-after-ms"),
                axum::http::HeaderValue::from(after.millis),
            );
        }
        res
    }
}

/// What the client is told when the engine said no or failed.
/// Why admission did not place a request, as the gateway answers it.
impl From<admission::Refused> for GatewayError {
    fn from(refused: admission::Refused) -> Self {
        match refused {
            admission::Refused::Limit(r) => Self::RateLimited(r),
            admission::Refused::QueueFull { level, depth } => Self::QueueFull { level, depth },
            admission::Refused::QueueTimeout(waited) => Self::QueueTimeout(waited),
            admission::Refused::Engine(e) => Self::from(e),
        }
    }
}

impl From<EngineError> for GatewayError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::NoCapacity {
                why: engine::error::NoRoom::HeldForFloors { .. },
                ..
            } => Self::HeldForFloors(e.to_string()),
            EngineError::NoCapacity { .. } | EngineError::UpstreamBusy { .. } => {
                Self::NoCapacity(e.to_string())
            }
            EngineError::Upstream { .. } => Self::Upstream(e.to_string()),
            EngineError::ReplicaFailed { replica, .. } => Self::ReplicaFailed(replica),
            // The last three are the engine's HTTP server's own, never an engine call's.
            EngineError::Stopped(_)
            | EngineError::Profile(_)
            | EngineError::Config(_)
            | EngineError::PayloadTooLarge(_)
            | EngineError::UnknownPath(_)
            | EngineError::MethodNotAllowed(_)
            | EngineError::Identity(_) => Self::Engine(e.to_string()),
            EngineError::UnknownModel(model) => Self::UnknownModel(model),
            EngineError::InvalidParam { param, message } => Self::InvalidParam {
                param: param.into(),
                message,
            },
            EngineError::ContextTooLong { .. } | EngineError::BadRequest(_) => Self::InvalidParam {
                param: "messages".into(),
                message: e.to_string(),
            },
        }
    }
}
