//! Ingest's errors. Only configuration errors end the process: everything
//! else (Postgres or the broker away) is waited out and retried.

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Schema(#[from] schema::SchemaError),
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("archive: {0}")]
    Archive(#[from] archive::ArchiveError),
}
