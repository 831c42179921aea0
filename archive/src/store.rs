//! Where archive files live: an `object_store` store built from
//! `ARCHIVE_URL`, one code path for every backend.
//!
//! - a directory path or `file:///…`: object_store's `LocalFileSystem`
//!   (a file is written to a temporary name and renamed into place, then
//!   fsync'd with its folder);
//! - `s3://bucket/prefix`: object_store's S3 client, configured from the
//!   usual environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//!   `AWS_REGION`, `AWS_ENDPOINT_URL` for an S3-compatible server,
//!   `AWS_ALLOW_HTTP=true` for plain HTTP), the prefix applied to every path.
//!
//! Files up to [`MULTIPART_THRESHOLD`] go in one PUT (atomic on S3); larger
//! ones (compacted days) in a multipart upload, which S3 also makes visible
//! only whole, at completion. A name is written once (names are unique per
//! batch or compaction), so no write relies on overwriting.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::error::ArchiveError;

/// Files larger than this are uploaded in parts.
pub const MULTIPART_THRESHOLD: usize = 16 * 1024 * 1024;

/// What `ARCHIVE_URL` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    S3 { bucket: String, prefix: String },
}

/// Parses `ARCHIVE_URL` (touches neither disk nor network).
pub fn location(url: &str) -> Result<Location, ArchiveError> {
    let bad = |why: &str| ArchiveError::Config(format!("ARCHIVE_URL {url:?}: {why}"));
    if url.trim().is_empty() {
        return Err(bad("is empty"));
    }
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(bad("a file:// URL needs an absolute path (file:///…)"));
        }
        return Ok(Location::Local(PathBuf::from(path)));
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("names no bucket (s3://bucket/prefix)"));
        }
        return Ok(Location::S3 {
            bucket: bucket.to_owned(),
            prefix: prefix.trim_matches('/').to_owned(),
        });
    }
    if let Some((scheme, _)) = url.split_once("://") {
        return Err(bad(&format!(
            "scheme {scheme}:// is not supported; use a directory, file:///… or s3://bucket/prefix"
        )));
    }
    Ok(Location::Local(PathBuf::from(url)))
}

/// An open archive store: the objects, and for a local directory its root
/// (object_store 0.13's `LocalFileSystem` does not fsync; [`put`] does).
#[derive(Debug, Clone)]
pub struct ArchiveStore {
    pub objects: Arc<dyn ObjectStore>,
    local_root: Option<PathBuf>,
}

/// Opens the store `url` names (creating a local directory).
pub fn open(url: &str) -> Result<ArchiveStore, ArchiveError> {
    match location(url)? {
        Location::Local(root) => {
            std::fs::create_dir_all(&root).map_err(|e| {
                ArchiveError::Config(format!(
                    "ARCHIVE_URL {url:?}: cannot create {}: {e}",
                    root.display()
                ))
            })?;
            let store = LocalFileSystem::new_with_prefix(&root)?.with_automatic_cleanup(true);
            Ok(ArchiveStore {
                objects: Arc::new(store),
                local_root: Some(root),
            })
        }
        Location::S3 { bucket, prefix } => {
            let s3 = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| ArchiveError::Config(format!("ARCHIVE_URL {url:?}: {e}")))?;
            let objects: Arc<dyn ObjectStore> = if prefix.is_empty() {
                Arc::new(s3)
            } else {
                Arc::new(PrefixStore::new(s3, prefix.as_str()))
            };
            Ok(ArchiveStore {
                objects,
                local_root: None,
            })
        }
    }
}

/// Writes one file: a single PUT, or a multipart upload above
/// [`MULTIPART_THRESHOLD`]; on a local directory the file and its folder
/// are fsync'd before this returns (the manifest commits next).
pub async fn put(
    store: &ArchiveStore,
    path: &str,
    bytes: bytes::Bytes,
) -> Result<(), ArchiveError> {
    let location = Path::from(path);
    if bytes.len() <= MULTIPART_THRESHOLD {
        store
            .objects
            .put(&location, PutPayload::from(bytes))
            .await?;
    } else {
        let upload = store.objects.put_multipart(&location).await?;
        let mut write = WriteMultipart::new_with_chunk_size(upload, 8 * 1024 * 1024);
        write.put(bytes);
        write.finish().await?;
    }
    if let Some(root) = &store.local_root {
        let file = root.join(path);
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::File::open(&file)?.sync_all()?;
            if let Some(dir) = file.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(|e| ArchiveError::Config(format!("fsync task failed: {e}")))?
        .map_err(|e| ArchiveError::Config(format!("fsync {path}: {e}")))?;
    }
    Ok(())
}

/// Reads one whole file.
pub async fn get(store: &ArchiveStore, path: &str) -> Result<bytes::Bytes, ArchiveError> {
    Ok(store.objects.get(&Path::from(path)).await?.bytes().await?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;

    #[test]
    fn urls_name_a_directory_or_a_bucket_and_prefix() {
        assert_eq!(
            location(".stack/archive").unwrap(),
            Location::Local(".stack/archive".into())
        );
        assert_eq!(
            location("file:///var/archive").unwrap(),
            Location::Local("/var/archive".into())
        );
        assert_eq!(
            location("s3://usage/archive/v1/").unwrap(),
            Location::S3 {
                bucket: "usage".into(),
                prefix: "archive/v1".into()
            }
        );
        assert!(location("s3:///x").is_err());
        assert!(location("gs://bucket").is_err());
        assert!(location("file://relative").is_err());
    }
}
