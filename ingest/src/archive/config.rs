//! The archiver's configuration: flags or environment variables, validated
//! at start-up with errors that name the setting.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use crate::error::IngestError;

#[derive(Debug, Clone, Args)]
pub struct ArchiverConfig {
    /// Postgres URL (the manifest and the archive offsets live there).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    pub database_url: String,
    /// Kafka bootstrap servers, comma-separated.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Topic carrying usage events.
    #[arg(long, env = "ARCHIVE_TOPIC", default_value = usage_contract::TOPIC)]
    pub topic: String,
    /// The archiver's own consumer group; its offsets are kept in Postgres
    /// (`archive_offsets`), apart from ingest's.
    #[arg(long, env = "ARCHIVE_GROUP", default_value = "meterline-archiver")]
    pub group: String,
    /// Where the Parquet files go: a directory path or a `file://` URL.
    #[arg(long, env = "ARCHIVE_URL", default_value = ".stack/archive")]
    pub url: String,
    /// Write a batch at this many messages.
    #[arg(long, env = "ARCHIVE_MAX_BATCH", default_value_t = 100_000)]
    pub max_batch: usize,
    /// Write a batch at this many bytes of message payload.
    #[arg(long, env = "ARCHIVE_MAX_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_bytes: usize,
    /// Write a batch when its first message has waited this many milliseconds.
    #[arg(long, env = "ARCHIVE_LINGER_MS", default_value_t = 60_000)]
    pub linger_ms: u64,
    /// Where `/metrics` is served.
    #[arg(long, env = "ARCHIVE_METRICS_ADDR", default_value = "127.0.0.1:9102")]
    pub metrics_addr: SocketAddr,
    /// Fault tests only: abort the process right after writing the files
    /// of the Nth batch it writes, before its manifest commits (0: never).
    #[arg(
        long,
        env = "ARCHIVE_TEST_CRASH_AFTER_WRITE",
        default_value_t = 0,
        hide = true
    )]
    pub crash_after_write: u64,
}

impl ArchiverConfig {
    pub fn validate(&self) -> Result<(), IngestError> {
        if !(1..=1_000_000).contains(&self.max_batch) {
            return Err(IngestError::Config(format!(
                "ARCHIVE_MAX_BATCH must be between 1 and 1000000, got {}",
                self.max_batch
            )));
        }
        if !(1024..=1 << 30).contains(&self.max_bytes) {
            return Err(IngestError::Config(format!(
                "ARCHIVE_MAX_BYTES must be between 1024 and 1073741824, got {}",
                self.max_bytes
            )));
        }
        if !(1..=3_600_000).contains(&self.linger_ms) {
            return Err(IngestError::Config(format!(
                "ARCHIVE_LINGER_MS must be between 1 and 3600000, got {}",
                self.linger_ms
            )));
        }
        if self.kafka_brokers.trim().is_empty() {
            return Err(IngestError::Config("KAFKA_BROKERS is empty".into()));
        }
        if self.topic.trim().is_empty() {
            return Err(IngestError::Config("ARCHIVE_TOPIC is empty".into()));
        }
        if self.group.trim().is_empty() {
            return Err(IngestError::Config("ARCHIVE_GROUP is empty".into()));
        }
        // A topic name ends up in file names: keep it to Kafka's own alphabet.
        if !self
            .topic
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(IngestError::Config(format!(
                "ARCHIVE_TOPIC {:?} holds characters Kafka topic names cannot",
                self.topic
            )));
        }
        crate::archive::store::local_root(&self.url)?;
        schema::parse_url(&self.database_url)?;
        Ok(())
    }

    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms)
    }
}
