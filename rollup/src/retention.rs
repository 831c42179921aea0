//! request_log retention: whole UTC-day partitions older than the kept
//! window are dropped. The day is recorded in `request_log_retention` in the
//! same transaction, and ingest dead-letters later re-sends from dropped
//! days (they could no longer be recognised as duplicates).
//!
//! A day the Parquet archive has not covered is never dropped (unless the
//! deployment runs without an archiver: [`ArchiveRule::Ignore`]). The
//! archive follows request_log itself: every row enters the archive queue
//! in the statement that inserts it (`archive_queue` lists the queued ids),
//! and leaves it in the transaction that lists the archive file holding it. So a day is covered exactly when none
//! of its request ids is queued, and the check and the drop happen in one
//! transaction under the usage lock, which ingest's batches take shared: no
//! row of the day can be inserted (and queued) between them. After the
//! drop, ingest dead-letters the day's late events (`beyond_retention`),
//! so nothing new of that day needs archiving.
//!
//! Without an archiver the queue is emptied of a day's ids as the day is
//! dropped (nothing will ever take them off otherwise).

use chrono::NaiveDate;
use sqlx::PgPool;

/// Whether dropping a day waits for the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveRule {
    /// Drop a due day only once none of its ids waits in `archive_queue`.
    Require,
    /// No archiver in this deployment: drop due days as they come.
    Ignore,
}

/// How many of `day`'s requests still wait to be archived.
pub async fn queued(pool: &PgPool, day: NaiveDate) -> Result<i64, sqlx::Error> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM archive_queue
         WHERE request_id >= request_log_bound($1) AND request_id < request_log_bound($1 + 1)",
    )
    .bind(day)
    .fetch_one(pool)
    .await?;
    Ok(n)
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
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(schema::USAGE_LOCK)
            .execute(&mut *tx)
            .await?;
        let in_queue = "FROM archive_queue
             WHERE request_id >= request_log_bound($1) AND request_id < request_log_bound($1 + 1)";
        match archive {
            ArchiveRule::Require => {
                let (waiting,): (i64,) = sqlx::query_as(&format!("SELECT count(*) {in_queue}"))
                    .bind(day)
                    .fetch_one(&mut *tx)
                    .await?;
                if waiting > 0 {
                    tx.rollback().await?;
                    tracing::info!(%day, waiting, "day is due but not archived yet; kept");
                    break;
                }
            }
            ArchiveRule::Ignore => {
                sqlx::query("SELECT archive_queue_forget_day($1)")
                    .bind(day)
                    .execute(&mut *tx)
                    .await?;
            }
        }
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
