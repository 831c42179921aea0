//! `archive_manifest`: every file of the archive, live or retired, and the
//! two transactions that change it.
//!
//! - A batch ([`commit_batch`]): the archiver has written the files of some
//!   queued ids; one transaction takes exactly those ids off the queue
//!   (`archive_queue_batches`: the rows taken whole are deleted, the one
//!   taken in part loses its first ids) and lists the files. If any is no
//!   longer queued (another archiver committed it first) the transaction
//!   rolls back and the files stay orphans, never read.
//! - A compaction ([`swap`]): the merged files are listed and the files they
//!   replace retired in one transaction, provided those are all still live.
//!
//! Readers list live files in one statement ([`live`]), so they see every
//! row exactly once whatever commits around them. A retired file stays in
//! the store for a grace period (readers that listed it before the swap may
//! still be reading it; object stores have no open handles), then gc
//! deletes it and its row.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{PgPool, QueryBuilder};
use uuid::Uuid;

use crate::error::ArchiveError;
use crate::queue::Taken;

/// Serializes batch commits and compaction swaps (each is short), so two
/// archivers never deadlock deleting overlapping rows from the queue.
pub const MANIFEST_LOCK: i64 = 0x6d65_7465_7261_7263; // "meterarc"

/// A file about to be listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFile {
    pub path: String,
    pub day: NaiveDate,
    pub hour: i16,
    /// 0: a batch file; 1: a compacted one.
    pub level: i16,
    pub min_request_id: Uuid,
    pub max_request_id: Uuid,
    pub rows: i64,
    pub bytes: i64,
    pub sha256: [u8; 32],
}

/// A listed file.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct Listed {
    pub file_id: i64,
    pub path: String,
    pub day: NaiveDate,
    pub hour: i16,
    pub level: i16,
    pub min_request_id: Uuid,
    pub max_request_id: Uuid,
    pub rows: i64,
    pub bytes: i64,
    #[serde(skip)]
    pub sha256: Vec<u8>,
    pub retired_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "file_id, path, day, hour, level, min_request_id, max_request_id, rows,
     bytes, sha256, retired_at";

async fn insert_files(
    conn: &mut sqlx::PgConnection,
    files: &[NewFile],
) -> Result<Option<i64>, sqlx::Error> {
    if files.is_empty() {
        return Ok(None);
    }
    let mut insert = QueryBuilder::new(
        "INSERT INTO archive_manifest (path, day, hour, level, min_request_id, max_request_id,
         rows, bytes, sha256) ",
    );
    insert.push_values(files, |mut row, f| {
        row.push_bind(&f.path)
            .push_bind(f.day)
            .push_bind(f.hour)
            .push_bind(f.level)
            .push_bind(f.min_request_id)
            .push_bind(f.max_request_id)
            .push_bind(f.rows)
            .push_bind(f.bytes)
            .push_bind(f.sha256.to_vec());
    });
    insert.push(" RETURNING file_id");
    let ids: Vec<(i64,)> = insert.build_query_as().fetch_all(&mut *conn).await?;
    Ok(ids.into_iter().map(|(id,)| id).min())
}

/// Lists a batch's files and takes its ids off the queue (the queue rows
/// it took whole, the first ids of the one it took part of), in one
/// transaction. `false`: some were no longer queued; nothing changed.
pub async fn commit_batch(
    pool: &PgPool,
    taken: &Taken,
    files: &[NewFile],
) -> Result<bool, ArchiveError> {
    let mut tx = pool.begin().await?;
    crate::queue::without_jit(&mut tx).await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MANIFEST_LOCK)
        .execute(&mut *tx)
        .await?;
    let deleted = sqlx::query("DELETE FROM archive_queue_batches WHERE batch_id = ANY($1)")
        .bind(&taken.whole)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let cut = match taken.part {
        None => 1,
        // Still holding what it held when read: no one took ids of it since.
        Some((batch_id, held, first)) => sqlx::query(
            "UPDATE archive_queue_batches
             SET request_ids = request_ids[$3 + 1:], first_id = request_ids[$3 + 1],
                 ids = ids - $3
             WHERE batch_id = $1 AND ids = $2",
        )
        .bind(batch_id)
        .bind(held)
        .bind(first)
        .execute(&mut *tx)
        .await?
        .rows_affected(),
    };
    if deleted != taken.whole.len() as u64 || cut != 1 {
        tx.rollback().await?;
        return Ok(false);
    }
    insert_files(&mut tx, files).await?;
    tx.commit().await?;
    Ok(true)
}

