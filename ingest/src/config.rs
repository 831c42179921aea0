//! Ingest's configuration: flags or environment variables, validated at
//! start-up with errors that name the setting.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use crate::error::IngestError;

#[derive(Debug, Clone, Args)]
pub struct IngestConfig {
    /// Postgres URL.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    pub database_url: String,
    /// Kafka bootstrap servers, comma-separated.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// The usage topic ingest reads (its dead letters are filed under it).
    #[arg(long, env = "INGEST_TOPIC", default_value = usage_contract::TOPIC)]
    pub topic: String,
    /// Consumer group; its offsets are kept in Postgres.
    #[arg(long, env = "INGEST_GROUP", default_value = "meterline-ingest")]
    pub group: String,
    /// Flush a batch at this many messages.
    #[arg(long, env = "INGEST_MAX_BATCH", default_value_t = 5000)]
    pub max_batch: usize,
    /// Flush a batch when its first message has waited this many milliseconds.
    #[arg(long, env = "INGEST_LINGER_MS", default_value_t = 200)]
    pub linger_ms: u64,
    /// `on`: each batch's commit waits for its WAL flush; `off`: it does
    /// not, and a Postgres crash's lost commits are found by the offsets
    /// check and consumed again (see docs/architecture.md, the exactly-once argument).
    #[arg(
        long,
        env = "INGEST_SYNCHRONOUS_COMMIT",
        value_name = "INGEST_SYNCHRONOUS_COMMIT",
        value_enum,
        default_value = "on"
    )]
    pub synchronous_commit: crate::store::SynchronousCommit,
    /// `rows`: the request rows as one composite array and one statement
    /// for the hourly rollups; `unnest`: the earlier statements, kept to
    /// measure against (`scripts/bench-ingest.sh --path`). Both write the
    /// same rows and sums.
    #[arg(
        long,
        env = "INGEST_WRITE_PATH",
        value_name = "INGEST_WRITE_PATH",
        value_enum,
        default_value = "rows"
    )]
    pub write_path: crate::store::WritePath,
    /// How often, in milliseconds, the offsets stored in Postgres are
    /// compared with the positions ingest holds (also while idle); a
    /// difference makes ingest rejoin and start again from what is stored.
    #[arg(long, env = "INGEST_OFFSET_CHECK_MS", default_value_t = 1000)]
    pub offset_check_ms: u64,
    /// Where `/metrics` is served.
    #[arg(long, env = "INGEST_METRICS_ADDR", default_value = "127.0.0.1:9101")]
    pub metrics_addr: SocketAddr,
}

impl IngestConfig {
    pub fn validate(&self) -> Result<(), IngestError> {
        if !(1..=100_000).contains(&self.max_batch) {
            return Err(IngestError::Config(format!(
                "INGEST_MAX_BATCH must be between 1 and 100000, got {}",
                self.max_batch
            )));
        }
        if !(1..=60_000).contains(&self.linger_ms) {
            return Err(IngestError::Config(format!(
                "INGEST_LINGER_MS must be between 1 and 60000, got {}",
                self.linger_ms
            )));
        }
        if !(100..=600_000).contains(&self.offset_check_ms) {
            return Err(IngestError::Config(format!(
                "INGEST_OFFSET_CHECK_MS must be between 100 and 600000, got {}",
                self.offset_check_ms
            )));
        }
        if self.kafka_brokers.trim().is_empty() {
            return Err(IngestError::Config("KAFKA_BROKERS is empty".into()));
        }
        if self.topic.trim().is_empty() || self.group.trim().is_empty() {
            return Err(IngestError::Config(
                "INGEST_TOPIC and INGEST_GROUP must not be empty".into(),
            ));
        }
        schema::parse_url(&self.database_url)?;
        Ok(())
    }

    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms)
    }

    pub fn offset_check(&self) -> Duration {
        Duration::from_millis(self.offset_check_ms)
    }
}
