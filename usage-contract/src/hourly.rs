//! What an hour of usage is: the totals a set of requests adds to one
//! usage_hourly row, and the UTC hour a request is counted in (the hour it
//! started in). One definition, so ingest (which writes usage_hourly) and
//! reconcile (which checks it against request_log and the archive) count
//! alike.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde::Serialize;

use crate::{FinishReason, UsageEvent};

/// What a set of requests adds to one usage_hourly row.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct HourTotals {
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub gpu_seconds: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub preempted_gpu_seconds: Decimal,
    pub cancelled_requests: i64,
    pub errored_requests: i64,
}

impl HourTotals {
    /// Counts one request.
    pub fn add(&mut self, e: &UsageEvent) {
        self.requests += 1;
        self.prompt_tokens += e.prompt_tokens;
        self.cached_tokens += e.cached_tokens;
        self.completion_tokens += e.completion_tokens;
        self.gpu_seconds += e.gpu_seconds;
        self.preempted_gpu_seconds += e.preempted_gpu_seconds;
        self.cancelled_requests += i64::from(e.finish_reason == FinishReason::Cancelled);
        self.errored_requests += i64::from(e.finish_reason == FinishReason::Error);
    }

    /// Adds another set's totals.
    pub fn merge(&mut self, o: &HourTotals) {
        self.requests += o.requests;
        self.prompt_tokens += o.prompt_tokens;
        self.cached_tokens += o.cached_tokens;
        self.completion_tokens += o.completion_tokens;
        self.gpu_seconds += o.gpu_seconds;
        self.preempted_gpu_seconds += o.preempted_gpu_seconds;
        self.cancelled_requests += o.cancelled_requests;
        self.errored_requests += o.errored_requests;
    }
}

/// The UTC hour an event is counted in.
pub fn hour_of(e: &UsageEvent) -> DateTime<Utc> {
    // Truncating a valid UTC time to the hour cannot overflow.
    e.started_at
        .duration_trunc(TimeDelta::hours(1))
        .unwrap_or(e.started_at)
}
