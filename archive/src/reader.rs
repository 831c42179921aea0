//! Reading the archive back: one request by id, or every row of a period.
//!
//! A lookup narrows the files to read by the time inside the UUIDv7 id: the
//! manifest's live files of that hour whose id range holds it (one compacted
//! file for a closed hour), then, per row group, its `request_id`
//! statistics and bloom filter; only a row group that may hold the id is
//! read. Readers list the manifest once per read, so a compaction swapping
//! files meanwhile changes nothing they see (retired files outlive readers
//! by gc's grace period).

use chrono::{DateTime, Timelike, Utc};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
#[expect(deprecated, reason = "see find_in_file")]
use parquet::arrow::async_reader::ParquetObjectReader;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::file::statistics::Statistics;
use sqlx::PgPool;
use usage_contract::RequestId;

use crate::error::ArchiveError;
use crate::format::{self, ArchivedRequest};
use crate::manifest::{self, Listed};
use crate::store;

/// The archived row of `id`, if the archive holds it.
pub async fn lookup(
    pool: &PgPool,
    store: &crate::store::ArchiveStore,
    id: RequestId,
) -> Result<Option<ArchivedRequest>, ArchiveError> {
    let t = id.created_at();
    let files = manifest::live_holding(pool, id.as_uuid(), t.date_naive(), t.hour() as i16).await?;
    let wanted = id.to_string();
    for file in files {
        if let Some(found) = find_in_file(store, &file, &wanted).await? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

fn may_hold(stats: Option<&Statistics>, wanted: &str) -> bool {
    match stats {
        Some(Statistics::ByteArray(s)) => match (s.min_opt(), s.max_opt()) {
            (Some(min), Some(max)) => {
                min.data() <= wanted.as_bytes() && wanted.as_bytes() <= max.data()
            }
            _ => true,
        },
        _ => true,
    }
}

async fn find_in_file(
    store: &crate::store::ArchiveStore,
    file: &Listed,
    wanted: &str,
) -> Result<Option<ArchivedRequest>, ArchiveError> {
    #[expect(
        deprecated,
        reason = "the object_store reader parquet 59 ships; its replacement is to write one by hand"
    )]
    let reader = ParquetObjectReader::new(store.objects.clone(), Path::from(file.path.as_str()))
        .with_file_size(file.bytes as u64);
    let mut builder = ParquetRecordBatchStreamBuilder::new(reader).await?;
    let metadata = builder.metadata().clone();
    let column = metadata
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.name() == "request_id")
        .ok_or_else(|| ArchiveError::Parquet(format!("{}: no request_id column", file.path)))?;
    let mut groups = Vec::new();
    for (i, rg) in metadata.row_groups().iter().enumerate() {
        if !may_hold(rg.column(column).statistics(), wanted) {
            continue;
        }
        if let Some(bloom) = builder.get_row_group_column_bloom_filter(i, column).await? {
            if !bloom.check(wanted) {
                continue;
            }
        }
        groups.push(i);
    }
    if groups.is_empty() {
        return Ok(None);
    }
    let mut stream = builder.with_row_groups(groups).build()?;
    while let Some(batch) = stream.try_next().await? {
        let mut rows = Vec::new();
        format::read_batch(&batch, &mut rows)?;
        if let Some(r) = rows
            .into_iter()
            .find(|r| r.event.request_id.to_string() == wanted)
        {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

/// Every archived row whose request started in `[from, to)`, from one
/// listing of the manifest (files of the request-id days around the
/// period: an id is created when its request starts).
pub async fn scan(
    pool: &PgPool,
    store: &crate::store::ArchiveStore,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<ArchivedRequest>, ArchiveError> {
    let first = from.date_naive().pred_opt().unwrap_or(from.date_naive());
    let last = to.date_naive().succ_opt().unwrap_or(to.date_naive());
    let files = manifest::live(pool, first, last).await?;
    let mut out = Vec::new();
    let mut reads = futures::stream::iter(files.iter())
        .map(|f| store::get(store, &f.path))
        .buffered(4);
    while let Some(bytes) = reads.try_next().await? {
        let rows = tokio::task::spawn_blocking(move || format::decode(bytes))
            .await
            .map_err(|e| ArchiveError::Parquet(format!("decoder task failed: {e}")))??;
        out.extend(
            rows.into_iter()
                .filter(|r| r.event.started_at >= from && r.event.started_at < to),
        );
    }
    Ok(out)
}

/// Every row of the given listed files (tests, verify).
pub async fn read_files(
    store: &crate::store::ArchiveStore,
    files: &[Listed],
) -> Result<Vec<(Listed, Vec<ArchivedRequest>)>, ArchiveError> {
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let bytes = store::get(store, &f.path).await?;
        out.push((f.clone(), format::decode(bytes)?));
    }
    Ok(out)
}
