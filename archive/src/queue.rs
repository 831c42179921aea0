//! Reading what waits in `archive_queue`: the request_log rows ingest
//! committed that no live archive file holds yet, oldest id first, read
//! from request_log in one statement per batch.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgPool;
use usage_contract::{FinishReason, Placement, RequestId, UsageEvent, SCHEMA_V1, SCHEMA_VERSION};
use uuid::Uuid;

use crate::error::ArchiveError;
use crate::format::{millis, ArchivedRequest};

/// A request_log row with what ingest recorded about it.
#[derive(Debug, sqlx::FromRow)]
struct LogRow {
    request_id: Uuid,
    tenant_id: String,
    api_key_id: String,
    model: String,
    model_version: String,
    priority: i16,
    started_at: DateTime<Utc>,
    first_token_at: Option<DateTime<Utc>>,
    finished_at: DateTime<Utc>,
    prompt_tokens: i64,
    cached_tokens: i64,
    completion_tokens: i64,
    gpu_seconds: Decimal,
    preempted_gpu_seconds: Decimal,
    finish_reason: String,
    ttft_ms: Option<i64>,
    tpot_ms: Option<i64>,
    replica_id: String,
    gateway_id: String,
    stream: bool,
    ingested_at: DateTime<Utc>,
    kafka_partition: i32,
    kafka_offset: i64,
    pool: Option<String>,
    dedicated_to: Option<String>,
    queue_wait_ms: Option<i64>,
    preemptions: Option<i64>,
}

/// The columns of request_log the archive keeps, for `SELECT`s elsewhere.
pub const LOG_COLUMNS: &str = "r.request_id, r.tenant_id, r.api_key_id, r.model, r.model_version,
     r.priority, r.started_at, r.first_token_at, r.finished_at, r.prompt_tokens, r.cached_tokens,
     r.completion_tokens, r.gpu_seconds, r.preempted_gpu_seconds, r.finish_reason, r.ttft_ms,
     r.tpot_ms, r.replica_id, r.gateway_id, r.stream, r.ingested_at, r.kafka_partition,
     r.kafka_offset, r.pool, r.dedicated_to, r.queue_wait_ms, r.preemptions";

impl LogRow {
    fn into_archived(self) -> Result<ArchivedRequest, ArchiveError> {
        let finish_reason = FinishReason::parse(&self.finish_reason)
            .ok_or_else(|| ArchiveError::Row(format!("finish_reason {:?}", self.finish_reason)))?;
        // A v2 event always has a placement, a v1 event never (as
        // `StoredRequest::to_event` reads it).
        let placement = match (self.pool, self.queue_wait_ms, self.preemptions) {
            (Some(pool), Some(queue_wait_ms), Some(preemptions)) => Some(Placement {
                pool,
                dedicated_to: self.dedicated_to,
                queue_wait_ms,
                preemptions,
            }),
            _ => None,
        };
        Ok(ArchivedRequest {
            event: UsageEvent {
                schema_version: if placement.is_some() {
                    SCHEMA_VERSION
                } else {
                    SCHEMA_V1
                },
                request_id: RequestId::from_uuid(self.request_id)
                    .map_err(|e| ArchiveError::Row(e.to_string()))?,
                tenant_id: self.tenant_id,
                api_key_id: self.api_key_id,
                model: self.model,
                model_version: self.model_version,
                priority: self.priority,
                started_at: millis(self.started_at),
                first_token_at: self.first_token_at.map(millis),
                finished_at: millis(self.finished_at),
                prompt_tokens: self.prompt_tokens,
                cached_tokens: self.cached_tokens,
                completion_tokens: self.completion_tokens,
                gpu_seconds: self.gpu_seconds,
                preempted_gpu_seconds: self.preempted_gpu_seconds,
                finish_reason,
                ttft_ms: self.ttft_ms,
                tpot_ms: self.tpot_ms,
                replica_id: self.replica_id,
                gateway_id: self.gateway_id,
                stream: self.stream,
                placement,
            },
            ingested_at: self.ingested_at,
            kafka_partition: self.kafka_partition,
            kafka_offset: self.kafka_offset,
        })
    }
}

/// Up to `limit` queued rows, in id order.
pub async fn pending(pool: &PgPool, limit: usize) -> Result<Vec<ArchivedRequest>, ArchiveError> {
    let rows: Vec<LogRow> = sqlx::query_as(&format!(
        "SELECT {LOG_COLUMNS}
         FROM (SELECT request_id FROM archive_queue ORDER BY request_id LIMIT $1) q
         JOIN request_log r ON r.request_id = q.request_id
         ORDER BY r.request_id"
    ))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(LogRow::into_archived).collect()
}

/// The request_log row of `id`, as the archive would hold it.
pub async fn stored(pool: &PgPool, id: Uuid) -> Result<Option<ArchivedRequest>, ArchiveError> {
    let row: Option<LogRow> = sqlx::query_as(&format!(
        "SELECT {LOG_COLUMNS} FROM request_log r WHERE r.request_id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await?;
    row.map(LogRow::into_archived).transpose()
}

/// Every request_log row whose id lies in `[from, to)`, in id order (tests,
/// reconcile's and verify's comparisons).
pub async fn logged_between(
    pool: &PgPool,
    from: Uuid,
    to: Uuid,
) -> Result<Vec<ArchivedRequest>, ArchiveError> {
    let rows: Vec<LogRow> = sqlx::query_as(&format!(
        "SELECT {LOG_COLUMNS} FROM request_log r
         WHERE r.request_id >= $1 AND r.request_id < $2 ORDER BY r.request_id"
    ))
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(LogRow::into_archived).collect()
}
