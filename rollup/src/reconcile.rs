//! Reconciliation: for every (tenant, model, priority, hour) in a period,
//! the sums over request_log must equal the usage_hourly row exactly. Any
//! difference is a metering bug and is listed.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgPool;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Difference {
    pub tenant_id: String,
    pub model: String,
    pub priority: i16,
    pub hour: DateTime<Utc>,
    pub log_requests: i64,
    pub hourly_requests: i64,
    pub log_prompt_tokens: i64,
    pub hourly_prompt_tokens: i64,
    pub log_cached_tokens: i64,
    pub hourly_cached_tokens: i64,
    pub log_completion_tokens: i64,
    pub hourly_completion_tokens: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub log_gpu_seconds: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub hourly_gpu_seconds: Decimal,
}

/// Compares `[from, to)` (by the hour a request started in). Empty: they agree.
pub async fn reconcile(
    pool: &PgPool,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Difference>, sqlx::Error> {
    sqlx::query_as(
        "WITH log AS (
             SELECT tenant_id, model, priority, date_trunc('hour', started_at) AS hour,
                    count(*)::bigint AS requests, sum(prompt_tokens)::bigint AS prompt_tokens,
                    sum(cached_tokens)::bigint AS cached_tokens,
                    sum(completion_tokens)::bigint AS completion_tokens,
                    sum(gpu_seconds) AS gpu_seconds
             FROM request_log
             -- Prune to the day partitions that can hold the period (ids
             -- are created at request start, a day of slack either side).
             WHERE request_id >= request_log_bound(($1::timestamptz AT TIME ZONE 'UTC')::date - 1)
               AND request_id < request_log_bound(($2::timestamptz AT TIME ZONE 'UTC')::date + 2)
               AND started_at >= $1 AND started_at < $2
             GROUP BY 1, 2, 3, 4),
         hourly AS (
             SELECT tenant_id, model, priority, hour, requests, prompt_tokens, cached_tokens,
                    completion_tokens, gpu_seconds
             FROM usage_hourly WHERE hour >= date_trunc('hour', $1::timestamptz) AND hour < $2)
         SELECT tenant_id, model, priority, hour,
                coalesce(l.requests, 0) AS log_requests, coalesce(h.requests, 0) AS hourly_requests,
                coalesce(l.prompt_tokens, 0) AS log_prompt_tokens,
                coalesce(h.prompt_tokens, 0) AS hourly_prompt_tokens,
                coalesce(l.cached_tokens, 0) AS log_cached_tokens,
                coalesce(h.cached_tokens, 0) AS hourly_cached_tokens,
                coalesce(l.completion_tokens, 0) AS log_completion_tokens,
                coalesce(h.completion_tokens, 0) AS hourly_completion_tokens,
                coalesce(l.gpu_seconds, 0) AS log_gpu_seconds,
                coalesce(h.gpu_seconds, 0) AS hourly_gpu_seconds
         FROM log l FULL JOIN hourly h USING (tenant_id, model, priority, hour)
         WHERE l.requests IS DISTINCT FROM h.requests
            OR l.prompt_tokens IS DISTINCT FROM h.prompt_tokens
            OR l.cached_tokens IS DISTINCT FROM h.cached_tokens
            OR l.completion_tokens IS DISTINCT FROM h.completion_tokens
            OR l.gpu_seconds IS DISTINCT FROM h.gpu_seconds
         ORDER BY hour, tenant_id, model, priority",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await
}
