//! The archive's bookkeeping in Postgres: `archive_offsets` (where the
//! archiver is in each partition) and `archive_manifest` (what it has
//! written). A batch's files are written first; then one transaction moves
//! each partition's archive offset by compare-and-set and inserts the
//! manifest rows. A file counts only once that transaction committed: a
//! crash before it leaves an orphan file and the batch is archived again.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Timelike, Utc};
use sqlx::{PgPool, QueryBuilder};

use crate::offsets::{self, ConsumerKey, Ledger};

/// One manifest row: a written file, or a range without valid events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub partition: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub path: Option<String>,
    pub hour: Option<DateTime<Utc>>,
    pub rows: i64,
    pub skipped: i64,
    pub bytes: i64,
    pub sha256: Option<[u8; 32]>,
}

/// The result of trying to commit a batch's manifest.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    /// As in ingest: `done` partitions were already committed exactly to
    /// this batch's end; `fenced` ones moved elsewhere (this archiver is a
    /// zombie for them and must rejoin).
    Stale {
        done: Vec<i32>,
        fenced: Vec<i32>,
    },
}

/// Commits a batch whose files are already written: offsets first (their
/// row locks serialize two archivers of one partition, and a zombie fails
/// before writing anything), then the manifest rows, in one transaction.
pub async fn commit(
    pool: &PgPool,
    key: &ConsumerKey,
    expected: &BTreeMap<i32, Option<i64>>,
    next_offsets: &BTreeMap<i32, i64>,
    entries: &[Entry],
) -> Result<Outcome, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let unmoved = offsets::move_all(&mut tx, Ledger::Archive, key, expected, next_offsets).await?;
    if !unmoved.is_empty() {
        tx.rollback().await?;
        return Ok(Outcome::Stale {
            done: unmoved.done,
            fenced: unmoved.fenced,
        });
    }
    if !entries.is_empty() {
        let mut insert = QueryBuilder::new(
            "INSERT INTO archive_manifest (consumer_group, topic, kafka_partition, first_offset,
             last_offset, path, day, hour, rows, skipped, bytes, sha256) ",
        );
        insert.push_values(entries, |mut row, e| {
            let day: Option<NaiveDate> = e.hour.map(|h| h.date_naive());
            let hour: Option<i16> = e.hour.and_then(|h| i16::try_from(h.hour()).ok());
            row.push_bind(&key.group)
                .push_bind(&key.topic)
                .push_bind(e.partition)
                .push_bind(e.first_offset)
                .push_bind(e.last_offset)
                .push_bind(e.path.clone())
                .push_bind(day)
                .push_bind(hour)
                .push_bind(e.rows)
                .push_bind(e.skipped)
                .push_bind(e.bytes)
                .push_bind(e.sha256.map(|h| h.to_vec()));
        });
        insert.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(Outcome::Committed)
}

/// A committed manifest row, as `verify` and readers see it.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct Listed {
    pub kafka_partition: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub path: Option<String>,
    pub day: Option<NaiveDate>,
    pub hour: Option<i16>,
    pub rows: i64,
    pub skipped: i64,
    pub bytes: i64,
    #[serde(skip)]
    pub sha256: Option<Vec<u8>>,
}

/// Every manifest row of one archiver group and topic, by partition and offset.
pub async fn list(pool: &PgPool, key: &ConsumerKey) -> Result<Vec<Listed>, sqlx::Error> {
    sqlx::query_as(
        "SELECT kafka_partition, first_offset, last_offset, path, day, hour, rows, skipped,
                bytes, sha256
         FROM archive_manifest WHERE consumer_group = $1 AND topic = $2
         ORDER BY kafka_partition, first_offset",
    )
    .bind(&key.group)
    .bind(&key.topic)
    .fetch_all(pool)
    .await
}
