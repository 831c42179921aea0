//! What stops an audit (not a difference: a failure to look).

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error("billing: {0}")]
    Billing(#[from] billing_api::BillingError),
    #[error("rating: {0}")]
    Rating(#[from] billing_api::rating::RatingError),
    #[error("archive: {0}")]
    Archive(#[from] archive::ArchiveError),
    #[error("arrow: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    #[error("query engine: {0}")]
    Query(#[from] datafusion::error::DataFusionError),
    #[error(
        "the archive is behind: {0} requests ingested before the last invoice instant are still \
         waiting in archive_queue (is the archiver running?)"
    )]
    ArchiveBehind(i64),
    #[error("{0}")]
    Invalid(String),
}
