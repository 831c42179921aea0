//! Where archive files are written: an `object_store` store built from
//! `ARCHIVE_URL`. This build supports the local file system (a path, or a
//! `file://` URL); files are written atomically (a temporary file renamed
//! into place) and fsync'd before the manifest commits.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::IngestError;

/// The directory an `ARCHIVE_URL` names, or a configuration error naming it.
pub fn local_root(url: &str) -> Result<PathBuf, IngestError> {
    let bad = |why: &str| IngestError::Config(format!("ARCHIVE_URL {url:?}: {why}"));
    if url.trim().is_empty() {
        return Err(bad("is empty"));
    }
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(bad("a file:// URL needs an absolute path (file:///…)"));
        }
        return Ok(PathBuf::from(path));
    }
    if let Some((scheme, _)) = url.split_once("://") {
        return Err(bad(&format!(
            "scheme {scheme}:// is not supported; use a directory path or file:///…"
        )));
    }
    Ok(PathBuf::from(url))
}

/// Opens (creating its directory) the store `url` names.
pub fn open(url: &str) -> Result<Arc<dyn ObjectStore>, IngestError> {
    let root = local_root(url)?;
    std::fs::create_dir_all(&root).map_err(|e| {
        IngestError::Config(format!(
            "ARCHIVE_URL {url:?}: cannot create {}: {e}",
            root.display()
        ))
    })?;
    let store = LocalFileSystem::new_with_prefix(&root)?
        .with_automatic_cleanup(true)
        .with_fsync(true);
    Ok(Arc::new(store))
}

/// Writes one file, replacing whatever an interrupted batch left under the
/// same name (same name, same offsets: the same rows).
pub async fn put(
    store: &dyn ObjectStore,
    path: &str,
    bytes: bytes::Bytes,
) -> Result<(), IngestError> {
    store
        .put(&Path::from(path), PutPayload::from(bytes))
        .await?;
    Ok(())
}
