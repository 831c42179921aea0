//! The ingest process: connect, serve metrics, and keep a consumer-group
//! session running until shutdown. A fenced session (zombie) is replaced by
//! a fresh one that rejoins the group.

use std::future::Future;
use std::time::Duration;

use crate::batcher::{BatchSettings, Batcher};
use crate::config::IngestConfig;
use crate::consumer::ConsumerSettings;
use crate::error::IngestError;
use crate::offsets::{ConsumerKey, Ledger};
use crate::{session, telemetry};

/// How long start-up waits for Postgres before giving up.
const DATABASE_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Runs ingest until `shutdown` resolves; then commits what it holds and
/// leaves the group.
pub async fn run(
    config: IngestConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), IngestError> {
    config.validate()?;
    session::serve_metrics(config.metrics_addr, "INGEST_METRICS_ADDR").await?;
    telemetry::describe();
    let pool = schema::connect(&config.database_url, 8, DATABASE_WAIT).await?;
    let key = ConsumerKey {
        group: config.group.clone(),
        topic: config.topic.clone(),
    };
    let batch = BatchSettings {
        max_batch: config.max_batch,
        linger: config.linger(),
        writes: crate::store::Writes {
            synchronous_commit: config.synchronous_commit,
            path: config.write_path,
        },
        offset_check: config.offset_check(),
    };
    let settings = ConsumerSettings {
        brokers: config.kafka_brokers.clone(),
        key: key.clone(),
        ledger: Ledger::Ingest,
        revoke_timeout: Duration::from_secs(30),
        chunk: 1000.min(config.max_batch),
        predecode: true,
    };
    session::run(
        "ingest",
        settings,
        pool.clone(),
        shutdown,
        |feed, watermarks| Batcher::new(pool.clone(), key.clone(), batch, watermarks).run(feed),
    )
    .await
}
