//! Why a workload cannot be generated.

use chrono::{DateTime, Utc};

/// A [`Config`](crate::Config) the generator refuses, naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    #[error("the range {from}..{to} holds no millisecond for {events} events")]
    EmptyRange {
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        events: u64,
    },
    #[error("{0} events are more than request ids can tell apart (2^40)")]
    TooManyEvents(u64),
    #[error("no tenant has a positive requests_per_second")]
    NoTraffic,
    #[error("tenant {tenant:?} calls model {model:?}, which the fleet does not have")]
    UnknownModel { tenant: String, model: String },
    #[error("tenant {tenant:?}: {message}")]
    BadTenant { tenant: String, message: String },
    #[error("model {0:?} has concurrency 0")]
    ZeroConcurrency(String),
}
