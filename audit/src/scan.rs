//! The archive, hour by hour, through DataFusion: the live files the
//! manifest lists for a period (request-id days around it, as every reader
//! of the archive narrows them: an id is created when its request starts),
//! read as one table under the current schema — a file written before a
//! column existed reads it as null — and aggregated in one query per
//! (tenant, model, priority, UTC hour started, dedicated owner, ingestion
//! class).
//!
//! The ingestion class of a row is how many of the given instants are at
//! or before its `ingested_at`: a row is visible at the `k`-th instant
//! (was ingested before it) exactly when its class is at most `k`. One
//! scan so serves every invoice and adjustment of the audit.
//!
//! Times are compared as integers (milliseconds and microseconds since
//! the epoch, the files' own units) and GPU time is summed as
//! `Decimal128`: nothing on this path is a float.

use std::sync::Arc;
use std::time::{Duration, Instant};

use archive::store::ArchiveStore;
use chrono::{DateTime, TimeDelta, Utc};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Int16Type, Int64Type};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use rust_decimal::Decimal;
use sqlx::PgPool;
use url::Url;

use crate::error::AuditError;

/// Where the archive's objects are registered with the query engine.
const ARCHIVE_URL: &str = "archive://files/";

/// One aggregate of archived requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveHour {
    pub tenant_id: String,
    pub model: String,
    pub priority: i16,
    /// The UTC hour the requests started in.
    pub hour: DateTime<Utc>,
    /// The owner of the dedicated replica they ran on, if any.
    pub dedicated_to: Option<String>,
    /// How many of the scan's instants are at or before their `ingested_at`.
    pub class: usize,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub gpu_seconds: Decimal,
}

/// What a scan read.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScanStats {
    pub files: usize,
    pub bytes: i64,
    /// Requests aggregated (rows in the period).
    pub requests: i64,
    pub elapsed: Duration,
}

/// The archived requests that started in `[from, to)`, aggregated, with
/// ingestion classes against `instants` (sorted, distinct).
pub async fn hours(
    pool: &PgPool,
    store: &ArchiveStore,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    instants: &[DateTime<Utc>],
) -> Result<(Vec<ArchiveHour>, ScanStats), AuditError> {
    let started = Instant::now();
    let (ctx, mut stats) = open(pool, store, from, to).await?;
    let mut out = Vec::new();
    if let Some(ctx) = ctx {
        let batches = ctx.sql(&query(from, to, instants)).await?.collect().await?;
        for b in &batches {
            read_batch(b, &mut out)?;
        }
    }
    stats.requests = out.iter().map(|h| h.requests).sum();
    stats.elapsed = started.elapsed();
    Ok((out, stats))
}

/// Per tenant and UTC hour started in `[from, to)`, the latest
/// `ingested_at` among its requests ingested at or after `after` (late
/// usage, as far as any invoice finalized at `after` or later is concerned).
pub async fn late(
    pool: &PgPool,
    store: &ArchiveStore,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    after: DateTime<Utc>,
) -> Result<Vec<(String, DateTime<Utc>, DateTime<Utc>)>, AuditError> {
    let (Some(ctx), _) = open(pool, store, from, to).await? else {
        return Ok(Vec::new());
    };
    let sql = format!(
        "SELECT tenant_id, arrow_cast(started_at, 'Int64') / 3600000 AS hour,
                max(arrow_cast(ingested_at, 'Int64')) AS latest
         FROM archive
         WHERE {period} AND ingested_at >= arrow_cast({after}, '{MICROS}')
         GROUP BY 1, 2",
        period = period(from, to),
        after = after.timestamp_micros(),
    );
    let mut out = Vec::new();
    for b in ctx.sql(&sql).await?.collect().await? {
        let tenants = text(&b, "tenant_id")?;
        let hour = int64(&b, "hour")?;
        let latest = int64(&b, "latest")?;
        for (i, tenant) in tenants.into_iter().enumerate() {
            let h = DateTime::from_timestamp(hour.value(i) * 3600, 0).ok_or_else(|| bad("hour"))?;
            let l =
                DateTime::from_timestamp_micros(latest.value(i)).ok_or_else(|| bad("latest"))?;
            out.push((tenant.ok_or_else(|| bad("tenant_id"))?, h, l));
        }
    }
    Ok(out)
}

