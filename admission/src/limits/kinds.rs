//! What a limit check answers: which limit refused ([`LimitKind`]), the
//! refusal ([`Rejected`]), and the figures behind the `x-ratelimit-*`
//! headers ([`Window`], [`RateStatus`]).

use std::time::Duration;

/// Which limit turned a request away; also the OpenAI error `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKind {
    Requests,
    Tokens,
    Concurrency,
    KvSeconds,
    /// The tenant's priority is refused while the pool is saturated.
    Degraded,
    TenantRequests,
    GlobalRequests,
}

impl LimitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Concurrency => "concurrency",
            Self::KvSeconds => "kv_seconds",
            Self::Degraded => "degraded",
            Self::TenantRequests => "tenant_requests",
            Self::GlobalRequests => "global_requests",
        }
    }
}

/// A request turned away, and how long until it could pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub limit: LimitKind,
    /// The least time until the limit would let this request through.
    pub wait: Duration,
    pub message: String,
}

/// One limit's figures for the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub limit: u64,
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset: Duration,
}

/// The figures behind the `x-ratelimit-*` headers for one key and model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateStatus {
    pub requests: Option<Window>,
    pub tokens: Option<Window>,
}
