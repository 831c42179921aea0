//! One archive batch: queued request_log rows → one Parquet file per UTC
//! hour of their request ids → one manifest transaction.
//!
//! Order: read up to `limit` queued ids (oldest queue row first), encode one
//! file per hour, write every file, then [`manifest::commit_batch`]: the
//! ids leave the queue and the files are listed together. A crash anywhere
//! before that commit leaves the rows queued (the next batch archives them
//! again, under new names) and the files written so far as orphans, which
//! nothing lists and gc deletes after its grace period; a crash after it
//! has nothing left to do. So no crash loses a row or lists it twice.
//!
//! File names carry a fresh UUIDv7 per batch:
//! `date=YYYY-MM-DD/hour=HH/batch-<uuid>.parquet`. A name is never reused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{NaiveDate, Timelike};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::ArchiveError;
use crate::format::{self, ArchivedRequest, Layout};
use crate::manifest::{self, NewFile};
use crate::{queue, store};

/// What one batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    pub rows: u64,
    pub files: u64,
    pub bytes: u64,
    /// `false`: another archiver committed some of these rows first; this
    /// batch's files are orphans.
    pub committed: bool,
    pub commit_took: Duration,
}

/// The (day, hour) of request-id time a row belongs to.
pub fn hour_of(r: &ArchivedRequest) -> (NaiveDate, i16) {
    let t = r.event.request_id.created_at();
    (t.date_naive(), t.hour() as i16)
}

/// The path of a file of `hour` named by `name`.
pub fn path(day: NaiveDate, hour: i16, name: &str) -> String {
    format!(
        "date={}/hour={hour:02}/{name}.parquet",
        day.format("%Y-%m-%d")
    )
}

/// Encodes rows already grouped by hour (each group in id order) as files.
pub fn encode_files(
    hours: BTreeMap<(NaiveDate, i16), Vec<ArchivedRequest>>,
    name: &str,
    layout: Layout,
    level: i16,
) -> Result<Vec<(NewFile, bytes::Bytes)>, ArchiveError> {
    let mut out = Vec::with_capacity(hours.len());
    for ((day, hour), rows) in hours {
        let (Some(min), Some(max)) = (
            rows.iter().map(|r| r.event.request_id).min(),
            rows.iter().map(|r| r.event.request_id).max(),
        ) else {
            continue;
        };
        let bytes = format::encode(&rows, layout)?;
        out.push((
            NewFile {
                path: path(day, hour, name),
                day,
                hour,
                level,
                min_request_id: min.as_uuid(),
                max_request_id: max.as_uuid(),
                rows: rows.len() as i64,
                bytes: bytes.len() as i64,
                sha256: Sha256::digest(&bytes).into(),
            },
            bytes::Bytes::from(bytes),
        ));
    }
    Ok(out)
}

/// Archives up to `limit` queued rows. `crash_after_write`, for fault
/// tests only, aborts the process between writing the files and the commit.
pub async fn archive_batch(
    pool: &PgPool,
    store: &crate::store::ArchiveStore,
    limit: usize,
    crash_after_write: bool,
) -> Result<Batch, ArchiveError> {
    let queue::Pending { taken, rows } = queue::pending(pool, limit).await?;
    if taken.is_empty() {
        return Ok(Batch {
            committed: true,
            ..Batch::default()
        });
    }
    let count = rows.len() as u64;
    // Encoding is CPU work: off the async workers.
    let files = tokio::task::spawn_blocking(move || {
        let mut hours: BTreeMap<(NaiveDate, i16), Vec<ArchivedRequest>> = BTreeMap::new();
        for r in rows {
            hours.entry(hour_of(&r)).or_default().push(r);
        }
        let name = format!("batch-{}", Uuid::now_v7());
        encode_files(hours, &name, Layout::Batch, 0)
    })
    .await
    .map_err(|e| ArchiveError::Parquet(format!("encoder task failed: {e}")))??;
    for (file, bytes) in &files {
        store::put(store, &file.path, bytes.clone()).await?;
    }
    if crash_after_write {
        tracing::error!("ARCHIVE_TEST_CRASH_AFTER_WRITE: aborting before the commit");
        std::process::abort();
    }
    let listed: Vec<NewFile> = files.iter().map(|(f, _)| f.clone()).collect();
    let started = Instant::now();
    let committed = manifest::commit_batch(pool, &taken, &listed).await?;
    Ok(Batch {
        rows: count,
        files: listed.len() as u64,
        bytes: listed.iter().map(|f| f.bytes as u64).sum(),
        committed,
        commit_took: started.elapsed(),
    })
}
