//! Checking the archive against its manifest, and collecting orphans.
//!
//! The manifest is the archive: readers list it, never the store. `verify`
//! checks, per partition, that the manifest's offset ranges chain with no
//! gap or overlap up to the stored archive offset, and that every listed
//! file exists with the size and SHA-256 recorded. Files in the store that
//! no manifest row lists are orphans: written by a batch whose commit never
//! happened (a crash, or a zombie whose compare-and-set failed). They are
//! never read. `gc` deletes an orphan only once the stored archive offset
//! has passed its whole range: from then on no commit can list it (commits
//! only cover offsets at or after the stored one), whereas a younger one may
//! belong to a batch that is about to commit.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::archive::manifest;
use crate::error::IngestError;
use crate::offsets::ConsumerKey;

/// What `verify` found.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub files: u64,
    pub rows: i64,
    pub skipped: i64,
    pub bytes: i64,
    /// Per partition: the next offset to archive, as stored.
    pub next_offsets: BTreeMap<i32, i64>,
    /// Gaps, overlaps, missing or altered files: anything here is a failure.
    pub problems: Vec<String>,
    /// Files no manifest row lists, with their last-modified time.
    pub orphans: Vec<(String, DateTime<Utc>)>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the manifest of `key` against `store`.
pub async fn verify(
    pool: &PgPool,
    store: &dyn ObjectStore,
    key: &ConsumerKey,
) -> Result<Report, IngestError> {
    // Offsets before the manifest: a range below a stored offset read here
    // was committed before, so the manifest read next lists it.
    let stored: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT kafka_partition, next_offset FROM archive_offsets
         WHERE consumer_group = $1 AND topic = $2",
    )
    .bind(&key.group)
    .bind(&key.topic)
    .fetch_all(pool)
    .await?;
    let rows = manifest::list(pool, key).await?;
    let mut report = Report {
        next_offsets: stored.into_iter().collect(),
        ..Report::default()
    };
    // Per partition, the last range seen: files of one batch share a range.
    let mut range: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
    let mut listed = HashSet::new();
    for r in &rows {
        match range.get(&r.kafka_partition) {
            Some(&(first, last)) if r.first_offset == first && r.last_offset != last => {
                report.problems.push(format!(
                    "partition {}: ranges {first}..={last} and {}..={} overlap",
                    r.kafka_partition, r.first_offset, r.last_offset
                ));
            }
            Some(&(first, _)) if r.first_offset == first => {}
            Some(&(_, last)) if r.first_offset != last + 1 => {
                report.problems.push(format!(
                    "partition {}: range {}..={} does not follow {last}",
                    r.kafka_partition, r.first_offset, r.last_offset
                ));
            }
            _ => {}
        }
        range.insert(r.kafka_partition, (r.first_offset, r.last_offset));
        report.rows += r.rows;
        report.skipped += r.skipped;
        report.bytes += r.bytes;
        let Some(path) = &r.path else { continue };
        report.files += 1;
        listed.insert(path.clone());
        match store.get(&Path::from(path.as_str())).await {
            Ok(got) => {
                let bytes = got.bytes().await?;
                let sha: [u8; 32] = Sha256::digest(&bytes).into();
                if bytes.len() as i64 != r.bytes || r.sha256.as_deref() != Some(&sha[..]) {
                    report.problems.push(format!(
                        "{path}: {} bytes on disk, {} in the manifest, or its SHA-256 differs",
                        bytes.len(),
                        r.bytes
                    ));
                }
            }
            Err(object_store::Error::NotFound { .. }) => {
                report.problems.push(format!("{path}: listed but missing"));
            }
            Err(e) => return Err(e.into()),
        }
    }
    for (p, (_, last)) in &range {
        match report.next_offsets.get(p) {
            Some(next) if *next == last + 1 => {}
            other => report.problems.push(format!(
                "partition {p}: manifest ends at {last}, stored archive offset is {other:?}"
            )),
        }
    }
    let prefix = format!("{}-p", key.topic);
    let mut objects = store.list(None);
    while let Some(meta) = objects.try_next().await? {
        let path = meta.location.to_string();
        let ours = meta
            .location
            .filename()
            .is_some_and(|f| f.starts_with(&prefix) && f.ends_with(".parquet"));
        if ours && !listed.contains(&path) {
            report.orphans.push((path, meta.last_modified));
        }
    }
    report.orphans.sort();
    Ok(report)
}

/// The partition and offset range an archive file name carries
/// (`<topic>-p<partition>-o<first>-<last>.parquet`).
pub fn parse_name(topic: &str, file_name: &str) -> Option<(i32, i64, i64)> {
    let rest = file_name.strip_prefix(topic)?.strip_prefix("-p")?;
    let rest = rest.strip_suffix(".parquet")?;
    let (partition, range) = rest.split_once("-o")?;
    let (first, last) = range.split_once('-')?;
    Some((
        partition.parse().ok()?,
        first.parse().ok()?,
        last.parse().ok()?,
    ))
}

/// Deletes the orphans whose range lies wholly below the stored archive
/// offset of their partition; returns their paths.
pub async fn gc(
    pool: &PgPool,
    store: &dyn ObjectStore,
    key: &ConsumerKey,
) -> Result<Vec<String>, IngestError> {
    let report = verify(pool, store, key).await?;
    let mut deleted = Vec::new();
    for (path, _) in report.orphans {
        let name = path.rsplit('/').next().unwrap_or_default();
        let Some((partition, _, last)) = parse_name(&key.topic, name) else {
            continue;
        };
        if report
            .next_offsets
            .get(&partition)
            .is_some_and(|next| last < *next)
        {
            store.delete(&Path::from(path.as_str())).await?;
            deleted.push(path);
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_carry_partition_and_range() {
        assert_eq!(
            parse_name("usage.events.v1", "usage.events.v1-p2-o1000-1999.parquet"),
            Some((2, 1000, 1999))
        );
        assert_eq!(parse_name("usage.events.v1", "other-p2-o1-2.parquet"), None);
        assert_eq!(parse_name("t", "t-p2-o1-x.parquet"), None);
    }
}
