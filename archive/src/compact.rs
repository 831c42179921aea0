//! Compaction: the files of a closed hour (of request-id time) merged into
//! one, or a few when the hour is large, in the compacted layout (sorted by
//! tenant and time, zstd, row groups sized for scans, a bloom filter on the
//! request id), swapped in through the manifest in one transaction.
//!
//! Order: list the hour's live files, read and merge them, write the merged
//! files under new names, then [`manifest::swap`]: the merged files become
//! live and the replaced ones retired together, provided every replaced
//! file was still live. A crash before the swap leaves orphans and the old
//! files live; a crash after it has nothing left to do. A batch that adds a
//! file to the hour meanwhile is untouched (only the files read are
//! retired); the next compaction merges it. Retired files are deleted by
//! gc only after its grace period.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use futures::{StreamExt, TryStreamExt};
use sqlx::PgPool;
use uuid::Uuid;

use crate::archiver::encode_files;
use crate::error::ArchiveError;
use crate::format::{self, ArchivedRequest, Layout};
use crate::manifest::{self, NewFile};
use crate::store;

/// When and how hours are compacted.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// An hour is compacted once its end is this far in the past.
    pub settle: TimeDelta,
    /// At most this many rows per merged file.
    pub max_rows_per_file: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            settle: TimeDelta::hours(1),
            max_rows_per_file: 4 * format::COMPACTED_ROW_GROUP,
        }
    }
}

/// What compacting one hour did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Compacted {
    pub day: NaiveDate,
    pub hour: i16,
    pub replaced: usize,
    pub written: usize,
    pub rows: i64,
    pub bytes_before: i64,
    pub bytes_after: i64,
    /// `false`: a replaced file was retired by another compaction first.
    pub swapped: bool,
}

/// Compacts every hour whose end is older than `policy.settle` before `now`.
pub async fn compact_due(
    pool: &PgPool,
    store: &crate::store::ArchiveStore,
    now: DateTime<Utc>,
    policy: Policy,
    crash_after_write: bool,
) -> Result<Vec<Compacted>, ArchiveError> {
    let mut out = Vec::new();
    for (day, hour) in manifest::hours_to_compact(pool, now - policy.settle).await? {
        if let Some(c) = compact_hour(pool, store, day, hour, policy, crash_after_write).await? {
            out.push(c);
        }
    }
    Ok(out)
}

/// Merges one hour's live files; `None` when it is one compacted file already.
pub async fn compact_hour(
    pool: &PgPool,
    store: &crate::store::ArchiveStore,
    day: NaiveDate,
    hour: i16,
    policy: Policy,
    crash_after_write: bool,
) -> Result<Option<Compacted>, ArchiveError> {
    let files = manifest::live_hour(pool, day, hour).await?;
    if files.is_empty() || (files.len() == 1 && files[0].level == 1) {
        return Ok(None);
    }
    let contents: Vec<bytes::Bytes> = futures::stream::iter(files.iter())
        .map(|f| store::get(store, &f.path))
        .buffered(4)
        .try_collect()
        .await?;
    let max_rows = policy.max_rows_per_file.max(1);
    let merged = tokio::task::spawn_blocking(move || -> Result<_, ArchiveError> {
        let mut rows: Vec<ArchivedRequest> = Vec::new();
        for bytes in contents {
            rows.extend(format::decode(bytes)?);
        }
        let mut seen = HashSet::with_capacity(rows.len());
        if let Some(twice) = rows.iter().find(|r| !seen.insert(r.event.request_id)) {
            // Never merge what would hide a doubled row: verify reports it.
            return Err(ArchiveError::Row(format!(
                "{} is in two live files of its hour; not compacting",
                twice.event.request_id
            )));
        }
        format::sort_for_scans(&mut rows);
        let name = format!("compacted-{}", Uuid::now_v7());
        let mut out = Vec::new();
        for (i, part) in rows.chunks(max_rows).enumerate() {
            let hours = BTreeMap::from([((day, hour), part.to_vec())]);
            out.extend(encode_files(
                hours,
                &format!("{name}-{i}"),
                Layout::Compacted,
                1,
            )?);
        }
        Ok(out)
    })
    .await
    .map_err(|e| ArchiveError::Parquet(format!("compaction task failed: {e}")))??;
    for (file, bytes) in &merged {
        store::put(store, &file.path, bytes.clone()).await?;
    }
    if crash_after_write {
        tracing::error!("ARCHIVE_TEST_CRASH_AFTER_WRITE: aborting compaction before its swap");
        std::process::abort();
    }
    let listed: Vec<NewFile> = merged.into_iter().map(|(f, _)| f).collect();
    let replaced: Vec<i64> = files.iter().map(|f| f.file_id).collect();
    let swapped = manifest::swap(pool, &replaced, &listed).await?;
    Ok(Some(Compacted {
        day,
        hour,
        replaced: files.len(),
        written: listed.len(),
        rows: listed.iter().map(|f| f.rows).sum(),
        bytes_before: files.iter().map(|f| f.bytes).sum(),
        bytes_after: listed.iter().map(|f| f.bytes).sum(),
        swapped,
    }))
}
