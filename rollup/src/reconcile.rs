//! Reconciliation, three ways: for every (tenant, model, priority, hour)
//! in a period, the sums over request_log, the usage_hourly row and the
//! sums over the Parquet archive must be equal — requests, each token
//! kind, GPU-seconds, preempted GPU-seconds, cancelled and errored counts.
//! Any difference is a metering bug and is listed.
//!
//! The archive's side is its live files plus the rows still waiting in
//! `archive_queue` (read from request_log): a billed request is in exactly
//! one of them (the archive's rule). Over days whose request_log partition
//! retention has dropped, request_log is not compared (it holds nothing
//! there by design): usage_hourly and the archive are, so dropped days
//! raise no false alarm. Without an archive (`ARCHIVE_URL=off`) the check
//! is request_log against usage_hourly.

use std::collections::{BTreeMap, BTreeSet};

use archive::store::ArchiveStore;
use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use sqlx::PgPool;
use usage_contract::hourly::hour_of;

/// What reconciling can fail on (not a difference: a failure to look).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error("archive: {0}")]
    Archive(#[from] archive::error::ArchiveError),
}

/// One source's sums for one (tenant, model, priority, hour): what
/// usage_hourly keeps, counted as ingest counts it.
pub use usage_contract::hourly::HourTotals as Sums;

/// The names of the fields where `a` and `b` differ.
fn differing(a: &Sums, b: &Sums) -> Vec<&'static str> {
    [
        ("requests", a.requests != b.requests),
        ("prompt_tokens", a.prompt_tokens != b.prompt_tokens),
        ("cached_tokens", a.cached_tokens != b.cached_tokens),
        (
            "completion_tokens",
            a.completion_tokens != b.completion_tokens,
        ),
        ("gpu_seconds", a.gpu_seconds != b.gpu_seconds),
        (
            "preempted_gpu_seconds",
            a.preempted_gpu_seconds != b.preempted_gpu_seconds,
        ),
        (
            "cancelled_requests",
            a.cancelled_requests != b.cancelled_requests,
        ),
        ("errored_requests", a.errored_requests != b.errored_requests),
    ]
    .into_iter()
    .filter_map(|(name, differs)| differs.then_some(name))
    .collect()
}

/// (tenant, model, priority, hour).
type Key = (String, String, i16, DateTime<Utc>);

#[derive(sqlx::FromRow)]
struct KeyedSums {
    tenant_id: String,
    model: String,
    priority: i16,
    hour: DateTime<Utc>,
    #[sqlx(flatten)]
    sums: Sums,
}

/// A (tenant, model, priority, hour) where the sources disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Difference {
    pub tenant_id: String,
    pub model: String,
    pub priority: i16,
    pub hour: DateTime<Utc>,
    /// `None` over a day retention dropped from request_log.
    pub request_log: Option<Sums>,
    pub usage_hourly: Sums,
    /// `None` without an archive.
    pub archive: Option<Sums>,
    /// The fields where some source differs from usage_hourly.
    pub fields: Vec<&'static str>,
}

const SUMS: &str =
    "count(*)::bigint AS requests, coalesce(sum(r.prompt_tokens), 0)::bigint AS prompt_tokens,
    coalesce(sum(r.cached_tokens), 0)::bigint AS cached_tokens,
    coalesce(sum(r.completion_tokens), 0)::bigint AS completion_tokens,
    coalesce(sum(r.gpu_seconds), 0) AS gpu_seconds,
    coalesce(sum(r.preempted_gpu_seconds), 0) AS preempted_gpu_seconds,
    (count(*) FILTER (WHERE r.finish_reason = 'cancelled'))::bigint AS cancelled_requests,
    (count(*) FILTER (WHERE r.finish_reason = 'error'))::bigint AS errored_requests";

