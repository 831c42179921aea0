//! Reading what waits in the archive queue: the request_log rows ingest
//! committed that no live archive file holds yet.
//!
//! The queue (`archive_queue_batches`) holds one row per statement that
//! inserted into request_log, with its ids. A batch takes the oldest queue
//! rows' ids up to the archiver's batch size (the first ids of the last row
//! when the batch fills inside it), then reads request_log for exactly
//! those ids, bounded by their range so only the day partitions holding
//! them are read. An idle poll
//! reads the empty queue and nothing else: it never plans request_log's day
//! partitions (~12 ms a poll over a month of them, measured on the demo).
//! JIT is off for the archiver's statements: they are index lookups, and
//! JIT compiled on every poll whenever a bloated queue inflated the
//! planner's estimates.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};
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

/// Turns JIT off for the rest of the transaction `conn` is in.
pub(crate) async fn without_jit(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SET LOCAL jit = off").execute(conn).await?;
    Ok(())
}

/// Which queue rows a batch took: whole rows, and the first ids of at most
/// one more (the batch filled inside it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taken {
    /// Rows taken whole (`archive_queue_batches.batch_id`).
    pub whole: Vec<i64>,
    /// A row whose first ids were taken: its id, how many ids it held, how
    /// many of them (the first, in id order) were taken.
    pub part: Option<(i64, i32, i32)>,
}

impl Taken {
    pub fn is_empty(&self) -> bool {
        self.whole.is_empty() && self.part.is_none()
    }
}

/// What a batch took from the queue.
#[derive(Debug, Default)]
pub struct Pending {
    pub taken: Taken,
    /// Their request_log rows, in id order.
    pub rows: Vec<ArchivedRequest>,
}

/// The oldest `limit` queued ids (oldest queue row first, each row's ids
/// in id order) and their request_log rows; nothing is read from
/// request_log when the queue is empty.
pub async fn pending(pool: &PgPool, limit: usize) -> Result<Pending, ArchiveError> {
    let limit = i32::try_from(limit).unwrap_or(i32::MAX).max(1);
    let mut tx = pool.begin().await?;
    without_jit(&mut tx).await?;
    let queued: Vec<(i64, i32, i64, Vec<Uuid>)> = sqlx::query_as(
        "SELECT batch_id, ids, before, request_ids FROM (
             SELECT batch_id, ids, request_ids,
                    sum(ids) OVER (ORDER BY batch_id) - ids AS before
             FROM archive_queue_batches) q
         WHERE before < $1 ORDER BY batch_id",
    )
    .bind(i64::from(limit))
    .fetch_all(&mut *tx)
    .await?;
    let mut taken = Taken::default();
    let mut ids: Vec<Uuid> = Vec::new();
    for (batch_id, n, before, mut request_ids) in queued {
        let room = i64::from(limit) - before;
        if i64::from(n) <= room {
            taken.whole.push(batch_id);
        } else {
            let first = i32::try_from(room).unwrap_or(n);
            request_ids.truncate(first as usize);
            taken.part = Some((batch_id, n, first));
        }
        ids.extend(request_ids);
    }
    let (Some(&first), Some(&last)) = (ids.iter().min(), ids.iter().max()) else {
        tx.commit().await?;
        return Ok(Pending::default());
    };
    let rows: Vec<LogRow> = sqlx::query_as(&format!(
        "SELECT {LOG_COLUMNS} FROM request_log r
         WHERE r.request_id BETWEEN $1 AND $2 AND r.request_id = ANY($3)
         ORDER BY r.request_id"
    ))
    .bind(first)
    .bind(last)
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    if rows.len() != ids.len() {
        // Retention drops a day only once none of its ids is queued, so a
        // queued id always has its row.
        return Err(ArchiveError::Row(format!(
            "{} of the {} ids queued in archive_queue_batches {taken:?} have no request_log row",
            ids.len() - rows.len(),
            ids.len()
        )));
    }
    let rows = rows
        .into_iter()
        .map(LogRow::into_archived)
        .collect::<Result<_, _>>()?;
    Ok(Pending { taken, rows })
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
