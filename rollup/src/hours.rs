//! The hour lifecycle. An hour is open until the watermark (the start time
//! of the newest stored request, less the allowed lateness) has passed its
//! end; then rollup closes it. Ingest still counts usage that arrives for a
//! closed hour, and marks the hour adjusted (`usage_hours.adjusted`,
//! `late_requests`) in the same transaction, so billing can tell.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;
use sqlx::PgPool;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CloseReport {
    /// The newest request's start time; `None` when nothing is stored yet.
    pub watermark: Option<DateTime<Utc>>,
    /// Hours closed by this call.
    pub closed: Vec<DateTime<Utc>>,
}

/// Closes every hour whose end is at or before `watermark - lateness`.
pub async fn close(pool: &PgPool, lateness: TimeDelta) -> Result<CloseReport, sqlx::Error> {
    let mut tx = pool.begin().await?;
    // Waits for in-flight ingest batches: none can straddle the close.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(schema::USAGE_LOCK)
        .execute(&mut *tx)
        .await?;
    // request_log is ordered by its time-ordered id: the newest row is one
    // index probe away.
    let newest: Option<(DateTime<Utc>,)> =
        sqlx::query_as("SELECT started_at FROM request_log ORDER BY request_id DESC LIMIT 1")
            .fetch_optional(&mut *tx)
            .await?;
    let Some((watermark,)) = newest else {
        tx.commit().await?;
        return Ok(CloseReport {
            watermark: None,
            closed: Vec::new(),
        });
    };
    let cutoff = (watermark - lateness)
        .duration_trunc(TimeDelta::hours(1))
        .unwrap_or(watermark);
    let closed: Vec<(DateTime<Utc>,)> = sqlx::query_as(
        "WITH bounds AS (
             SELECT coalesce((SELECT max(hour) + interval '1 hour' FROM usage_hours),
                             (SELECT min(hour) FROM usage_hourly)) AS first)
         INSERT INTO usage_hours (hour, watermark)
         SELECT h, $2 FROM bounds, generate_series(bounds.first, $1 - interval '1 hour', interval '1 hour') AS h
         WHERE bounds.first IS NOT NULL
         ON CONFLICT (hour) DO NOTHING
         RETURNING hour",
    )
    .bind(cutoff)
    .bind(watermark)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(CloseReport {
        watermark: Some(watermark),
        closed: closed.into_iter().map(|(h,)| h).collect(),
    })
}
