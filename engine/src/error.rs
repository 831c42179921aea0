//! The engine's errors, one enum for the crate. HTTP status codes are
//! chosen in one place, [`EngineError::status_code`].

use axum::http::StatusCode;

use crate::identity::IdentityError;
use crate::profile::ProfileError;

/// Why a model had no room for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoRoom {
    /// KV occupancy (with what waits) at or past the class's threshold.
    Full { occupancy_percent: u64 },
    /// The pool has room, but only inside other tenants' unused reserved
    /// floors (`fleet::pool`).
    HeldForFloors { held_percent: u64 },
    /// The prompts waiting to start ahead of it hold more prefill than
    /// the replica queues (the profile's `backlog_steps`).
    Backlog { waiting_tokens: u64 },
}

impl std::fmt::Display for NoRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Full { occupancy_percent } => write!(f, "KV cache {occupancy_percent}% full"),
            Self::HeldForFloors { held_percent } => write!(
                f,
                "{held_percent}% of the pool is held for other tenants' reserved floors"
            ),
            Self::Backlog { waiting_tokens } => write!(
                f,
                "{waiting_tokens} prompt tokens are waiting to start ahead of it"
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("model {0:?} is not served")]
    UnknownModel(String),
    #[error(
        "prompt of {prompt} tokens plus {output} output tokens exceeds the context of {limit}"
    )]
    ContextTooLong {
        prompt: u64,
        output: u64,
        limit: u32,
    },
    /// KV occupancy is at or above the class's admission threshold, or
    /// what is left is held for other tenants' reserved floors (`why`).
    #[error("no capacity on {model} for {class} requests: {why}")]
    NoCapacity {
        model: String,
        class: &'static str,
        why: NoRoom,
    },
    #[error("request body is not valid: {0}")]
    BadRequest(String),
    /// A request parameter refused (400 with OpenAI's `param`).
    #[error("{message}")]
    InvalidParam { param: String, message: String },
    /// The HTTP server: a body above its limit (413).
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The HTTP server: a path it does not serve (404).
    #[error("Invalid URL ({0})")]
    UnknownPath(String),
    /// The HTTP server: a method a path does not take (405, with `Allow`).
    #[error("{0}: method not allowed; the Allow header lists the methods that are")]
    MethodNotAllowed(String),
    #[error("the replica of {0:?} stopped")]
    Stopped(String),
    /// The replica running the request died; `used` is what the request
    /// had used until then (billed: the GPU time was spent).
    #[error("replica {replica} failed while running the request")]
    ReplicaFailed {
        replica: String,
        used: Box<crate::completion::Completion>,
    },
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// An HTTP upstream failed or could not be reached.
    #[error("upstream of {model:?}: {detail}")]
    Upstream { model: String, detail: String },
    /// An HTTP upstream answered 429 or 503: it has no room now.
    #[error("no capacity upstream for {model}: {detail}")]
    UpstreamBusy { model: String, detail: String },
    /// The request's `x-meterline-identity` is missing or does not verify (401).
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// A setting of the engine or of an upstream is wrong.
    #[error("{0}")]
    Config(String),
}

impl EngineError {
    /// What the request had used when this error ended it, if the engine
    /// could say.
    pub fn used(&self) -> Option<&crate::completion::Completion> {
        match self {
            Self::ReplicaFailed { used, .. } => Some(used),
            _ => None,
        }
    }

    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::UnknownModel(_) | Self::UnknownPath(_) => StatusCode::NOT_FOUND,
            Self::Identity(_) => StatusCode::UNAUTHORIZED,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ContextTooLong { .. } | Self::BadRequest(_) | Self::InvalidParam { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::NoCapacity { .. } | Self::UpstreamBusy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Upstream { .. } | Self::ReplicaFailed { .. } => StatusCode::BAD_GATEWAY,
            Self::Stopped(_) | Self::Profile(_) | Self::Config(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}
