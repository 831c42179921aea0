//! The archiver process: connect, serve metrics, and keep a consumer-group
//! session running until shutdown. A fenced session (zombie) is replaced by
//! a fresh one that rejoins the group.

use std::future::Future;
use std::time::Duration;

use crate::archive::archiver::{ArchiveLimits, Archiver};
use crate::archive::config::ArchiverConfig;
use crate::archive::{store, telemetry};
use crate::consumer::ConsumerSettings;
use crate::error::IngestError;
use crate::offsets::{ConsumerKey, Ledger};
use crate::session;

/// How long start-up waits for Postgres before giving up.
const DATABASE_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Runs the archiver until `shutdown` resolves; then archives what it holds
/// and leaves the group.
pub async fn run(
    config: ArchiverConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), IngestError> {
    config.validate()?;
    let store = store::open(&config.url)?;
    session::serve_metrics(config.metrics_addr, "ARCHIVE_METRICS_ADDR").await?;
    telemetry::describe();
    let pool = schema::connect(&config.database_url, 4, DATABASE_WAIT).await?;
    let key = ConsumerKey {
        group: config.group.clone(),
        topic: config.topic.clone(),
    };
    let limits = ArchiveLimits {
        max_batch: config.max_batch,
        max_bytes: config.max_bytes,
        linger: config.linger(),
        crash_after_write: config.crash_after_write,
    };
    tracing::info!(url = %config.url, group = %key.group, topic = %key.topic, "archiver starting");
    let settings = ConsumerSettings {
        brokers: config.kafka_brokers.clone(),
        key: key.clone(),
        ledger: Ledger::Archive,
        revoke_timeout: Duration::from_secs(60),
        chunk: 1000.min(config.max_batch),
        predecode: false,
    };
    session::run(
        "archiver",
        settings,
        pool.clone(),
        shutdown,
        |feed, watermarks| {
            Archiver::new(pool.clone(), store.clone(), key.clone(), limits, watermarks).run(feed)
        },
    )
    .await
}
