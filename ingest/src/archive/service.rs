//! The archiver process: connect, serve metrics, and keep a consumer-group
//! session running until shutdown. A fenced session (zombie) is replaced by
//! a fresh one that rejoins the group.

use std::future::Future;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::sync::mpsc;

use crate::archive::archiver::{ArchiveLimits, Archiver};
use crate::archive::config::ArchiverConfig;
use crate::archive::{store, telemetry};
use crate::batcher::Stopped;
use crate::consumer::{ConsumerSettings, ConsumerThread};
use crate::error::IngestError;
use crate::offsets::ConsumerKey;
use crate::offsets::Ledger;

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
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| IngestError::Metrics(e.to_string()))?;
    telemetry::describe();
    let listener = tokio::net::TcpListener::bind(config.metrics_addr)
        .await
        .map_err(|e| {
            IngestError::Config(format!("ARCHIVE_METRICS_ADDR {}: {e}", config.metrics_addr))
        })?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(prometheus.render())),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });

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
    tokio::pin!(shutdown);
    loop {
        let (feed_tx, feed_rx) = mpsc::channel(16);
        let consumer = ConsumerThread::spawn(
            ConsumerSettings {
                brokers: config.kafka_brokers.clone(),
                key: key.clone(),
                ledger: Ledger::Archive,
                revoke_timeout: Duration::from_secs(60),
                chunk: 1000.min(config.max_batch),
                predecode: false,
            },
            pool.clone(),
            feed_tx,
        )?;
        let archiver = Archiver::new(
            pool.clone(),
            store.clone(),
            key.clone(),
            limits,
            consumer.watermarks.clone(),
        );
        let mut session = tokio::spawn(archiver.run(feed_rx));
        let stopped = tokio::select! {
            stopped = &mut session => stopped,
            () = &mut shutdown => {
                tracing::info!("shutting down: archiving what is held, leaving the group");
                consumer.request_stop();
                let stopped = session.await;
                let _ = tokio::task::spawn_blocking(move || consumer.join()).await;
                tracing::info!(?stopped, "archiver stopped");
                return Ok(());
            }
        };
        let _ = tokio::task::spawn_blocking(move || consumer.join()).await;
        match stopped {
            Ok(Stopped::Fenced(partitions)) => {
                tracing::warn!(?partitions, "fenced out of partitions; rejoining the group");
            }
            Ok(Stopped::Drained) => return Ok(()),
            Err(e) => {
                tracing::error!(error = %e, "archiver task failed; restarting the session");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
