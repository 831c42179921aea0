//! request_log retention: whole UTC-day partitions older than the kept
//! window are dropped. The day is recorded in `request_log_retention` in the
//! same transaction, and ingest dead-letters later re-sends from dropped
//! days (they could no longer be recognised as duplicates).
//!
//! A day the Parquet archive has not covered is never dropped (unless the
//! deployment runs without an archiver: [`ArchiveRule::Ignore`]). The rule
//! is a two-phase barrier. When a day first becomes due, ingest's stored
//! offsets are recorded as its barrier (per topic and partition, the
//! highest over ingest's groups): every request_log row of that day that
//! exists then was ingested from a message below it, in the same
//! transaction that moved the offset. The archiver archives every valid
//! message it reads, so once its offset reaches the barrier in every
//! partition, every such row is in the archive, and the day is dropped.
//! Barriers are kept after the drop, as a record of what was checked.
//!
//! A request of day D that ingest first stores after D's barrier was taken
//! (at least `keep_days` late) is not waited for: it stays on the topic and
//! the archiver archives it when it gets there, unless the topic's own
//! retention is shorter than the archiver's lag.

use chrono::NaiveDate;
use sqlx::PgPool;

/// Whether dropping a day waits for the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveRule {
    /// Drop a due day only once this archiver group has passed its barrier.
    Require { group: String },
    /// No archiver in this deployment: drop due days as they come.
    Ignore,
}

/// A partition where the archive has not reached a day's barrier yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    pub topic: String,
    pub partition: i32,
    pub barrier: i64,
    pub archived: Option<i64>,
}

/// Records `day`'s barrier unless it has one: ingest's offsets as they are now.
pub async fn record_barrier(pool: &PgPool, day: NaiveDate) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH new_day AS (
             INSERT INTO retention_barrier_days (day) VALUES ($1)
             ON CONFLICT DO NOTHING RETURNING day)
         INSERT INTO retention_barriers (day, topic, kafka_partition, next_offset)
         SELECT d.day, o.topic, o.kafka_partition, max(o.next_offset)
         FROM new_day d CROSS JOIN consumer_offsets o
         GROUP BY d.day, o.topic, o.kafka_partition",
    )
    .bind(day)
    .execute(pool)
    .await?;
    Ok(())
}

/// The partitions where archiver `group` is still below `day`'s barrier.
pub async fn behind(
    pool: &PgPool,
    day: NaiveDate,
    group: &str,
) -> Result<Vec<Behind>, sqlx::Error> {
    let rows: Vec<(String, i32, i64, Option<i64>)> = sqlx::query_as(
        "SELECT b.topic, b.kafka_partition, b.next_offset, a.next_offset
         FROM retention_barriers b
         LEFT JOIN archive_offsets a ON a.consumer_group = $2 AND a.topic = b.topic
                                    AND a.kafka_partition = b.kafka_partition
         WHERE b.day = $1 AND coalesce(a.next_offset, 0) < b.next_offset
         ORDER BY b.topic, b.kafka_partition",
    )
    .bind(day)
    .bind(group)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(topic, partition, barrier, archived)| Behind {
            topic,
            partition,
            barrier,
            archived,
        })
        .collect())
}

/// The dates of request_log's day partitions, oldest first.
pub async fn partitions(pool: &PgPool) -> Result<Vec<NaiveDate>, sqlx::Error> {
    let names: Vec<(String,)> = sqlx::query_as(
        "SELECT c.relname::text FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid
         JOIN pg_class p ON p.oid = i.inhparent
         WHERE p.relname = 'request_log'",
    )
    .fetch_all(pool)
    .await?;
    let mut days: Vec<NaiveDate> = names
        .iter()
        .filter_map(|(n,)| n.strip_prefix("request_log_"))
        .filter_map(|d| NaiveDate::parse_from_str(d, "%Y%m%d").ok())
        .collect();
    days.sort_unstable();
    Ok(days)
}

/// Drops every day partition before `today - keep_days` that `archive`
/// allows, oldest first, stopping at the first day still waiting for the
/// archive; returns the days dropped.
pub async fn drop_expired(
    pool: &PgPool,
    today: NaiveDate,
    keep_days: u32,
    archive: &ArchiveRule,
) -> Result<Vec<NaiveDate>, sqlx::Error> {
    let horizon = today - chrono::Days::new(u64::from(keep_days));
    let mut dropped = Vec::new();
    for day in partitions(pool).await? {
        if day >= horizon {
            break;
        }
        if let ArchiveRule::Require { group } = archive {
            record_barrier(pool, day).await?;
            let behind = behind(pool, day, group).await?;
            if !behind.is_empty() {
                tracing::info!(%day, ?behind, "day is due but not archived yet; kept");
                break;
            }
        }
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(schema::USAGE_LOCK)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO request_log_retention (dropped_through) VALUES ($1)
             ON CONFLICT (singleton) DO UPDATE
             SET dropped_through = greatest(request_log_retention.dropped_through, EXCLUDED.dropped_through)",
        )
        .bind(day)
        .execute(&mut *tx)
        .await?;
        // The name is built from a parsed date, never from input text.
        let table = format!("request_log_{}", day.format("%Y%m%d"));
        sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        dropped.push(day);
    }
    Ok(dropped)
}