/// Prunes request_log to the day partitions that can hold `[$1, $2)` (ids
/// are created at request start; a day of slack either side).
const IN_PERIOD: &str =
    "r.request_id >= request_log_bound(($1::timestamptz AT TIME ZONE 'UTC')::date - 1)
    AND r.request_id < request_log_bound(($2::timestamptz AT TIME ZONE 'UTC')::date + 2)
    AND r.started_at >= $1 AND r.started_at < $2";

async fn keyed(
    pool: &PgPool,
    sql: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<BTreeMap<Key, Sums>, sqlx::Error> {
    let rows: Vec<KeyedSums> = sqlx::query_as(sql)
        .bind(from)
        .bind(to)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| ((r.tenant_id, r.model, r.priority, r.hour), r.sums))
        .collect())
}

/// Compares `[from, to)` (by the hour a request started in). Empty: they agree.
pub async fn reconcile(
    pool: &PgPool,
    archive: Option<&ArchiveStore>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Difference>, ReconcileError> {
    let key_columns = "r.tenant_id, r.model, r.priority, date_trunc('hour', r.started_at) AS hour";
    let log = keyed(
        pool,
        &format!(
            "SELECT {key_columns}, {SUMS} FROM request_log r WHERE {IN_PERIOD} GROUP BY 1, 2, 3, 4"
        ),
        from,
        to,
    )
    .await?;
    let hourly = keyed(
        pool,
        "SELECT tenant_id, model, priority, hour, requests, prompt_tokens, cached_tokens,
                completion_tokens, gpu_seconds, preempted_gpu_seconds, cancelled_requests,
                errored_requests
         FROM usage_hourly WHERE hour >= date_trunc('hour', $1::timestamptz) AND hour < $2",
        from,
        to,
    )
    .await?;
    let kept: BTreeSet<NaiveDate> = crate::retention::partitions(pool)
        .await?
        .into_iter()
        .collect();
    let archived = match archive {
        None => None,
        Some(store) => {
            let queued = keyed(
                pool,
                &format!(
                    "SELECT {key_columns}, {SUMS} FROM archive_queue q
                     JOIN request_log r ON r.request_id = q.request_id
                     WHERE {IN_PERIOD} GROUP BY 1, 2, 3, 4"
                ),
                from,
                to,
            )
            .await?;
            let mut files: BTreeMap<Key, Sums> = BTreeMap::new();
            for r in archive::reader::scan(pool, store, from, to).await? {
                let e = &r.event;
                files
                    .entry((e.tenant_id.clone(), e.model.clone(), e.priority, hour_of(e)))
                    .or_default()
                    .add(e);
            }
            for (k, s) in queued {
                files.entry(k).or_default().merge(&s);
            }
            Some(files)
        }
    };
    let mut keys: BTreeSet<&Key> = log.keys().chain(hourly.keys()).collect();
    if let Some(a) = &archived {
        keys.extend(a.keys());
    }
    let zero = Sums::default();
    let mut out = Vec::new();
    for k in keys {
        let h = hourly.get(k).unwrap_or(&zero);
        let l = kept
            .contains(&k.3.date_naive())
            .then(|| log.get(k).cloned().unwrap_or_default());
        let a = archived
            .as_ref()
            .map(|a| a.get(k).cloned().unwrap_or_default());
        let mut fields: Vec<&'static str> = Vec::new();
        for other in [&l, &a].into_iter().flatten() {
            for f in differing(h, other) {
                if !fields.contains(&f) {
                    fields.push(f);
                }
            }
        }
        if !fields.is_empty() {
            out.push(Difference {
                tenant_id: k.0.clone(),
                model: k.1.clone(),
                priority: k.2,
                hour: k.3,
                request_log: l,
                usage_hourly: h.clone(),
                archive: a,
                fields,
            });
        }
    }
    out.sort_by(|x, y| {
        (x.hour, &x.tenant_id, &x.model, x.priority).cmp(&(
            y.hour,
            &y.tenant_id,
            &y.model,
            y.priority,
        ))
    });
    Ok(out)
}
