//! request_log retention: whole UTC-day partitions older than the kept
//! window are dropped. The day is recorded in `request_log_retention` in the
//! same transaction, and ingest dead-letters later re-sends from dropped
//! days (they could no longer be recognised as duplicates).
//!
//! There is no Parquet archive yet; once there is, a day it has not covered
//! must not be dropped (the archive issue adds that check here).

use chrono::NaiveDate;
use sqlx::PgPool;

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

/// Drops every day partition before `today - keep_days`; returns the days dropped.
pub async fn drop_expired(
    pool: &PgPool,
    today: NaiveDate,
    keep_days: u32,
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