/// A query engine with the live files of the period's request-id days
/// registered as the table `archive` (`None` when there are none).
async fn open(
    pool: &PgPool,
    store: &ArchiveStore,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<(Option<SessionContext>, ScanStats), AuditError> {
    let first = (from - TimeDelta::days(1)).date_naive();
    let last = (to + TimeDelta::days(1)).date_naive();
    let files = archive::manifest::live(pool, first, last).await?;
    let stats = ScanStats {
        files: files.len(),
        bytes: files.iter().map(|f| f.bytes).sum(),
        ..ScanStats::default()
    };
    if files.is_empty() {
        return Ok((None, stats));
    }
    let ctx = SessionContext::new();
    let base = Url::parse(ARCHIVE_URL).map_err(|e| AuditError::Invalid(e.to_string()))?;
    ctx.register_object_store(&base, Arc::clone(&store.objects));
    let paths: Vec<String> = files
        .iter()
        .map(|f| format!("{ARCHIVE_URL}{}", f.path))
        .collect();
    let schema = archive::format::schema();
    let table = ctx
        .read_parquet(paths, ParquetReadOptions::default().schema(&schema))
        .await?;
    ctx.register_table("archive", table.into_view())?;
    Ok((Some(ctx), stats))
}

const MILLIS: &str = "Timestamp(Millisecond, Some(\"UTC\"))";
const MICROS: &str = "Timestamp(Microsecond, Some(\"UTC\"))";

/// The filter on the hour requests started in.
fn period(from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    format!(
        "started_at >= arrow_cast({}, '{MILLIS}') AND started_at < arrow_cast({}, '{MILLIS}')",
        from.timestamp_millis(),
        to.timestamp_millis()
    )
}

/// The aggregation, in SQL a reader can run in any engine over the files.
fn query(from: DateTime<Utc>, to: DateTime<Utc>, instants: &[DateTime<Utc>]) -> String {
    let class = if instants.is_empty() {
        "0".to_owned()
    } else {
        let arms: String = instants
            .iter()
            .enumerate()
            .map(|(k, t)| {
                format!(
                    " WHEN arrow_cast(ingested_at, 'Int64') < {} THEN {k}",
                    t.timestamp_micros()
                )
            })
            .collect();
        format!("CASE{arms} ELSE {} END", instants.len())
    };
    format!(
        "SELECT tenant_id, model, priority,
                arrow_cast(started_at, 'Int64') / 3600000 AS hour,
                dedicated_to,
                {class} AS class,
                count(*) AS requests,
                sum(prompt_tokens) AS prompt_tokens,
                sum(cached_tokens) AS cached_tokens,
                sum(completion_tokens) AS completion_tokens,
                sum(gpu_seconds) AS gpu_seconds
         FROM archive
         WHERE {period}
         GROUP BY 1, 2, 3, 4, 5, 6",
        period = period(from, to),
    )
}

fn bad(column: &str) -> AuditError {
    AuditError::Invalid(format!(
        "the audit query's column {column} has an unexpected type"
    ))
}

fn column<'b>(b: &'b RecordBatch, name: &str) -> Result<&'b ArrayRef, AuditError> {
    b.column_by_name(name).ok_or_else(|| bad(name))
}

/// A text column (Utf8 or the engine's Utf8View) as owned strings.
fn text(b: &RecordBatch, name: &str) -> Result<Vec<Option<String>>, AuditError> {
    let c = cast(column(b, name)?, &DataType::Utf8)?;
    let s = c.as_string_opt::<i32>().ok_or_else(|| bad(name))?;
    Ok((0..s.len())
        .map(|i| s.is_valid(i).then(|| s.value(i).to_owned()))
        .collect())
}

fn int64(b: &RecordBatch, name: &str) -> Result<Int64Array, AuditError> {
    column(b, name)?
        .as_primitive_opt::<Int64Type>()
        .cloned()
        .ok_or_else(|| bad(name))
}

fn read_batch(b: &RecordBatch, out: &mut Vec<ArchiveHour>) -> Result<(), AuditError> {
    let tenants = text(b, "tenant_id")?;
    let models = text(b, "model")?;
    let owners = text(b, "dedicated_to")?;
    let priority = column(b, "priority")?
        .as_primitive_opt::<Int16Type>()
        .ok_or_else(|| bad("priority"))?;
    let hour = int64(b, "hour")?;
    let class = int64(b, "class")?;
    let requests = int64(b, "requests")?;
    let prompt = int64(b, "prompt_tokens")?;
    let cached = int64(b, "cached_tokens")?;
    let completion = int64(b, "completion_tokens")?;
    let gpu = column(b, "gpu_seconds")?
        .as_primitive_opt::<Decimal128Type>()
        .ok_or_else(|| bad("gpu_seconds"))?;
    let scale = u32::try_from(gpu.scale()).map_err(|_| bad("gpu_seconds"))?;
    for i in 0..b.num_rows() {
        let hour = DateTime::from_timestamp(hour.value(i) * 3600, 0).ok_or_else(|| bad("hour"))?;
        let gpu_seconds = Decimal::try_from_i128_with_scale(gpu.value(i), scale)
            .map_err(|e| AuditError::Invalid(format!("gpu_seconds: {e}")))?;
        out.push(ArchiveHour {
            tenant_id: tenants[i].clone().ok_or_else(|| bad("tenant_id"))?,
            model: models[i].clone().ok_or_else(|| bad("model"))?,
            priority: priority.value(i),
            hour,
            dedicated_to: owners[i].clone(),
            class: usize::try_from(class.value(i)).map_err(|_| bad("class"))?,
            requests: requests.value(i),
            prompt_tokens: prompt.value(i),
            cached_tokens: cached.value(i),
            completion_tokens: completion.value(i),
            gpu_seconds,
        });
    }
    Ok(())
}