/// Lists `merged` and retires `replaced` in one transaction, provided every
/// replaced file is still live. `false`: one was not; nothing changed.
pub async fn swap(
    pool: &PgPool,
    replaced: &[i64],
    merged: &[NewFile],
) -> Result<bool, ArchiveError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MANIFEST_LOCK)
        .execute(&mut *tx)
        .await?;
    let Some(first) = insert_files(&mut tx, merged).await? else {
        return Ok(false);
    };
    let retired = sqlx::query(
        "UPDATE archive_manifest SET retired_at = now(), replaced_by = $2
         WHERE file_id = ANY($1) AND retired_at IS NULL",
    )
    .bind(replaced)
    .bind(first)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if retired != replaced.len() as u64 {
        tx.rollback().await?;
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

/// The live files of request-id days `[from, to]`, in one snapshot.
pub async fn live(
    pool: &PgPool,
    from: NaiveDate,
    to: NaiveDate,
) -> Result<Vec<Listed>, ArchiveError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM archive_manifest
         WHERE retired_at IS NULL AND day BETWEEN $1 AND $2 ORDER BY day, hour, file_id"
    ))
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?)
}

/// The live files of one hour of request-id time.
pub async fn live_hour(
    pool: &PgPool,
    day: NaiveDate,
    hour: i16,
) -> Result<Vec<Listed>, ArchiveError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM archive_manifest
         WHERE retired_at IS NULL AND day = $1 AND hour = $2 ORDER BY file_id"
    ))
    .bind(day)
    .bind(hour)
    .fetch_all(pool)
    .await?)
}

/// The live files whose id range holds `id` (its day and hour, then range).
pub async fn live_holding(
    pool: &PgPool,
    id: Uuid,
    day: NaiveDate,
    hour: i16,
) -> Result<Vec<Listed>, ArchiveError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM archive_manifest
         WHERE retired_at IS NULL AND day = $1 AND hour = $2
           AND min_request_id <= $3 AND max_request_id >= $3
         ORDER BY file_id"
    ))
    .bind(day)
    .bind(hour)
    .bind(id)
    .fetch_all(pool)
    .await?)
}

/// Every listed file, live and retired.
pub async fn all(pool: &PgPool) -> Result<Vec<Listed>, ArchiveError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM archive_manifest ORDER BY day, hour, file_id"
    ))
    .fetch_all(pool)
    .await?)
}

/// Hours (day, hour) that compaction should merge: before `before`, with
/// more than one live file or a batch file.
pub async fn hours_to_compact(
    pool: &PgPool,
    before: DateTime<Utc>,
) -> Result<Vec<(NaiveDate, i16)>, ArchiveError> {
    Ok(sqlx::query_as(
        "SELECT day, hour FROM archive_manifest
         WHERE retired_at IS NULL
           AND (day + make_interval(hours => hour + 1)) AT TIME ZONE 'UTC' <= $1
         GROUP BY day, hour HAVING count(*) > 1 OR bool_or(level = 0)
         ORDER BY day, hour",
    )
    .bind(before)
    .fetch_all(pool)
    .await?)
}

/// Retired files whose retirement is older than `cutoff`.
pub async fn retired_before(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
) -> Result<Vec<Listed>, ArchiveError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM archive_manifest
         WHERE retired_at IS NOT NULL AND retired_at < $1 ORDER BY file_id"
    ))
    .bind(cutoff)
    .fetch_all(pool)
    .await?)
}

/// Forgets retired files gc has deleted.
pub async fn forget_retired(pool: &PgPool, file_ids: &[i64]) -> Result<(), ArchiveError> {
    sqlx::query("DELETE FROM archive_manifest WHERE file_id = ANY($1) AND retired_at IS NOT NULL")
        .bind(file_ids)
        .execute(pool)
        .await?;
    Ok(())
}

/// Request rows still queued for the archive.
pub async fn queued(pool: &PgPool) -> Result<i64, ArchiveError> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT coalesce(sum(ids), 0)::bigint FROM archive_queue_batches")
            .fetch_one(pool)
            .await?;
    Ok(n)
}
