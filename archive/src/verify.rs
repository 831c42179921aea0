//! Checking the archive, and collecting what it no longer needs.
//!
//! `verify` checks every live file against its manifest row (present, size,
//! SHA-256, row count, every row in the file's hour and id range), that no
//! request id is in two live files, and, for every day request_log still
//! holds, that the day's archived ids plus its queued ids are exactly
//! request_log's ids (nothing lost, nothing extra). Files in the store that
//! no manifest row lists are orphans (a batch or compaction that crashed or
//! lost before its commit); they are never read.
//!
//! `gc` deletes, once `grace` has passed since they stopped being needed,
//! retired files (replaced by compaction; a reader that listed the manifest
//! before the swap may still be reading them) and orphans (by their
//! last-modified time: a batch's files are written moments before its
//! commit, so an orphan younger than the grace may still be about to be
//! listed).

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, NaiveDate, TimeDelta, Timelike, Utc};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::ArchiveError;
use crate::format;
use crate::manifest;
use crate::store;

/// What `verify` found.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub live_files: u64,
    pub retired_files: u64,
    pub rows: i64,
    pub bytes: i64,
    pub queued: i64,
    /// Days compared id for id with request_log.
    pub days_checked: Vec<NaiveDate>,
    /// Anything here is a failure.
    pub problems: Vec<String>,
    /// Files no manifest row lists, with their last-modified time.
    pub orphans: Vec<(String, DateTime<Utc>)>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// The dates of request_log's day partitions.
async fn request_log_days(pool: &PgPool) -> Result<Vec<NaiveDate>, ArchiveError> {
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

/// Checks the archive in `store` against its manifest and request_log.
pub async fn verify(
    pool: &PgPool,
    store: &crate::store::ArchiveStore,
) -> Result<Report, ArchiveError> {
    let listed = manifest::all(pool).await?;
    let mut report = Report::default();
    let mut by_day: BTreeMap<NaiveDate, HashSet<Uuid>> = BTreeMap::new();
    let mut known: HashSet<&str> = HashSet::new();
    for f in &listed {
        known.insert(f.path.as_str());
        if f.retired_at.is_some() {
            report.retired_files += 1;
            continue;
        }
        report.live_files += 1;
        report.rows += f.rows;
        report.bytes += f.bytes;
        let bytes = match store::get(store, &f.path).await {
            Ok(b) => b,
            Err(ArchiveError::Store(object_store::Error::NotFound { .. })) => {
                report
                    .problems
                    .push(format!("{}: listed but missing", f.path));
                continue;
            }
            Err(e) => return Err(e),
        };
        let sha: [u8; 32] = Sha256::digest(&bytes).into();
        if bytes.len() as i64 != f.bytes || f.sha256.as_slice() != sha.as_slice() {
            report.problems.push(format!(
                "{}: {} bytes stored, {} in the manifest, or its SHA-256 differs",
                f.path,
                bytes.len(),
                f.bytes
            ));
            continue;
        }
        let rows = match format::decode(bytes) {
            Ok(rows) => rows,
            Err(e) => {
                report.problems.push(format!("{}: {e}", f.path));
                continue;
            }
        };
        if rows.len() as i64 != f.rows {
            report.problems.push(format!(
                "{}: {} rows, {} in the manifest",
                f.path,
                rows.len(),
                f.rows
            ));
        }
        let ids = by_day.entry(f.day).or_default();
        for r in &rows {
            let id = r.event.request_id;
            let t = id.created_at();
            if t.date_naive() != f.day
                || t.hour() as i16 != f.hour
                || id.as_uuid() < f.min_request_id
                || id.as_uuid() > f.max_request_id
            {
                report.problems.push(format!(
                    "{}: {id} outside the file's hour or id range",
                    f.path
                ));
            }
            if !ids.insert(id.as_uuid()) {
                report.problems.push(format!("{id} is in two live files"));
            }
        }
    }
    report.queued = manifest::queued(pool).await?;
    for day in request_log_days(pool).await? {
        let logged: Vec<(Uuid,)> = sqlx::query_as(
            "SELECT r.request_id FROM request_log r
             WHERE r.request_id >= request_log_bound($1) AND r.request_id < request_log_bound($1 + 1)
               AND NOT EXISTS (SELECT 1 FROM archive_queue q WHERE q.request_id = r.request_id)",
        )
        .bind(day)
        .fetch_all(pool)
        .await?;
        let logged: HashSet<Uuid> = logged.into_iter().map(|(id,)| id).collect();
        let archived = by_day.get(&day).cloned().unwrap_or_default();
        let missing = logged.difference(&archived).count();
        let extra = archived.difference(&logged).count();
        if missing > 0 || extra > 0 {
            report.problems.push(format!(
                "{day}: {missing} request_log rows neither queued nor archived, \
                 {extra} archived rows not in request_log"
            ));
        }
        report.days_checked.push(day);
    }
    let mut objects = store.objects.list(None);
    while let Some(meta) = objects.try_next().await? {
        let path = meta.location.to_string();
        if path.ends_with(".parquet") && !known.contains(path.as_str()) {
            report.orphans.push((path, meta.last_modified));
        }
    }
    report.orphans.sort();
    Ok(report)
}

/// What `gc` deleted.
#[derive(Debug, Default, serde::Serialize)]
pub struct Collected {
    pub retired: Vec<String>,
    pub orphans: Vec<String>,
}

/// Deletes retired files and orphans older than `grace` before `now`.
pub async fn gc(
    pool: &PgPool,
    store: &crate::store::ArchiveStore,
    grace: TimeDelta,
    now: DateTime<Utc>,
) -> Result<Collected, ArchiveError> {
    let cutoff = now - grace;
    let mut out = Collected::default();
    let retired = manifest::retired_before(pool, cutoff).await?;
    for f in &retired {
        match store.objects.delete(&Path::from(f.path.as_str())).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        out.retired.push(f.path.clone());
    }
    let ids: Vec<i64> = retired.iter().map(|f| f.file_id).collect();
    manifest::forget_retired(pool, &ids).await?;
    // Listed after the retired rows are gone: only true orphans remain.
    let known: HashSet<String> = manifest::all(pool)
        .await?
        .into_iter()
        .map(|f| f.path)
        .collect();
    let mut objects = store.objects.list(None);
    let mut orphans = Vec::new();
    while let Some(meta) = objects.try_next().await? {
        let path = meta.location.to_string();
        if path.ends_with(".parquet") && !known.contains(&path) && meta.last_modified < cutoff {
            orphans.push(meta.location);
        }
    }
    drop(objects);
    for location in orphans {
        store.objects.delete(&location).await?;
        out.orphans.push(location.to_string());
    }
    Ok(out)
}
