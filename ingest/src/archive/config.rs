//! The archiver's configuration: flags or environment variables, validated
//! at start-up with errors that name the setting.

use std::net::SocketAddr;
use std::time::Duration;

use chrono::TimeDelta;
use clap::Args;

use crate::error::IngestError;

#[derive(Debug, Clone, Args)]
pub struct ArchiverConfig {
    /// Postgres URL (request_log, the archive queue and the manifest).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    pub database_url: String,
    /// Where the Parquet files go: a directory, `file:///…`, or
    /// `s3://bucket/prefix` (credentials, region and endpoint from the
    /// usual `AWS_*` variables).
    #[arg(long, env = "ARCHIVE_URL", default_value = ".stack/archive")]
    pub url: String,
    /// At most this many queued rows per batch.
    #[arg(long, env = "ARCHIVE_MAX_BATCH", default_value_t = 100_000)]
    pub max_batch: usize,
    /// After a batch that did not fill (or an empty queue), wait this many
    /// milliseconds before reading the queue again.
    #[arg(long, env = "ARCHIVE_LINGER_MS", default_value_t = 10_000)]
    pub linger_ms: u64,
    /// Compact closed hours and collect garbage every this many seconds (0: never).
    #[arg(long, env = "ARCHIVE_COMPACT_EVERY_SECS", default_value_t = 300)]
    pub compact_every_secs: u64,
    /// An hour (of request-id time) is compacted once its end is this many
    /// seconds old.
    #[arg(long, env = "ARCHIVE_COMPACT_SETTLE_SECS", default_value_t = 3600)]
    pub compact_settle_secs: u64,
    /// Retired files and orphans are deleted this many seconds after they
    /// stopped being needed (longer than any reader's read).
    #[arg(long, env = "ARCHIVE_GC_GRACE_SECS", default_value_t = 86_400)]
    pub gc_grace_secs: u64,
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
    /// Fault tests only: abort right after writing the merged files of the
    /// Nth compaction, before its swap (0: never).
    #[arg(
        long,
        env = "ARCHIVE_TEST_CRASH_IN_COMPACTION",
        default_value_t = 0,
        hide = true
    )]
    pub crash_in_compaction: u64,
    /// The archiver follows `archive_queue` in Postgres, filled by ingest
    /// in the transaction that stores each request; it reads no topic.
    #[arg(long = "topic", env = "ARCHIVE_TOPIC", hide = true, help_heading = serving::retired::HEADING)]
    pub retired_topic: Option<String>,
    /// The archiver follows `archive_queue` in Postgres and joins no
    /// consumer group.
    #[arg(long = "group", env = "ARCHIVE_GROUP", hide = true, help_heading = serving::retired::HEADING)]
    pub retired_group: Option<String>,
    /// A batch is bounded by `ARCHIVE_MAX_BATCH` queued rows alone.
    #[arg(long = "max-bytes", env = "ARCHIVE_MAX_BYTES", hide = true, help_heading = serving::retired::HEADING)]
    pub retired_max_bytes: Option<String>,
}

impl ArchiverConfig {
    pub fn validate(&self) -> Result<(), IngestError> {
        if !(1..=1_000_000).contains(&self.max_batch) {
            return Err(IngestError::Config(format!(
                "ARCHIVE_MAX_BATCH must be between 1 and 1000000, got {}",
                self.max_batch
            )));
        }
        if !(1..=3_600_000).contains(&self.linger_ms) {
            return Err(IngestError::Config(format!(
                "ARCHIVE_LINGER_MS must be between 1 and 3600000, got {}",
                self.linger_ms
            )));
        }
        if self.compact_settle_secs > 30 * 86_400 {
            return Err(IngestError::Config(format!(
                "ARCHIVE_COMPACT_SETTLE_SECS must be at most 2592000, got {}",
                self.compact_settle_secs
            )));
        }
        if self.gc_grace_secs > 365 * 86_400 {
            return Err(IngestError::Config(format!(
                "ARCHIVE_GC_GRACE_SECS must be at most 31536000, got {}",
                self.gc_grace_secs
            )));
        }
        archive::store::location(&self.url).map_err(|e| IngestError::Config(e.to_string()))?;
        schema::parse_url(&self.database_url)?;
        Ok(())
    }

    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms)
    }

    pub fn grace(&self) -> TimeDelta {
        TimeDelta::seconds(self.gc_grace_secs as i64)
    }

    pub fn policy(&self) -> archive::compact::Policy {
        archive::compact::Policy {
            settle: TimeDelta::seconds(self.compact_settle_secs as i64),
            ..archive::compact::Policy::default()
        }
    }
}
