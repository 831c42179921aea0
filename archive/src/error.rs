//! The archive's one error type.

/// What can go wrong reading or writing the archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A setting (e.g. `ARCHIVE_URL`) is not usable; the message names it.
    #[error("{0}")]
    Config(String),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("parquet: {0}")]
    Parquet(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored row or file is not what the archive writes.
    #[error("not an archive row: {0}")]
    Row(String),
}

impl From<parquet::errors::ParquetError> for ArchiveError {
    fn from(e: parquet::errors::ParquetError) -> Self {
        Self::Parquet(e.to_string())
    }
}

impl From<arrow_schema::ArrowError> for ArchiveError {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Self::Parquet(e.to_string())
    }
}
